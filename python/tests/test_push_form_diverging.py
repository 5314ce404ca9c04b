"""A PusH-form run that diverges stops with an error naming the particle and the epoch, on
the Python path as on the engine (PusH trained on to NaN weights and predictions)."""
import pytest
import torch

import push.bayes.ensemble as ensemble
import push.bayes.stein_vgd as stein_vgd
import push.bayes.swag as swag
from conftest import MLP, regression_loader
from push.bayes.particle_infer import check_finite

DIVERGED = r"the training loss of particle [0-9]+ is non-finite \((nan|inf|-inf)\) in epoch [0-9]+: training diverged"


def huge_sgd(params):
    return torch.optim.SGD(params, lr=1e8)


def test_a_diverging_python_path_run_names_the_particle_and_epoch():
    loader, _, _ = regression_loader(n=64, batch=16)
    with ensemble.Ensemble(MLP, 8) as ens, pytest.raises(RuntimeError, match="push.bayes.ensemble: " + DIVERGED):
        ens.bayes_infer(loader, 5, num_ensembles=3, mk_optim=huge_sgd, engine=False)
    with swag.MultiSWAG(MLP, 8) as ms, pytest.raises(RuntimeError, match=DIVERGED):
        ms.bayes_infer(loader, 3, 2, lr=1e8, num_models=2, mk_optim=huge_sgd)
    for engine in (False, None):
        # The Python path's own check; on the engine, the engine's (Infer::check_finite).
        shuffled, _, _ = regression_loader(n=64, batch=16, shuffle=True)
        # (on the Python path the update, checked at each batch, may show it first)
        with stein_vgd.SteinVGD(MLP, 8) as sv, pytest.raises(RuntimeError, match=DIVERGED if engine is None else
                                                             r"(training loss|SVGD update) of particle [0-9]+ is "
                                                             r"non-finite.* in epoch [0-9]+: training diverged"):
            sv.bayes_infer(shuffled, 5, num_particles=3, lr=1e8, engine=engine)


def test_losses_of_any_shape_are_checked():
    # A handler may report a loss per point (no reduction): then each is checked on its own.
    check_finite("w", 2, [(0, torch.tensor(0.5)), (1, torch.ones(3)), (2, None)])  # finite: no error
    with pytest.raises(RuntimeError, match=r"w: the training loss of particle 4 is non-finite \(nan\) in epoch 3"):
        check_finite("w", 2, [(0, torch.tensor(0.5)), (4, torch.tensor([1.0, float("nan")]))])
    with pytest.raises(RuntimeError, match=r"particle 1 is non-finite \(inf\) in epoch 1"):
        check_finite("w", 0, [(0, torch.tensor(0.5)), (1, torch.tensor(float("inf")))])
