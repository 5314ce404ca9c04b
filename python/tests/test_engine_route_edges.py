"""Where PusH-form runs meet the engine's edges: programs the engine would run otherwise than
they say stay Python code (hooks, labels the loss refuses, an mk_optim that changes its
mind), a closed model neither answers nor trains, a failed run can run again, and a run
leaves the caller's random stream as the Python path does."""
import warnings

import pytest
import torch
from torch import nn

import push.bayes as bayes
import push.bayes.ensemble as ensemble
import push.bayes.stein_vgd as stein_vgd
import push.bayes.swag as swag
from conftest import MLP, regression_loader


def forward_hooked():
    net = MLP(4)
    net.b.register_forward_hook(lambda module, inputs, output: output * 3)
    return net


def pre_hooked():
    net = MLP(4)
    net.b.register_forward_pre_hook(lambda module, inputs: (inputs[0] * 2,))
    return net


def gradient_hooked():
    net = MLP(4)
    net.a.weight.register_hook(lambda g: g.clamp(-1e-3, 1e-3))
    return net


def weight_normed():
    net = MLP(4)
    net.a = nn.utils.weight_norm(net.a)
    return net


def each_model(make):
    """The three PusH-form classes on ``make`` with arguments for one short run each."""
    return [(ensemble.Ensemble(make), dict(num_ensembles=2), (1,)),
            (swag.MultiSWAG(make), dict(num_models=2), (1, 1)),
            (stein_vgd.SteinVGD(make), dict(num_particles=2), (1,))]


def test_hooks_keep_a_run_python_code():
    loader, _, _ = regression_loader(n=32, batch=16, shuffle=True)
    for make, why in ((forward_hooked, "forward hooks"), (pre_hooked, "forward pre hooks"),
                      (gradient_hooked, "gradient hooks"), (weight_normed, "forward pre hooks")):
        for model, kwargs, epochs in each_model(make):
            with model:
                assert why in bayes.explain(model, loader, **kwargs), (make.__name__, type(model).__name__)
        model, kwargs, epochs = each_model(make)[2]
        with model, pytest.warns(bayes.PythonPathWarning, match=why):
            model.bayes_infer(loader, *epochs, **kwargs)
            assert model._routed is None and len(model.p_parameters()) == 2


def test_labels_the_loss_would_refuse_stay_python_code():
    _, x, y = regression_loader(n=32, batch=16)
    doubles = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y.double()), batch_size=16, shuffle=True)
    ints = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (y > 0).int().view(-1)), batch_size=16,
                                       shuffle=True)
    two = lambda: nn.Sequential(nn.Linear(1, 4), nn.Tanh(), nn.Linear(4, 2))  # noqa: E731
    with ensemble.Ensemble(MLP, 4) as model:
        assert "the labels are torch.float64" in bayes.explain(model, doubles)
    with ensemble.Ensemble(two) as model:
        assert "int64 class indices" in bayes.explain(model, ints, loss_fn=nn.CrossEntropyLoss())


def test_an_mk_optim_of_other_settings_at_each_call_stays_python_code():
    loader, _, _ = regression_loader(n=32, batch=16, shuffle=True)
    rates = iter([0.2, 0.001] * 10)
    with swag.MultiSWAG(MLP, 4) as model:
        why = bayes.explain(model, loader, pretrain_epochs=1, mk_optim=lambda p: torch.optim.Adam(p, lr=next(rates)))
        assert "other settings at each call" in why


def test_a_closed_model_neither_answers_nor_trains():
    loader, x, _ = regression_loader(n=32, batch=16, shuffle=True)
    for engine in (None, False):
        for model, kwargs, epochs in each_model(lambda: MLP(4)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", bayes.PythonPathWarning)
                model.bayes_infer(loader, *epochs, engine=engine, **kwargs)
            assert (model._routed is not None) == (engine is None)
            model.close()
            model.close()  # twice: nothing more
            name = type(model).__name__
            for call in (lambda: model.posterior_pred(x), model.p_parameters,
                         lambda: model.bayes_infer(loader, *epochs, engine=engine, **kwargs)):
                with pytest.raises(ValueError, match="closed"):
                    call()
            assert model._routed is None, name


def test_a_failed_routed_run_can_run_again():
    loader, _, _ = regression_loader(n=32, batch=32, shuffle=True)
    with stein_vgd.SteinVGD(MLP, 4) as model:
        with pytest.raises(RuntimeError, match="non-finite"):
            model.bayes_infer(loader, 3, num_particles=2, lr=1e38)
        assert model._routed is None
        model.bayes_infer(loader, 3, num_particles=2, lr=1e-2)
        assert model._routed is not None and all(torch.isfinite(t).all() for p in model.p_parameters() for t in p)


def test_explain_names_a_misspelt_argument_and_a_bad_rate():
    loader, _, _ = regression_loader(n=32, batch=16, shuffle=True)
    with swag.MultiSWAG(MLP, 4) as model, pytest.raises(TypeError, match="MultiSWAG.bayes_infer .*'boostrap'"):
        bayes.explain(model, loader, pretrain_epochs=1, boostrap=True)
    with stein_vgd.SteinVGD(MLP, 4) as model:
        with pytest.raises(TypeError, match="SteinVGD.bayes_infer .*'lenghtscale'"):
            bayes.explain(model, loader, lenghtscale=1.0)
        assert "not positive" in bayes.explain(model, loader, lr=-1.0)
    with swag.MultiSWAG(MLP, 4) as model:
        assert "not a positive number" in bayes.explain(model, loader, pretrain_epochs=1, lr=-1.0)


def test_a_length_scale_out_of_range_is_named_on_both_paths():
    loader, _, _ = regression_loader(n=32, batch=16, shuffle=True)
    for lengthscale in (1e-170, 1e200):
        for engine in (None, False):
            with stein_vgd.SteinVGD(MLP, 4) as model, pytest.raises(ValueError, match="lengthscale .* out of range"):
                model.bayes_infer(loader, 1, num_particles=2, lengthscale=lengthscale, engine=engine)


def test_a_non_finite_svgd_update_stops_the_python_path():
    # A loss whose value is finite and whose gradient is not: only the update shows it.
    loader, _, _ = regression_loader(n=32, batch=32)

    def finite_value_nan_gradient(out, label):
        return nn.functional.mse_loss(out, label) + 0 * torch.sqrt(out - out).sum()

    with stein_vgd.SteinVGD(MLP, 4) as model, pytest.raises(RuntimeError, match="SVGD update of particle 0 is "
                                                                                 "non-finite in epoch 1"):
        model.bayes_infer(loader, 1, num_particles=2, loss_fn=finite_value_nan_gradient, engine=False)


@pytest.mark.parametrize("engine", [None, False])
def test_a_run_leaves_the_callers_random_stream_as_it_was(engine):
    loader, _, _ = regression_loader(n=32, batch=16, shuffle=True)
    torch.manual_seed(0)
    expected = torch.rand(3)
    for model, kwargs, epochs in each_model(lambda: MLP(4)):
        torch.manual_seed(0)
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore", bayes.PythonPathWarning)
            model.bayes_infer(loader, *epochs, engine=engine, **kwargs)
            assert torch.equal(torch.rand(3), expected), type(model).__name__
