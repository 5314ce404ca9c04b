"""An unchanged PusH MultiSWAG program on push's C++ engine (push.bayes.engine_route): the
engine's MultiSWAG with PusH's Adam (weight decay lr / 1000) collecting through the
particles' own optimizer at each epoch's end, its pretraining one epoch shorter so that it
collects the pretrained weights as PusH's form does; predictions sample PusH's way from the
engine's moments."""
import math
import warnings

import pytest
import torch
from torch import nn

import push.bayes as bayes
import push.bayes.swag as swag
from conftest import MLP, regression_loader


def mlp_seq(width):
    # MLP(width) as a Sequential: the same layers made in the same order, so the same weights.
    return nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, 1))


def flat(parameters):
    return torch.stack([torch.cat([t.reshape(-1) for t in p]) for p in parameters])


def routed(loader, *epochs, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error", bayes.PythonPathWarning)
        return swag.MultiSWAG(MLP, 8, seed=3).bayes_infer(loader, *epochs, **kwargs)


def test_the_multiswag_push_form_trains_on_the_engine_as_the_engine_does():
    loader, x, y = regression_loader(n=128, batch=32, shuffle=True)
    ours = routed(loader, 3, 4, lr=0.05, num_models=3, cov_mat_rank=2)
    # The C++ path with the options the route maps PusH's run to: the same numbers.
    direct = bayes.MultiSWAG(lambda: mlp_seq(8), seed=3, particles=3, lr=0.05, weight_decay=0.05 / 1e3,
                             batch_size=32, fuse=True, noise_std=math.sqrt(0.5), prior_std=math.inf,
                             pretrain_epochs=2, rank=2, collect_every_steps=0, collect_momentum=None, devices=1,
                             cache_size=4).fit(x, y, epochs=7)
    with ours, direct:
        engine = ours._routed[0]
        assert engine.fused
        theirs = [[t for _, t in direct.particle_parameters(pid)] for pid in direct.particle_ids()]
        for a, b in zip(ours.p_parameters(), theirs):
            assert all(torch.equal(u, v) for u, v in zip(a, b))
        for pid in direct.particle_ids():
            mine, other = engine.swag_moments(pid), direct.swag_moments(pid)
            assert mine["count"] == other["count"] == 5  # the pretrained weights and 4 epochs' ends
            assert all(torch.equal(mine[k], other[k]) for k in ("mean", "sq_mean", "deviations"))
        assert ours.losses == pytest.approx([v - 0.5 * math.log(math.pi) for v in direct.losses], abs=1e-6)
        assert len(ours.losses) == 7 and ours.losses[-1] < ours.losses[0]


@pytest.mark.parametrize("swag_epochs,rank", [(4, 3), (2, 5), (3, 0)])
def test_the_engine_collects_and_samples_as_pusH_s_form_does(swag_epochs, rank):
    # One batch an epoch: both paths see the same data at every step, so they train alike
    # (float rounding apart); the moments they collect, and the samples drawn from them
    # with the same seeds, agree.
    loader, x, _ = regression_loader(n=64, batch=64, shuffle=True)
    engine = routed(loader, 3, swag_epochs, lr=0.05, num_models=3, cov_mat_rank=rank)
    python = swag.MultiSWAG(MLP, 8, seed=3).bayes_infer(loader, 3, swag_epochs, lr=0.05, num_models=3,
                                                         cov_mat_rank=rank, engine=False)
    with engine, python:
        assert engine._routed is not None and python._routed is None
        assert torch.allclose(flat(engine.p_parameters()), flat(python.p_parameters()), atol=1e-5)
        for pid in python.push_dist.particle_ids():
            kept = python.push_dist._slots[pid].state[pid]["cov_mat_sqrt"]
            rows = engine._routed_moments(pid, engine._routed_modules()[pid])[2]
            assert rows.shape == torch.cat(kept, dim=1).shape == (min(swag_epochs, rank), 8 * 3 + 1)
            assert torch.allclose(rows, torch.cat(kept, dim=1), atol=1e-5)
        for _ in range(2):  # each call draws anew, the same draws on both paths
            a = engine.posterior_pred(x, num_samples=4, mode=["mean", "std"])
            b = python.posterior_pred(x, num_samples=4, mode=["mean", "std"])
            assert torch.allclose(a["mean"], b["mean"], atol=1e-5) and torch.allclose(a["std"], b["std"], atol=1e-5)
        loader_pred = engine.posterior_pred(torch.utils.data.DataLoader(x, batch_size=16), num_samples=2)
        assert loader_pred["mean"].shape == (64, 1)


def test_why_a_multiswag_run_stays_python_code_is_said(tmp_path):
    loader, x, y = regression_loader(n=64, batch=32, shuffle=True)
    cases = [
        (dict(loss_fn=nn.L1Loss()), "the loss L1Loss"),
        (dict(mswag_entry=lambda p, *a: []), "mswag_entry"),
        (dict(mswag_state={"k": 1}), "mswag_state"),
        (dict(bootstrap=True), "bootstrap"),
        (dict(f_save=str(tmp_path / "p")), "f_save"),
        (dict(mk_optim=lambda p: torch.optim.SGD(p, lr=0.1)), "makes a SGD"),
        (dict(pretrain_epochs=0), "pretrain_epochs=0"),
    ]
    for kwargs, why in cases:
        epochs = (kwargs.pop("pretrain_epochs", 1), 1)
        with swag.MultiSWAG(MLP, 4) as model:
            assert why in bayes.explain(model, loader, pretrain_epochs=epochs[0], num_models=2, **kwargs), why
            with pytest.warns(bayes.PythonPathWarning, match="trains as Python code") as caught:
                model.bayes_infer(loader, *epochs, num_models=2, **kwargs)
            assert caught[0].filename == __file__ and model._routed is None
        with swag.MultiSWAG(MLP, 4) as model, pytest.raises(ValueError, match="engine=True.*" + why[:8]):
            model.bayes_infer(loader, *epochs, num_models=2, engine=True, **kwargs)
    with swag.MultiSWAG(MLP, 4) as model:
        assert bayes.explain(model, loader, pretrain_epochs=1, num_models=2) == ""
        model.bayes_infer(loader, 1, 1, num_models=2)
        assert "a second bayes_infer is refused" in bayes.explain(model, loader)
        with pytest.raises(ValueError, match="trained on push's C.. engine.*make another MultiSWAG"):
            model.bayes_infer(loader, 1, 1, num_models=2)
    with swag.train_mswag(loader, nn.MSELoss(), 1, 1, MLP, 4, num_models=2, engine=False) as model:
        assert model._routed is None and len(model.push_dist.particle_ids()) == 2
    with pytest.raises(TypeError, match="swag_moments is MultiSWAG's"):
        bayes.Ensemble(lambda: mlp_seq(4), particles=1).fit(x, y, epochs=1).swag_moments(0)
