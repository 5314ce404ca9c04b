import os

import pytest
import torch

import push

# python/tests/install_check runs these tests against the installed wheel.
if os.environ.get("PUSH_TEST_INSTALLED"):
    assert "site-packages" in push.__file__, f"push comes from {push.__file__}, not the installed wheel"


def linear():
    return torch.nn.Linear(3, 1)


@pytest.fixture
def dist():
    with push.PusH(linear) as d:
        yield d


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


# PusH's entry points' data and model (test_push_form*.py): a 1-D regression and a module
# that is not a Sequential, so it trains as Python code on push's particles.
def regression_loader(n=256, batch=64, shuffle=False):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x) + 0.05 * torch.randn(n, 1, generator=g)
    order = torch.Generator().manual_seed(2) if shuffle else None
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=shuffle,
                                       generator=order), x, y


class MLP(torch.nn.Module):
    # Not a Sequential: trains as Python code on push's particles.
    def __init__(self, width):
        super().__init__()
        self.a = torch.nn.Linear(1, width)
        self.b = torch.nn.Linear(width, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))
