"""Compute inside a Python handler against the same compute on the main thread and on a
plain Python thread, in one run (docs/python.md, "How Python handlers run").

One loop: 16 MLPs 1-64-64-1 with Adam(0.01), 20 epochs over a shuffled DataLoader of 1,024
points in batches of 128, every network stepping on each batch. It runs on the main thread,
on a threading.Thread, and in a handler of a one-lane push.PusH (whose lane takes torch's
count), after torch.set_num_threads(threads) in the main thread; and in a handler of a lane
at every core's thread (what every handler thread ran with before it took its lane's count).
Each row is the median of --rounds.

    PYTHONPATH=build/python/package python3 bench/python/handler_compute.py [--threads 1] [--rounds 3]
"""
import argparse
import statistics
import subprocess
import sys
import threading
import time

import torch
from torch import nn

import push


def loop(_particle=None) -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1024, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    nets = [nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
            for _ in range(16)]
    optims = [torch.optim.Adam(n.parameters(), lr=0.01) for n in nets]
    start = time.perf_counter()
    for _ in range(20):
        for xb, yb in loader:
            for net, opt in zip(nets, optims):
                opt.zero_grad()
                nn.functional.mse_loss(net(xb), yb).backward()
                opt.step()
    return time.perf_counter() - start


def on_thread() -> float:
    out = []
    t = threading.Thread(target=lambda: out.append(loop()))
    t.start()
    t.join()
    return out[0]


def in_handler(intra_op_threads=None) -> float:
    with push.PusH(lambda: nn.Linear(1, 1), devices=1, device_type="cpu", intra_op_threads=intra_op_threads) as d:
        pid = d.p_create(None, receive={"LOOP": loop})
        return d.p_launch(pid, "LOOP").wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lane-threads", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.lane_threads:
        print(in_handler(args.lane_threads))
        return
    cores = push._push.usable_cores()
    rows = {"main thread": [], "plain thread": [], "handler": [], f"handler, lane at {cores} threads": []}
    for _ in range(args.rounds):
        rows["main thread"].append(loop())
        rows["plain thread"].append(on_thread())
        rows["handler"].append(in_handler())
        # In a process of its own: the lane's count sets OpenBLAS's process-wide pool, which
        # would slow the other rows' later rounds.
        done = subprocess.run([sys.executable, __file__, "--lane-threads", str(cores), "--threads", str(args.threads)],
                              capture_output=True, text=True, check=True, timeout=600)
        rows[f"handler, lane at {cores} threads"].append(float(done.stdout.strip().splitlines()[-1]))
    print(f"torch {torch.__version__}, torch.set_num_threads({args.threads}), {args.rounds} rounds (s):")
    for name, v in rows.items():
        print(f"  {name:26s} median {statistics.median(v):.3f}   ({', '.join(f'{t:.3f}' for t in v)})")
    ratio = statistics.median(h / m for h, m in zip(rows["handler"], rows["main thread"]))
    print(f"  handler / main thread (median of per-round ratios) {ratio:.2f}")


if __name__ == "__main__":
    main()
