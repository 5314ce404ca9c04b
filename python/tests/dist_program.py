"""A PusH program spread over the ranks of a job (test_dist.py runs it in one process and in
two): trains particles, passes a message around a ring that crosses ranks, reads a view of
a particle on another rank, and records what fails. Writes rank 0's findings as JSON."""
import json
import os
import sys

import torch

import push
import push.dist


class Net(torch.nn.Module):  # not a Sequential: Python code on every rank
    def __init__(self, width):
        super().__init__()
        self.a = torch.nn.Linear(2, width)
        self.b = torch.nn.Linear(width, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def train(p, x, y, steps):
    for _ in range(steps):
        loss = p.step(torch.nn.functional.mse_loss, x, y).wait()
    return loss.item()


def ring(p, hops):
    if hops == 0:
        return [p.pid]
    nxt = (p.pid + 1) % len(p.particle_ids())
    return [p.pid] + p.send(nxt, "RING", hops - 1).wait()


def peek(p, other):
    view = p.get(other).wait()
    return [t.tolist() for t in view.parameters()], [t.tolist() for t in view.view().parameters()]


def fail(p):
    raise ValueError(f"particle {p.pid} refuses")


def send_object(p, other):
    return p.send(other, "ECHO", object()).wait()


def main(out):
    world = push.dist.World() if "WORLD_SIZE" in os.environ else None
    handlers = {"TRAIN": train, "RING": ring, "PEEK": peek, "FAIL": fail, "OBJECT": send_object,
                "ECHO": lambda p, *a: a}
    with push.PusH(Net, 8, world=world, seed=3) as dist:
        pids = [dist.p_create(lambda ps: torch.optim.SGD(ps, lr=0.1), receive=handlers) for _ in range(4)]
        dist.p_create(None, receive=handlers, rank=dist.world_size - 1)  # on the last rank, by request
        found = {"ranks": [dist.rank_of(pid) for pid in dist.particle_ids()], "world_size": dist.world_size}
        if dist.rank == 0:
            g = torch.Generator().manual_seed(0)
            x = torch.randn(64, 2, generator=g)
            y = x.sum(1, keepdim=True).sin()
            futures = [dist.p_launch(pid, "TRAIN", x, y, 25) for pid in pids]
            found["losses"] = list(dist.p_wait(futures).values())
            found["ring"] = dist.p_launch(0, "RING", 6).wait()
            found["peek"] = dist.p_launch(0, "PEEK", 1).wait()
            found["params"] = [[t.tolist() for t in dist.p_parameters(pid)] for pid in pids]
            for name, call in (("fail", lambda: dist.p_launch(1, "FAIL").wait()),
                               ("object", lambda: dist.p_launch(0, "OBJECT", 1).wait())):
                try:
                    call()
                    found[name] = None
                except Exception as e:  # noqa: BLE001 (recorded for the test to check)
                    found[name] = f"{type(e).__name__}: {e}"
            with open(out, "w") as f:
                json.dump(found, f)
        if world is not None:
            world.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
