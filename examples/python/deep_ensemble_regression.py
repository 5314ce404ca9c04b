"""A deep ensemble on a 1-D regression with a gap, as PusH's users write it: only the
import of push differs from PusH's form (here it is push's package of the same name).

    python examples/python/deep_ensemble_regression.py
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

import push.bayes.ensemble


class RegNet(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(1, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                        torch.nn.ReLU(), torch.nn.Linear(width, 1))

    def forward(self, x):
        return self.body(x)


def gap_data(n=256):
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(n // 2, 1, generator=g) * 1.5 - 2.0, torch.rand(n // 2, 1, generator=g) * 1.5 + 0.5])
    return x, torch.sin(2 * x) + 0.05 * torch.randn(n, 1, generator=g)


if __name__ == "__main__":
    x, y = gap_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=False)
    ensemble = push.bayes.ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 60, RegNet, 32, num_ensembles=4,
                                                       lr=1e-2)
    on = ensemble.posterior_pred(x, mode=["mean", "std"])
    gap = ensemble.posterior_pred(torch.linspace(-0.4, 0.4, 16).unsqueeze(1), mode=["std"])
    rmse = ((on["mean"] - y) ** 2).mean().sqrt().item()
    print(f"members {len(ensemble.p_parameters())}  train RMSE {rmse:.3f}  spread on the data "
          f"{on['std'].mean():.3f}  in the gap {gap['std'].mean():.3f}")
    assert rmse < 0.2
