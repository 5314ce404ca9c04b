"""PusH's own entry points and programs, run on push with only their imports changed."""
import torch

import push
import push.bayes.ensemble as ensemble


def regression_loader(n=256, batch=64):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    y = torch.sin(2 * x) + 0.05 * torch.randn(n, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch), x, y


class MLP(torch.nn.Module):
    # Not a Sequential: trains as Python code on push's particles.
    def __init__(self, width):
        super().__init__()
        self.a = torch.nn.Linear(1, width)
        self.b = torch.nn.Linear(width, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_train_deep_ensemble_as_pusH_calls_it():
    loader, x, y = regression_loader()
    params = ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 40, MLP, 32, num_ensembles=3,
                                          mk_optim=lambda ps: torch.optim.Adam(ps, lr=1e-2))
    assert len(params) == 3 and all(len(p) == 4 for p in params)
    assert not torch.equal(params[0][0], params[1][0])  # each member its own initialisation
    for p in params:
        net = MLP(32)
        torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(p), net.parameters())
        assert torch.nn.functional.mse_loss(net(x), y).item() < 0.05


def test_train_deep_ensemble_is_repeatable_and_spreads_over_lanes():
    loader, _, _ = regression_loader(n=64)
    run = lambda: ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 3, MLP, 8, num_ensembles=4,  # noqa
                                               num_devices=2, seed=7)
    a, b = run(), run()
    assert all(torch.equal(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_the_python_examples_run():
    import os
    import pathlib
    import subprocess
    import sys

    folder = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for script in sorted(folder.glob("*.py")):
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{script.name}:\n{done.stdout}\n{done.stderr}"
