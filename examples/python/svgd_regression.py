"""SVGD on a noisy sine, as PusH's SVGD example trains it: only the import of push differs
from PusH's form (here it is push's package of the same name). PusH's example takes 2,000
epochs at lr 1e-2; this one 150 at 5e-2, to run in seconds. Away from the training interval
the particles disagree more than on it.

    python examples/python/svgd_regression.py
"""
import math

import torch
from torch.utils.data import DataLoader, Dataset

import push.bayes.stein_vgd


class SineWithNoiseDataset(Dataset):
    def __init__(self, n, begin, end, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.xs = torch.linspace(begin, end, n).unsqueeze(1)
        self.ys = torch.sin(self.xs) + 0.1 * torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.xs)

    def __getitem__(self, i):
        return self.xs[i], self.ys[i]


class BiggerNN(torch.nn.Module):
    def __init__(self, n, input_dim, output_dim, hidden_dim):
        super().__init__()
        layers = [torch.nn.Linear(input_dim, hidden_dim), torch.nn.ReLU()]
        for _ in range(n - 1):
            layers += [torch.nn.Linear(hidden_dim, hidden_dim), torch.nn.ReLU()]
        self.body = torch.nn.Sequential(*layers, torch.nn.Linear(hidden_dim, output_dim))

    def forward(self, x):
        return self.body(x)


if __name__ == "__main__":
    torch.manual_seed(0)
    dataset = SineWithNoiseDataset(512, -math.pi, math.pi)
    dataloader = DataLoader(dataset, batch_size=128, shuffle=True)
    svgd = push.bayes.stein_vgd.train_svgd(dataloader, torch.nn.MSELoss(), 150, 4, BiggerNN, 2, 1, 1, 32,
                                           lengthscale=0.5, lr=5e-2)
    test = SineWithNoiseDataset(256, -3 * math.pi, 3 * math.pi, seed=1)
    pred = svgd.posterior_pred(DataLoader(test, batch_size=64, shuffle=False), mode=["mean", "std"])
    inside = test.xs.abs().squeeze(1) <= math.pi
    rmse = ((pred["mean"][inside] - test.ys[inside]) ** 2).mean().sqrt().item()
    spread_in, spread_out = pred["std"][inside].mean().item(), pred["std"][~inside].mean().item()
    print(f"particles 4  RMSE on the training interval {rmse:.3f}  spread on it {spread_in:.3f}  "
          f"outside it {spread_out:.3f}")
    assert rmse < 0.3 and spread_out > 2 * spread_in
