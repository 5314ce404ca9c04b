"""Workload W from Python (issue 23): 16 MLPs 1-64-64-1, 1,024 points, batch 128, 20 epochs.

Each row is timed in this one run, in turns, and reported with its baseline as a ratio:
  * push.bayes.Ensemble / SVGD with a Python nn.Sequential (rebuilt in C++) against the same
    algorithm given push's C++ model spec ("mlp:64,64", no Python in the model at all);
  * push.bayes.Ensemble against a plain PyTorch loop training the 16 networks one after
    another, both on one thread;
  * a particle message round trip from a Python handler to a Python handler, and from the
    user's thread (p_launch + wait).

    PYTHONPATH=build/python/package python3 bench/python/workload_w.py [--repeats 3]
"""
import argparse
import statistics
import time

import torch
from torch import nn

import push
import push.bayes as bayes

PARTICLES, POINTS, BATCH, EPOCHS = 16, 1024, 128, 20


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(POINTS, 1, generator=g) * 4 - 2
    return x, torch.sin(2 * x) + 0.1 * torch.randn(POINTS, 1, generator=g)


def mlp():
    return nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def push_fit(kind, model, fuse, x, y):
    options = dict(particles=PARTICLES, batch_size=BATCH, lr=1e-3, noise_std=0.1, fuse=fuse, intra_op_threads=1,
                   devices=1, device_type="cpu")
    if isinstance(model, str):
        options.update(input_shape=[1], outputs=1)
    m = kind(model, **options)
    return timed(lambda: m.fit(x, y, epochs=EPOCHS))


def plain_loop(x, y):
    # What a PyTorch user writes without push: each network trained in turn, shuffled batches.
    def run():
        for k in range(PARTICLES):
            torch.manual_seed(k)
            net = mlp()
            opt = torch.optim.Adam(net.parameters(), lr=1e-3)
            for _ in range(EPOCHS):
                order = torch.randperm(POINTS)
                for i in range(0, POINTS, BATCH):
                    idx = order[i:i + BATCH]
                    opt.zero_grad()
                    nn.functional.mse_loss(net(x[idx]), y[idx]).backward()
                    opt.step()
    return timed(run)


def round_trips(n):
    def echo(p, v):
        return v

    def ping(p, n):
        other = p.other_particles()[0]
        start = time.perf_counter()
        for i in range(n):
            p.send(other, "ECHO", i).wait()
        return (time.perf_counter() - start) / n

    with push.PusH(lambda: nn.Linear(1, 1), devices=1, device_type="cpu") as d:
        a = d.p_create(None, receive={"PING": ping})
        b = d.p_create(None, receive={"ECHO": echo})
        handler = d.p_launch(a, "PING", n).wait()
        start = time.perf_counter()
        for i in range(n):
            d.p_launch(b, "ECHO", i).wait()
        user = (time.perf_counter() - start) / n
    return handler, user


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    x, y = data()
    rows = {name: [] for name in ("ens_py", "ens_spec", "ens_fused_py", "ens_fused_spec", "svgd_py", "svgd_spec",
                                  "plain")}
    for _ in range(args.repeats):
        rows["ens_py"].append(push_fit(bayes.Ensemble, mlp, False, x, y))
        rows["ens_spec"].append(push_fit(bayes.Ensemble, "mlp:64,64", False, x, y))
        rows["ens_fused_py"].append(push_fit(bayes.Ensemble, mlp, True, x, y))
        rows["ens_fused_spec"].append(push_fit(bayes.Ensemble, "mlp:64,64", True, x, y))
        rows["svgd_py"].append(push_fit(bayes.SVGD, mlp, False, x, y))
        rows["svgd_spec"].append(push_fit(bayes.SVGD, "mlp:64,64", False, x, y))
        rows["plain"].append(plain_loop(x, y))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"torch {torch.__version__}, 1 thread, medians of {args.repeats} (s):")
    for k, v in rows.items():
        print(f"  {k:15s} {med[k]:7.3f}   ({', '.join(f'{t:.3f}' for t in v)})")
    print("ratios (paired medians):")
    pair = lambda a, b: statistics.median(p / q for p, q in zip(rows[a], rows[b]))  # noqa: E731
    print(f"  Ensemble, Python model / C++ spec (unfused) {pair('ens_py', 'ens_spec'):.3f}")
    print(f"  Ensemble, Python model / C++ spec (fused)   {pair('ens_fused_py', 'ens_fused_spec'):.3f}")
    print(f"  SVGD, Python model / C++ spec               {pair('svgd_py', 'svgd_spec'):.3f}")
    print(f"  plain PyTorch loop / push.bayes Ensemble fused   {pair('plain', 'ens_fused_py'):.2f}x")
    print(f"  plain PyTorch loop / push.bayes Ensemble unfused {pair('plain', 'ens_py'):.2f}x")
    handler, user = round_trips(2000)
    print(f"message round trip: Python handler -> Python handler {handler * 1e6:.1f} us, "
          f"user thread -> Python handler {user * 1e6:.1f} us")


if __name__ == "__main__":
    main()
