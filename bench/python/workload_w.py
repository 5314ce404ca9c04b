"""Workload W from Python (issue 23): 16 MLPs 1-64-64-1, 1,024 points, batch 128, 20 epochs,
Adam(0.01), one lane, one thread; the options of bench/bayes_bench.cpp's BM_Ensemble and
BM_SVGD (lanes 1, threads 1, N 16).

Each row is timed in this one run, in rounds, and reported with its baseline as a ratio of
the same round:
  * push.bayes.Ensemble / SVGD with a Python nn.Sequential (rebuilt in C++) against the
    same through the C++ API: push_bench_bayes, run as a subprocess in each round (its
    push_s and fused_s: each the mean of its 3 fits);
  * the same with push's C++ model spec ("mlp:64,64", no Python in the model at all);
  * push.bayes.Ensemble against a plain PyTorch loop training the 16 networks one after
    another, both on one thread;
  * a particle message round trip from a Python handler to a Python handler and from the
    user's thread (p_launch + wait), against the same from C++ handlers and the C++ user's
    thread (push_bench_runtime's BM_MessageRoundTrip/cross_lane:0 and BM_LaunchRoundTrip,
    medians).

    PYTHONPATH=build/python/package python3 bench/python/workload_w.py [--rounds 3]
    PYTHONPATH=build-torch2/python/package .venv/bin/python bench/python/workload_w.py
"""
import argparse
import json
import pathlib
import statistics
import subprocess
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
    options = dict(particles=PARTICLES, batch_size=BATCH, lr=1e-2, fuse=fuse, intra_op_threads=1, devices=1,
                   device_type="cpu", cache_size=PARTICLES)
    if isinstance(model, str):
        options.update(input_shape=[1], outputs=1)
    m = kind(model, **options)
    m.particle_ids()  # makes the particles outside the timed region, as push_bench_bayes does
    return timed(lambda: m.fit(x, y, epochs=EPOCHS))


def plain_loop(x, y):
    # What a PyTorch user writes without push: each network trained in turn, shuffled batches.
    def run():
        for k in range(PARTICLES):
            torch.manual_seed(k)
            net = mlp()
            opt = torch.optim.Adam(net.parameters(), lr=1e-2)
            for _ in range(EPOCHS):
                order = torch.randperm(POINTS)
                for i in range(0, POINTS, BATCH):
                    idx = order[i:i + BATCH]
                    opt.zero_grad()
                    nn.functional.mse_loss(net(x[idx]), y[idx]).backward()
                    opt.step()
    return timed(run)


def round_trips(n):
    """Median round trips (s): Python handler -> Python handler, user thread -> handler."""
    def echo(p, v):
        return v

    def ping(p, n):
        other = p.other_particles()[0]
        times = []
        for i in range(n):
            start = time.perf_counter()
            p.send(other, "ECHO", i).wait()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    with push.PusH(lambda: nn.Linear(1, 1), devices=1, device_type="cpu") as d:
        a = d.p_create(None, receive={"PING": ping})
        b = d.p_create(None, receive={"ECHO": echo})
        handler = d.p_launch(a, "PING", n).wait()
        times = []
        for i in range(n):
            start = time.perf_counter()
            d.p_launch(b, "ECHO", i).wait()
            times.append(time.perf_counter() - start)
    return handler, statistics.median(times)


