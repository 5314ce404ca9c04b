"""push.dist from Python: a PusH program over two ranks gives what it gives in one process."""
import json
import os
import pathlib
import re
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


def start_ranks(argv, ranks, env):
    """``ranks`` processes of ``argv`` as one job on this host; each one's (rc, stdout,
    stderr). Every process is killed if the job does not end in time."""
    env = dict(env, WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    try:
        results = []
        for p in procs:
            out, err = p.communicate(timeout=300)
            results.append((p.returncode, out, err))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run(tmp_path, ranks):
    out = tmp_path / f"ranks{ranks}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    if ranks == 1:
        done = subprocess.run([sys.executable, str(PROGRAM), str(out)], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    else:
        for r, (rc, stdout, stderr) in enumerate(start_ranks([sys.executable, str(PROGRAM), str(out)], ranks, env)):
            assert rc == 0, f"rank {r}:\n{stdout}\n{stderr}"
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


def test_ranks_that_made_different_particles_fail_the_barrier(tmp_path):
    script = tmp_path / "skew.py"
    script.write_text(
        "import os, torch, push, push.dist\n"
        "with push.PusH(torch.nn.Linear, 2, 1, world=push.dist.World()) as d:\n"
        "    for _ in range(2 + int(os.environ['RANK'])):\n"
        "        d.p_create(None)\n"
        "    try:\n"
        "        d.barrier()\n"
        "    except Exception as e:\n"
        "        print('refused:', e)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for r, (rc, stdout, stderr) in enumerate(start_ranks([sys.executable, str(script)], 2, env)):
        # Each rank names the other's count against its own: 2 particles against 3.
        assert re.search(r"rank [01] \(worker[01]\) called barrier with [23] particles where rank [01] "
                         r"\(worker[01]\) called barrier with [23] particles", stdout), f"rank {r}:\n{stdout}\n{stderr}"


def test_a_world_without_a_launcher_needs_rank_and_size(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="no launcher set RANK and WORLD_SIZE.*give rank= and world_size="):
        push.dist.World()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="no launcher set RANK \\("):
        push.dist.World()
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="rank"):
        push.dist.World(rank=2, world_size=2)
    for bad in (0, 1e-4, float("inf")):
        with pytest.raises(ValueError, match="init_timeout must be a number of seconds from 0.001 to 1e7"):
            push.dist.World(rank=0, world_size=1, init_timeout=bad)
    monkeypatch.setenv("MASTER_PORT", "abc")
    with pytest.raises(ValueError, match="MASTER_PORT must be a port number, got 'abc'"):
        push.dist.World(rank=0, world_size=1)
