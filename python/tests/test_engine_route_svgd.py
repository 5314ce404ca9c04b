"""An unchanged PusH SteinVGD program on push's C++ engine (push.bayes.engine_route): the
engine's SVGD with plain SGD at PusH's rate, bandwidth 2 lengthscale^2 and the gradient of
the batch's mean loss (likelihood_weight 1) moves the particles as PusH's form does, and
says why when a run stays Python code."""
import math
import warnings

import pytest
import torch
from torch import nn

import push.bayes as bayes
import push.bayes.stein_vgd as stein_vgd
from conftest import MLP, regression_loader


def mlp_seq(width):
    # MLP(width) as a Sequential: the same layers made in the same order, so the same weights.
    return nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, 1))


def flat(parameters):
    return torch.stack([torch.cat([t.reshape(-1) for t in p]) for p in parameters])


def routed(loader, epochs, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", bayes.PythonPathWarning)
        return stein_vgd.SteinVGD(MLP, 8, seed=3).bayes_infer(loader, epochs, **kwargs)


def test_the_stein_vgd_push_form_trains_on_the_engine_as_the_engine_does():
    loader, x, y = regression_loader(n=128, batch=32, shuffle=True)
    ours = routed(loader, 5, num_particles=3, lengthscale=0.5, lr=0.05)
    # The C++ path with the options the route maps PusH's run to: the same numbers. MSE is
    # the Gaussian likelihood at variance 1/2, weighed once (the batch's mean).
    direct = bayes.SVGD(lambda: mlp_seq(8), seed=3, particles=3, lr=0.05, optimizer="sgd", bandwidth=0.5,
                        likelihood_weight=1.0, batch_size=32, fuse=True, noise_std=math.sqrt(0.5),
                        prior_std=math.inf, devices=1, cache_size=4).fit(x, y, epochs=5)
    with ours, direct:
        assert ours._routed[0].fused
        theirs = [[t for _, t in direct.particle_parameters(pid)] for pid in direct.particle_ids()]
        assert len(ours.p_parameters()) == 3
        for a, b in zip(ours.p_parameters(), theirs):
            assert all(torch.equal(u, v) for u, v in zip(a, b))
        assert ours.losses == pytest.approx([v - 0.5 * math.log(math.pi) for v in direct.losses], abs=1e-6)
        assert ours.losses[-1] < ours.losses[0]
        pred = ours.posterior_pred(x, mode=["pred"])["pred"].transpose(0, 1)
        assert torch.allclose(pred, direct.predict(x).members.to(torch.float32), atol=1e-5)


def classes_loader(n=64, batch=64):
    _, x, y = regression_loader(n=n, batch=batch)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (y > 0).long().view(-1)), batch_size=batch,
                                       shuffle=True, generator=torch.Generator().manual_seed(2))


class TwoClasses(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a, self.b = nn.Linear(1, width), nn.Linear(width, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("make,loss,lengthscale", [(MLP, nn.MSELoss(), 0.7), (MLP, nn.MSELoss(), 0.01),
                                                   (TwoClasses, nn.CrossEntropyLoss(), 0.7)])
def test_the_engine_moves_the_particles_as_pusH_s_form_does(make, loss, lengthscale):
    # One batch an epoch: both paths see the same data at every step, so they compute the
    # same updates (the engine's kernel sums in another order: float rounding apart), at a
    # length scale far below the particles' distances too, and with cross entropy.
    loader = regression_loader(n=64, batch=64, shuffle=True)[0] if make is MLP else classes_loader()
    x = loader.dataset.tensors[0]
    with stein_vgd.SteinVGD(make, 8, seed=3) as start:
        start.bayes_infer(loader, 0, num_particles=4, loss_fn=loss, engine=False)
        before = flat(start.p_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("error", bayes.PythonPathWarning)
        engine = stein_vgd.SteinVGD(make, 8, seed=3).bayes_infer(loader, 8, num_particles=4, loss_fn=loss,
                                                                lengthscale=lengthscale, lr=0.1)
    python = stein_vgd.SteinVGD(make, 8, seed=3).bayes_infer(loader, 8, num_particles=4, loss_fn=loss,
                                                            lengthscale=lengthscale, lr=0.1, engine=False)
    with engine, python:
        assert engine._routed is not None and python._routed is None
        a, b = flat(engine.p_parameters()), flat(python.p_parameters())
        moved = (b - before).norm(dim=1)
        assert (moved > 0.02).all()  # the particles trained
        assert ((a - b).norm(dim=1) < 1e-4 * moved.max()).all(), ((a - b).norm(dim=1), moved)
        f_reg = make is MLP
        mode = "mean" if f_reg else "mean_prob"
        mean = python.posterior_pred(x, f_reg=f_reg, mode=[mode])[mode]
        assert torch.allclose(engine.posterior_pred(x, f_reg=f_reg, mode=[mode])[mode], mean, atol=1e-5)


def test_why_a_stein_vgd_run_stays_python_code_is_said():
    loader, x, y = regression_loader(n=64, batch=32, shuffle=True)
    cases = [
        (MLP, loader, dict(loss_fn=nn.L1Loss()), "the loss L1Loss"),
        (MLP, loader, dict(svgd_entry=lambda p, *a: None), "svgd_entry"),
        (MLP, loader, dict(svgd_state={"k": 1}), "svgd_state"),
        (MLP, loader, dict(random_seed=True), "random_seed"),
        (MLP, regression_loader(n=64, batch=32)[0], {}, "shuffle=False"),
    ]
    for make, data, kwargs, why in cases:
        args = (4,) if make is MLP else ()
        with stein_vgd.SteinVGD(make, *args) as model:
            assert why in bayes.explain(model, data, num_particles=2, **kwargs), why
            with pytest.warns(bayes.PythonPathWarning, match="trains as Python code") as caught:
                model.bayes_infer(data, 1, num_particles=2, **kwargs)
            assert caught[0].filename == __file__
            assert model._routed is None
        with stein_vgd.SteinVGD(make, *args) as model, pytest.raises(ValueError, match="engine=True.*" + why[:8]):
            model.bayes_infer(data, 1, num_particles=2, engine=True, **kwargs)
    with stein_vgd.SteinVGD(MLP, 4) as model:
        assert bayes.explain(model, loader, num_particles=2) == ""
        model.bayes_infer(loader, 1, num_particles=2)
        assert "a second bayes_infer is refused" in bayes.explain(model, loader)
        with pytest.raises(ValueError, match="trained on push's C.. engine.*make another SteinVGD"):
            model.bayes_infer(loader, 1, num_particles=2)
    with stein_vgd.train_svgd(loader, nn.MSELoss(), 1, 2, MLP, 4, engine=False) as model:
        assert model._routed is None and len(model.push_dist.particle_ids()) == 2
    with stein_vgd.SteinVGD(MLP, 4) as model, pytest.raises(ValueError, match="optimizer must be"):
        bayes.SVGD(lambda: mlp_seq(4), optimizer="rmsprop")
