"""The same kind of ensemble through push.bayes: the nn.Sequential is rebuilt in C++ and the
16 networks train fused, without the GIL.

    python examples/python/fast_ensemble.py
"""
import torch
from torch import nn

import push.bayes as bayes

if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(512, 1, generator=g) * 1.5 - 2.0, torch.rand(512, 1, generator=g) * 1.5 + 0.5])
    y = torch.sin(2 * x) + 0.05 * torch.randn(1024, 1, generator=g)
    make = lambda: nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))  # noqa
    model = bayes.Ensemble(make, particles=16, lr=1e-2, noise_std=0.05, batch_size=128, fuse=True).fit(x, y, epochs=20)
    on = model.predict(x)
    gap = model.predict(torch.linspace(-0.4, 0.4, 16).unsqueeze(1))
    print(f"fused {model.fused}  loss {model.losses[0]:.3f} -> {model.losses[-1]:.3f}  "
          f"epistemic std on the data {on.epistemic.sqrt().mean():.3f}  in the gap {gap.epistemic.sqrt().mean():.3f}")
    assert model.fused and gap.epistemic.mean() > on.epistemic.mean()