def cpp_bench(binary, pattern):
    """{benchmark name: counters} of a Google Benchmark binary's run over ``pattern``."""
    done = subprocess.run([str(binary), f"--benchmark_filter={pattern}", "--benchmark_format=json"],
                          capture_output=True, text=True, check=True)
    return {b["name"]: b for b in json.loads(done.stdout)["benchmarks"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    default_bench = pathlib.Path(__file__).resolve().parents[2] / (
        "build" if torch.__version__.startswith("1.") else "build-torch2") / "bench"
    ap.add_argument("--bench-dir", default=str(default_bench), help="the build's bench/ (push_bench_bayes, ...)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    bench = pathlib.Path(args.bench_dir)
    x, y = data()
    names = ("ens_py", "ens_spec", "ens_cpp", "ens_fused_py", "ens_fused_spec", "ens_fused_cpp", "svgd_py",
             "svgd_spec", "svgd_cpp", "plain", "rt_handler_py", "rt_handler_cpp", "rt_user_py", "rt_user_cpp")
    rows = {name: [] for name in names}
    for _ in range(args.rounds):
        cpp = cpp_bench(bench / "push_bench_bayes", "^BM_(Ensemble|SVGD)/lanes:1/threads:1/N:16/")
        ens = cpp["BM_Ensemble/lanes:1/threads:1/N:16/iterations:3"]
        svgd = cpp["BM_SVGD/lanes:1/threads:1/N:16/iterations:3"]
        rows["ens_cpp"].append(ens["push_s"])
        rows["ens_fused_cpp"].append(ens["fused_s"])
        rows["svgd_cpp"].append(svgd["push_s"])
        # The Python rows: each the median of 3 fits, as the C++ rows are means of 3.
        for name, kind, model, fuse in (("ens_py", bayes.Ensemble, mlp, False),
                                        ("ens_spec", bayes.Ensemble, "mlp:64,64", False),
                                        ("ens_fused_py", bayes.Ensemble, mlp, True),
                                        ("ens_fused_spec", bayes.Ensemble, "mlp:64,64", True),
                                        ("svgd_py", bayes.SVGD, mlp, False),
                                        ("svgd_spec", bayes.SVGD, "mlp:64,64", False)):
            rows[name].append(statistics.median(push_fit(kind, model, fuse, x, y) for _ in range(3)))
        rows["plain"].append(plain_loop(x, y))
        rt = cpp_bench(bench / "push_bench_runtime", "^BM_(MessageRoundTrip/cross_lane:0|LaunchRoundTrip)")
        rows["rt_handler_cpp"].append(rt["BM_MessageRoundTrip/cross_lane:0/iterations:3"]["median_us"] * 1e-6)
        rows["rt_user_cpp"].append(rt["BM_LaunchRoundTrip/iterations:20000"]["median_us"] * 1e-6)
        handler, user = round_trips(5000)
        rows["rt_handler_py"].append(handler)
        rows["rt_user_py"].append(user)
    print(f"torch {torch.__version__}, 1 lane, 1 thread, {args.rounds} rounds (s; round trips in us):")
    for k, v in rows.items():
        scale = 1e6 if k.startswith("rt_") else 1
        print(f"  {k:15s} median {statistics.median(v) * scale:9.3f}   ({', '.join(f'{t * scale:.3f}' for t in v)})")
    print("ratios (median over rounds of each round's ratio):")
    pair = lambda a, b: statistics.median(p / q for p, q in zip(rows[a], rows[b]))  # noqa: E731
    print(f"  Ensemble unfused, Python model / C++ API       {pair('ens_py', 'ens_cpp'):.3f}")
    print(f"  Ensemble fused,   Python model / C++ API       {pair('ens_fused_py', 'ens_fused_cpp'):.3f}")
    print(f"  SVGD unfused,     Python model / C++ API       {pair('svgd_py', 'svgd_cpp'):.3f}")
    print(f"  Ensemble unfused, Python model / C++ spec      {pair('ens_py', 'ens_spec'):.3f}")
    print(f"  Ensemble fused,   Python model / C++ spec      {pair('ens_fused_py', 'ens_fused_spec'):.3f}")
    print(f"  SVGD unfused,     Python model / C++ spec      {pair('svgd_py', 'svgd_spec'):.3f}")
    print(f"  plain PyTorch loop / push.bayes Ensemble fused   {pair('plain', 'ens_fused_py'):.2f}x")
    print(f"  plain PyTorch loop / push.bayes Ensemble unfused {pair('plain', 'ens_py'):.2f}x")
    print(f"  round trip handler -> handler, Python / C++      {pair('rt_handler_py', 'rt_handler_cpp'):.2f}x")
    print(f"  round trip user thread -> handler, Python / C++  {pair('rt_user_py', 'rt_user_cpp'):.2f}x")


if __name__ == "__main__":
    main()
