"""An unchanged PusH program on push, against PusH itself and a plain PyTorch loop (issue 46).

The program is workload W as a PusH user writes it: a module class with a forward (MLP
1-64-64-1), a DataLoader of 1,024 points in batches of 128, torch.nn.MSELoss, 16 members,
20 epochs, ``Ensemble(MLP, ...).bayes_infer(loader, 20, num_ensembles=16)`` at PusH's
default Adam(0.01); with --algo svgd, PusH's ``SteinVGD(MLP, cache_size=16, view_size=16)
.bayes_infer(loader, 20, num_particles=16, lengthscale=1.0, lr=0.5)`` instead (plain SGD
on SVGD's update, PusH's way); with --algo mswag, PusH's ``MultiSWAG(MLP).bayes_infer(loader,
10, 10, num_models=16)`` (10 epochs of pretraining, 10 collecting, PusH's Adam(0.01) with
weight decay 1e-5). Rows, each the seconds bayes_infer takes (in-process training time),
timed in turn in every round, each in a fresh interpreter with one thread:
  * push_engine: the program on push, where it trains on the C++ engine (engine_route);
  * push_python: the same with engine=False, PusH's loop as Python handlers on push;
  * plain (ensemble): a plain PyTorch loop doing PusH's steps: each batch the DataLoader
    gives, every one of the 16 networks in turn steps on it;
  * push_peer: the program on PusH itself, with --peer DIR naming a folder that holds
    PusH's ``push`` package (never committed; run it beside push, see docs/python.md);
    without a GPU its one device lane is the CPU (cpu_for_cuda).
Ratios are medians over rounds of each round's ratio.

    PYTHONPATH=build/python/package python3 bench/python/push_form.py --peer /tmp/peer [--rounds 5]
        [--algo ensemble|svgd|mswag]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PARTICLES, POINTS, BATCH, EPOCHS = 16, 1024, 128, 20
SVGD_LR, LENGTHSCALE = 0.5, 1.0


def cpu_for_cuda(torch) -> None:
    """PusH makes one device lane per CUDA device and moves modules and tensors to device
    ids: without a GPU, one lane whose device is the CPU (PusH's code unchanged)."""
    torch.cuda.device_count = lambda: 1

    def on_cpu(to):
        def moved(self, *args, **kwargs):
            args = tuple("cpu" if isinstance(a, int) and not isinstance(a, bool) or a in ("cuda", "cuda:0") else a
                         for a in args)
            return to(self, *args, **kwargs)
        return moved

    torch.Tensor.to = on_cpu(torch.Tensor.to)
    torch.nn.Module.to = on_cpu(torch.nn.Module.to)


def child(row: str, algo: str) -> tuple:
    """One row in this interpreter: the seconds its training takes, and the training MSE of
    the ensemble's mean (the plain loop: the members' mean MSE)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(1, 64), nn.Linear(64, 64), nn.Linear(64, 1)

        def forward(self, x):
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    g = torch.Generator().manual_seed(0)
    x = torch.rand(POINTS, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x) + 0.1 * torch.randn(POINTS, 1, generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    if row == "plain":
        start = time.perf_counter()
        nets = []
        for k in range(PARTICLES):
            torch.manual_seed(k)
            net = MLP()
            nets.append((net, torch.optim.Adam(net.parameters(), lr=0.01)))
        for _ in range(EPOCHS):
            for xb, yb in loader:  # PusH's steps: every member on each batch the lead reads
                for net, opt in nets:
                    opt.zero_grad()
                    nn.functional.mse_loss(net(xb), yb).backward()
                    opt.step()
        seconds = time.perf_counter() - start
        with torch.no_grad():
            mse = torch.stack([nn.functional.mse_loss(net(x), y) for net, _ in nets]).mean().item()
        return seconds, mse
    if row == "push_peer" and not torch.cuda.is_available():
        cpu_for_cuda(torch)
    extra = {"engine": row == "push_engine"} if row.startswith("push_") and row != "push_peer" else {}
    if algo == "mswag":
        from push.bayes.swag import MultiSWAG
        ens = MultiSWAG(MLP, num_devices=1)
        start = time.perf_counter()
        ens.bayes_infer(loader, EPOCHS // 2, EPOCHS - EPOCHS // 2, loss_fn=torch.nn.MSELoss(), num_models=PARTICLES,
                        **extra)
    elif algo == "svgd":
        from push.bayes.stein_vgd import SteinVGD
        ens = SteinVGD(MLP, num_devices=1, cache_size=PARTICLES, view_size=PARTICLES)
        start = time.perf_counter()
        ens.bayes_infer(loader, EPOCHS, loss_fn=torch.nn.MSELoss(), num_particles=PARTICLES,
                        lengthscale=LENGTHSCALE, lr=SVGD_LR, **extra)
    else:
        from push.bayes.ensemble import Ensemble
        ens = Ensemble(MLP, num_devices=1)
        start = time.perf_counter()
        ens.bayes_infer(loader, EPOCHS, loss_fn=torch.nn.MSELoss(), num_ensembles=PARTICLES, **extra)
    seconds = time.perf_counter() - start
    mse = torch.nn.functional.mse_loss(ens.posterior_pred(x)["mean"], y).item()
    if hasattr(ens, "close"):
        ens.close()
    return seconds, mse


def run(row: str, peer: str, algo: str) -> tuple:
    env = dict(os.environ)
    if row == "push_peer":
        env["PYTHONPATH"] = peer
    done = subprocess.run([sys.executable, __file__, "--child", row, "--algo", algo], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"push_form: row {row} failed:\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # The noise variance is 0.01 and a mean predictor scores about 0.5: push's rows must fit.
    if row.startswith("push_") and row != "push_peer" and not out["mse"] < 0.1:
        raise SystemExit(f"push_form: {row} trained badly (MSE {out['mse']})")
    return out["seconds"], out["mse"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peer", default="", help="a folder holding PusH's push package (its row is left out without)")
    ap.add_argument("--algo", choices=["ensemble", "svgd", "mswag"], default="ensemble")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        seconds, mse = child(args.child, args.algo)
        print(json.dumps({"seconds": seconds, "mse": mse}))
        return
    plain = ["plain"] if args.algo == "ensemble" else []
    rows = ["push_engine", "push_python"] + plain + (["push_peer"] if args.peer else [])
    times, fits = {r: [] for r in rows}, {r: [] for r in rows}
    for _ in range(args.rounds):
        for r in rows:
            seconds, mse = run(r, args.peer, args.algo)
            times[r].append(seconds)
            fits[r].append(mse)
    import torch
    print(f"torch {torch.__version__}, workload W in PusH's form ({args.algo}), 1 thread, {args.rounds} rounds (s):")
    for r, v in times.items():
        print(f"  {r:12s} median {statistics.median(v):7.3f}   ({', '.join(f'{t:.3f}' for t in v)})"
              f"   training MSE median {statistics.median(fits[r]):.4f}")
    pair = lambda a, b: statistics.median(p / q for p, q in zip(times[a], times[b]))  # noqa: E731
    print("ratios (median of each round's ratio):")
    if plain:
        print(f"  plain loop / push, engine        {pair('plain', 'push_engine'):.2f}x")
        print(f"  push, Python path / plain loop   {pair('push_python', 'plain'):.2f}")
    print(f"  push, Python path / engine       {pair('push_python', 'push_engine'):.2f}x")
    if args.peer:
        print(f"  PusH / push, engine              {pair('push_peer', 'push_engine'):.2f}x")
        print(f"  PusH / push, Python path         {pair('push_peer', 'push_python'):.2f}x")


if __name__ == "__main__":
    main()
