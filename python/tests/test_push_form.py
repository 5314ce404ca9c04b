"""PusH's own entry points and programs, run on push with only their imports changed."""
import pytest
import torch

import push
import push.bayes.ensemble as ensemble
from conftest import MLP, regression_loader


# engine=None: the run trains on push's C++ engine (MLP's forward is a chain of layers, the
# loss MSE, the loader shuffled); engine=False: as Python handlers, PusH's way.
both_paths = pytest.mark.parametrize("engine", [None, False])


@both_paths
def test_train_deep_ensemble_as_pusH_calls_it(engine):
    loader, x, y = regression_loader(shuffle=True)
    with ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 40, MLP, 32, num_ensembles=3,
                                      engine=engine) as ens:
        assert (ens._routed is not None) == (engine is None)
        params = ens.p_parameters()
        assert len(params) == 3 and all(len(p) == 4 for p in params)
        assert not torch.equal(params[0][0], params[1][0])  # each member its own initialisation
        for p in params:
            net = MLP(32)
            torch.nn.utils.vector_to_parameters(torch.nn.utils.parameters_to_vector(p), net.parameters())
            assert torch.nn.functional.mse_loss(net(x), y).item() < 0.05
        assert len(ens.losses) == 40 and ens.losses[-1] < ens.losses[0]
        pred = ens.posterior_pred(x, mode=["mean", "std", "pred", "median", "min", "max"])
        assert pred["pred"].shape == (len(x), 3, 1)
        assert torch.allclose(pred["mean"], pred["pred"].mean(dim=1))
        assert torch.equal(pred["min"], pred["pred"].min(dim=1).values)
        assert torch.equal(pred["max"], pred["pred"].max(dim=1).values)
        assert torch.nn.functional.mse_loss(pred["mean"], y).item() < 0.05
        assert (pred["std"] > 0).all()
        # A DataLoader predicts batch by batch, the same numbers.
        assert torch.allclose(ens.posterior_pred(regression_loader()[0])["mean"], pred["mean"])


@both_paths
def test_train_deep_ensemble_is_repeatable_and_spreads_over_lanes(engine):
    def run(**kwargs):
        loader, _, _ = regression_loader(n=64, shuffle=True)  # its order drawn anew from its own seed
        with ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 3, MLP, 8, num_ensembles=4, num_devices=2,
                                          engine=None if kwargs.get("random_seed") else engine, **kwargs) as ens:
            assert ens.num_devices == 2
            return ens.p_parameters()

    a, b = run(seed=7), run(seed=7)
    assert all(torch.equal(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))
    torch.manual_seed(3)
    c = run(random_seed=True)  # PusH's: each particle made under a key drawn from torch's generator
    torch.manual_seed(3)
    assert all(torch.equal(x, y) for pa, pb in zip(c, run(random_seed=True)) for x, y in zip(pa, pb))
    assert not torch.equal(a[0][0], c[0][0])


@both_paths
def test_bootstrap_gives_each_member_its_own_resample(engine):
    def loader():  # each run's order drawn anew from the loader's own seed
        return regression_loader(n=128, batch=32, shuffle=True)[0]

    with ensemble.train_deep_ensemble(loader(), torch.nn.MSELoss(), 4, MLP, 8, num_ensembles=3, seed=1,
                                      engine=engine) as plain, \
            ensemble.train_deep_ensemble(loader(), torch.nn.MSELoss(), 4, MLP, 8, num_ensembles=3, seed=1,
                                         bootstrap=True, engine=engine) as boot, \
            ensemble.train_deep_ensemble(loader(), torch.nn.MSELoss(), 4, MLP, 8, num_ensembles=3, seed=1,
                                         bootstrap=True, engine=engine) as again:
        for pid in range(3):
            assert not torch.equal(plain.p_parameters()[pid][0], boot.p_parameters()[pid][0])
            assert all(torch.equal(u, v) for u, v in zip(boot.p_parameters()[pid], again.p_parameters()[pid]))


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
