"""push.bayes from Python: the C++ algorithms, with a Python model rebuilt in C++."""
import pytest
import torch
from torch import nn

import push
import push.bayes as bayes


def mlp():
    # What push's "mlp:64" spec builds in C++ for 1 input and 1 output.
    return nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 1))


def data(n=256):
    g = torch.Generator().manual_seed(3)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    return x, torch.sin(2 * x) + 0.1 * torch.randn(n, 1, generator=g)


@pytest.mark.parametrize("kind,options", [
    (bayes.Ensemble, {}),
    (bayes.Ensemble, {"fuse": True}),
    (bayes.SVGD, {}),
    (bayes.MultiSWAG, {"pretrain_epochs": 2, "rank": 2, "samples": 3}),
])
def test_a_python_model_gives_the_numbers_of_the_cpp_api(kind, options):
    # The same algorithm, seed and data: once with push's C++ model spec, once with the
    # Python Sequential rebuilt in C++. Same initial weights (drawn under the same seeds by
    # the same initialisers), same training: the same predictions, bit for bit.
    x, y = data()
    common = dict(particles=4, batch_size=64, lr=1e-2, noise_std=0.1, seed=5, **options)
    cpp = kind("mlp:64", input_shape=[1], outputs=1, **common).fit(x, y, epochs=4)
    py = kind(mlp, **common).fit(x, y, epochs=4)
    assert py.fused == cpp.fused
    assert py.losses == cpp.losses
    a, b = cpp.predict(x), py.predict(x)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.variance, b.variance)


def test_the_ensemble_learns_and_reports_uncertainty():
    x, y = data()
    model = bayes.Ensemble(mlp, particles=8, lr=1e-2, noise_std=0.1, fuse=True).fit(x, y, epochs=30)
    assert model.fused and model.epochs_done == 30
    assert model.losses[-1] < model.losses[0]
    pred = model.predict(x)
    assert ((pred.mean - y) ** 2).mean().item() < 0.1
    far = model.predict(torch.full((8, 1), 6.0))
    assert far.epistemic.mean() > pred.epistemic.mean()  # more disagreement far from the data
    assert pred.members.shape[0] == 8


def test_a_cosine_schedule_ends_at_rate_zero():
    # cosine_epochs=2: the rate falls to 0 over two epochs; later epochs change nothing.
    x, y = data()
    model = bayes.Ensemble(mlp, particles=2, lr=1e-2, noise_std=0.1, fuse=True, cosine_epochs=2).fit(x, y, epochs=2)
    before = [t.clone() for _, t in model.particle_parameters(0)]
    model.fit(x, y, epochs=2)
    assert all(torch.equal(a, b) for a, (_, b) in zip(before, model.particle_parameters(0)))
    with pytest.raises(RuntimeError, match="cosine_epochs must be >= 0"):
        bayes.Ensemble(mlp, cosine_epochs=-1).fit(x, y)


def test_rebuilt_layers_and_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(4 * 4 * 4, 3)), nn.Tanh()).double()
    assert bayes.rebuild_blocker(model) == ""
    rebuilt = dict(push._push.bayes.rebuild(model))
    mine = [t for t in model.parameters()]
    assert len(rebuilt) == len(mine)
    for got, want in zip(rebuilt.values(), mine):
        assert got.dtype == torch.float64 and torch.equal(got, want.detach())
        assert got.data_ptr() != want.data_ptr()  # a copy: the C++ particles train their own


