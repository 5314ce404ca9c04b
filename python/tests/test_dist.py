"""push.dist from Python: a PusH program over two ranks gives what it gives in one process."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

import push.dist

PROGRAM = pathlib.Path(__file__).with_name("dist_program.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(tmp_path, ranks):
    out = tmp_path / f"ranks{ranks}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    if ranks == 1:
        done = subprocess.run([sys.executable, str(PROGRAM), str(out)], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    else:
        env.update(WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        procs = [subprocess.Popen([sys.executable, str(PROGRAM), str(out)], env=dict(env, RANK=str(r),
                                  LOCAL_RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(ranks)]
        for r, p in enumerate(procs):
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, f"rank {r}:\n{stdout}\n{stderr}"
    return json.loads(out.read_text())


def test_two_ranks_give_the_numbers_of_one_process(tmp_path):
    one, two = run(tmp_path, 1), run(tmp_path, 2)
    assert one["world_size"] == 1 and two["world_size"] == 2
    # Global lane pid % 2, and the last particle where p_create(rank=) put it.
    assert one["ranks"] == [0, 0, 0, 0, 0] and two["ranks"] == [0, 1, 0, 1, 1]
    # The same seeds, the same training: the same numbers, wherever the particles live.
    assert two["losses"] == one["losses"] and two["params"] == one["params"]
    assert one["ring"] == two["ring"] == [0, 1, 2, 3, 4, 0, 1]  # across ranks at most hops
    # A view of particle 1 (on rank 1 in the job): its parameters, also as a module.
    assert two["peek"][0] == two["params"][1] and two["peek"][1] == two["params"][1]
    assert one["peek"] == two["peek"]
    # A handler's exception on rank 1 reaches rank 0's wait, naming the particle.
    assert "particle 1, message 'FAIL': on rank 1" in two["fail"] and "ValueError: particle 1 refuses" in two["fail"]
    # A Python object stays in its process: sent to another rank it is refused by name.
    assert one["object"] is None
    assert "cannot send a value of type PyObject" in two["object"], two["object"]


def test_a_world_without_a_launcher_needs_rank_and_size(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="give rank= and world_size="):
        push.dist.World()
    with pytest.raises(ValueError, match="rank"):
        push.dist.World(rank=2, world_size=2)
    with pytest.raises(ValueError, match="init_timeout must be a positive number"):
        push.dist.World(rank=0, world_size=1, init_timeout=0)
