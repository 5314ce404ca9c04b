import pytest
import torch

import push


def linear():
    return torch.nn.Linear(3, 1)


@pytest.fixture
def dist():
    with push.PusH(linear) as d:
        yield d


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)