def test_what_is_not_rebuilt_is_named():
    assert "layer[1] is a torch.nn.modules.rnn.LSTM" in bayes.rebuild_blocker(nn.Sequential(nn.Linear(2, 2),
                                                                                            nn.LSTM(2, 2)))
    assert "not a torch.nn.Sequential" in bayes.rebuild_blocker(nn.Linear(2, 2))

    class MyLinear(nn.Linear):
        pass

    assert "MyLinear" in bayes.rebuild_blocker(nn.Sequential(MyLinear(2, 2)))
    assert "its p is 1.0" in bayes.rebuild_blocker(nn.Sequential(nn.Dropout(1.0)))
    assert "padding_mode" in bayes.rebuild_blocker(nn.Sequential(nn.Conv2d(1, 1, 3, padding_mode="reflect")))
    # PusH's way trains it (bayes_infer); fit, push's C++ way, cannot, and says so.
    with pytest.raises(ValueError, match="cannot train this model in C.*LSTM.*bayes_infer"):
        bayes.Ensemble(lambda: nn.Sequential(nn.LSTM(2, 2))).fit(*data())
    with pytest.raises(ValueError, match="cannot train this model in C.*LSTM"):
        bayes.Ensemble(lambda: nn.Sequential(nn.LSTM(2, 2)), particles=2)  # C++ options: checked at once


def test_bad_options_are_named():
    with pytest.raises(TypeError, match="unknown option 'learning_rate'"):
        bayes.Ensemble(mlp, learning_rate=0.1)
    with pytest.raises(TypeError, match="option particles has the wrong type"):
        bayes.SVGD(mlp, particles="many")
    with pytest.raises(ValueError, match="likelihood must be"):
        bayes.Ensemble(mlp, likelihood="poisson")
    with pytest.raises(TypeError, match="model must be a factory"):
        bayes.Ensemble(nn.Linear(1, 1))
    with pytest.raises(ValueError, match="epochs must be a non-negative int"):
        bayes.Ensemble(mlp).fit(*data(), epochs=-1)


def test_classification_from_a_dataloader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 2, generator=g)
    y = (x[:, 0] * x[:, 1] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50)
    model = bayes.Ensemble(lambda: nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 2)), particles=4,
                           likelihood="categorical", lr=1e-2, fuse=True).fit(loader, epochs=40)
    pred = model.predict(x)
    assert pred.classify and pred.probs.shape == (300, 2)
    assert (pred.probs.argmax(1) == y).float().mean().item() > 0.8


def test_mc_dropout_and_save_load(tmp_path):
    x, y = data()
    net = lambda: nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))  # noqa: E731
    model = bayes.MCDropout(net, particles=1, samples=8, lr=1e-2, noise_std=0.1).fit(x, y, epochs=5)
    model.save(tmp_path / "mc")
    again = bayes.MCDropout(net, particles=1, samples=8, lr=1e-2, noise_std=0.1)
    again.load(tmp_path / "mc")
    assert again.epochs_done == 5
    assert torch.equal(again.predict(x).mean, model.predict(x).mean)


def test_particles_that_trained_badly_are_named():
    # The same data and model, once at a sane rate and once at one where every member's
    # loss climbs back and its predictions end worse than the training mean.
    x, y = data()
    test_x, test_y = x[:64], y[:64]
    # (At 10 epochs it had not fit yet: its noise_std of 0.1 made it 3.8x overconfident,
    # and it was named "miscalibrated".)
    good = bayes.Ensemble(mlp, particles=3, lr=1e-2, noise_std=0.1).fit(x, y, epochs=40)
    assert set(good.particle_losses) == {0, 1, 2}
    for losses in good.particle_losses.values():
        assert losses["last_epoch"] == 40 and losses["best"] <= losses["last"]
    assert good.warnings(test=(test_x, test_y), train=(x, y)) == []
    bad = bayes.Ensemble(mlp, particles=3, lr=10.0, noise_std=0.1).fit(x, y, epochs=10)
    found = bad.warnings(test=(test_x, test_y), train=(x, y))
    assert {w["kind"] for w in found} >= {"worse_than_mean"}
    assert all(w["message"].startswith(f"particle {w['particle']}: ") for w in found if w["particle"] is not None)
    assert [w for w in bad.warnings() if w["kind"] != "loss_rose"] == []
    with pytest.raises(ValueError, match="needs both test and train"):
        bad.warnings(test=(test_x, test_y))


@pytest.mark.parametrize("kind,options", [
    (bayes.SGLD, {"step_size": 1e-4}),
    (bayes.SGLD, {"step_size": 1e-3, "preconditioned": True, "fuse": True}),
    (bayes.SGHMC, {"step_size": 1e-3, "friction": 0.2, "cycle_epochs": 5}),
])
def test_sg_mcmc_chains_keep_their_samples(kind, options):
    # The chains of the C++ model spec and of the Python Sequential take the same steps
    # with the same noise; each keeps its last `samples` and predicts with them.
    x, y = data()
    common = dict(particles=2, batch_size=64, noise_std=0.1, seed=2, thin=2, samples=3, **options)
    cpp = kind("mlp:64", input_shape=[1], outputs=1, **common).fit(x, y, epochs=10)
    py = kind(mlp, **common).fit(x, y, epochs=10)
    assert py.losses == cpp.losses
    pred = py.predict(x)
    assert pred.members.shape[0] == 2 * 3
    assert ((pred.mean - y) ** 2).mean().item() < 0.5


def test_sg_mcmc_options_are_checked():
    with pytest.raises(Exception, match="friction must be in"):
        bayes.SGHMC(mlp, friction=0.0)
    with pytest.raises(TypeError):
        bayes.SGLD(mlp, frictoin=0.1)
    with pytest.raises(TypeError, match="step_size"):
        bayes.SGHMC(mlp, lr=0.1)


def test_a_randomized_prior_is_added_and_kept_frozen():
    x, y = data()
    plain = bayes.Ensemble(mlp, particles=2, lr=1e-2, noise_std=0.1, seed=4).fit(x, y, epochs=2)
    prior = bayes.Ensemble(mlp, particles=2, lr=1e-2, noise_std=0.1, seed=4, prior_scale=3.0).fit(x, y, epochs=2)
    far = torch.full((4, 1), 8.0)
    assert not torch.allclose(plain.predict(far).mean, prior.predict(far).mean)
    # Only the trained network's tensors are the particle's parameters.
    assert len(prior.particle_parameters(0)) == len(plain.particle_parameters(0))
    with pytest.raises(Exception, match="scale must be >= 0"):
        bayes.Ensemble(mlp, prior_scale=-1.0)


def test_laplace_widens_the_predictive_of_its_map_networks():
    x, y = data()
    model = bayes.Laplace(mlp, particles=2, lr=1e-2, noise_std=0.1, seed=3).fit(x, y, epochs=5)
    far = torch.full((4, 1), 6.0)
    before = model.predict(far)
    after = model.approximate(x, y).predict(far)
    assert torch.allclose(after.mean, before.mean, atol=1e-5)
    assert bool((after.variance > before.variance).all())
    with pytest.raises(ValueError, match="structure must be"):
        bayes.Laplace(mlp, structure="banded")
    with pytest.raises(Exception, match="does not take a randomized prior"):
        bayes.Laplace(mlp, prior_scale=1.0)


def test_sg_mcmc_chains_report_whether_they_mixed():
    # Chains still descending from their initialisation while they keep samples: the
    # split-R-hat of their predictions is far above 1 (push/bayes/mixing.h).
    x, y = data()
    common = dict(particles=3, batch_size=64, noise_std=0.1, seed=2, samples=8)
    early = bayes.SGLD(mlp, step_size=1e-4, **common).fit(x, y, epochs=4)
    m = early.mixing(x)
    assert m["rhat_median"] > 1.1 and m["rhat_max"] >= m["rhat_median"]
    assert m["drift_median"] > 1.1 and m["drift_max"] >= m["drift_median"]
    assert m["values"] == x.shape[0] and m["samples_per_chain"] == 8
    assert bayes.SGLD(mlp, particles=1, samples=8).fit(x, y, epochs=2).mixing(x) is None
    # pSGLD holding its preconditioner needs a burn-in to adapt it first.
    with pytest.raises(Exception, match="hold_preconditioner needs burn_in_epochs, or cycle_epochs"):
        bayes.SGLD(mlp, preconditioned=True, hold_preconditioner=True)
    held = bayes.SGLD(mlp, preconditioned=True, hold_preconditioner=True, burn_in_epochs=2, **common)
    assert held.fit(x, y, epochs=4).predict(x).members.shape[0] == 3 * 8
