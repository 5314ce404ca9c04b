"""An unchanged PusH program on push's C++ engine (push.bayes.engine_route): when it goes
there, that it computes what the engine computes, and why it stays Python code when not."""
import contextlib
import math
import warnings

import pytest
import torch
from torch import nn

import push.bayes as bayes
import push.bayes.ensemble as ensemble
from conftest import MLP, regression_loader
from push.bayes.as_sequential import as_sequential


def mlp_seq(width):
    # MLP(width) as a Sequential: the same layers made in the same order, so the same weights.
    return nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, 1))


@contextlib.contextmanager
def no_python_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error", bayes.PythonPathWarning)
        yield


def test_a_forward_that_is_a_chain_is_its_sequential():
    net = MLP(4)
    seq = as_sequential(net)
    assert [type(m) for m in seq] == [nn.Linear, nn.Tanh, nn.Linear]
    assert seq[0] is net.a and seq[2] is net.b  # the module's own layers, not copies

    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x):
            return nn.functional.relu(self.a(x)).sigmoid()

    assert [type(m) for m in as_sequential(Functional())] == [nn.Linear, nn.ReLU, nn.Sigmoid]

    class Residual(Functional):
        def forward(self, x):
            return x + self.a(x)

    class Twice(Functional):
        def forward(self, x):
            return self.a(torch.tanh(self.a(x)))

    assert "not a chain of layers" in as_sequential(Residual())
    assert "used twice" in as_sequential(Twice())


class Flattening(nn.Module):
    # A CNN's usual forward: one activation module reused, the features flattened by hand.
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.conv, self.act, self.a, self.b = nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Linear(8, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.act(self.conv(x))
        if self.how == "function":
            h = torch.flatten(h, 1)
        elif self.how == "method":
            h = h.flatten(1)
        elif self.how == "view":
            h = h.view(h.size(0), -1)
        elif self.how == "reshape":
            h = h.reshape(h.size(0), -1)
        elif self.how == "all":  # the batch dimension too: not a Flatten
            h = torch.flatten(h)
        else:
            h = h.view(-1, 8)
        return self.b(self.act(self.a(h)))


@pytest.mark.parametrize("how", ["function", "method", "view", "reshape"])
def test_a_flattening_and_a_reused_activation_are_layers_of_the_chain(how):
    net = Flattening(how)
    seq = as_sequential(net)
    assert [type(m) for m in seq] == [nn.Conv2d, nn.ReLU, nn.Flatten, nn.Linear, nn.ReLU, nn.Linear]
    assert seq[1] is net.act and seq[4] is net.act
    x = torch.randn(5, 1, 2, 2)
    assert torch.equal(seq(x), net(x))
    y = torch.randn(5, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=5, shuffle=True)
    with no_python_path(), ensemble.Ensemble(Flattening, how) as ens:
        ens.bayes_infer(loader, 2, num_ensembles=2)
        assert ens._routed is not None and ens.posterior_pred(x)["mean"].shape == (5, 1)


def test_other_reshapes_are_not_a_flatten():
    assert "call_function flatten is not a layer" in as_sequential(Flattening("all"))
    assert "takes other arguments" in as_sequential(Flattening("fixed"))


def test_the_push_form_run_trains_on_the_engine_as_the_engine_does():
    loader, x, y = regression_loader(n=128, batch=32, shuffle=True)
    with no_python_path():
        routed = ensemble.Ensemble(MLP, 8, seed=3).bayes_infer(loader, 6, num_ensembles=3)
    # The C++ path with the options the route maps PusH's run to: the same numbers.
    direct = bayes.Ensemble(lambda: mlp_seq(8), seed=3, particles=3, lr=0.01, batch_size=32, fuse=True,
                            noise_std=math.sqrt(0.5), prior_std=math.inf, devices=1, cache_size=4).fit(x, y, epochs=6)
    with routed, direct:
        assert routed._routed[0].fused  # the engine's particles, trained as one stack
        ours = routed.p_parameters()
        theirs = [[t for _, t in direct.particle_parameters(pid)] for pid in direct.particle_ids()]
        assert len(ours) == 3
        for a, b in zip(ours, theirs):
            assert all(torch.equal(u, v) for u, v in zip(a, b))
        # Losses are MSE's: the engine's Gaussian NLL at variance 1/2 less its constant.
        assert routed.losses == pytest.approx([v - 0.5 * math.log(math.pi) for v in direct.losses], abs=1e-6)
        pred = routed.posterior_pred(x, mode=["mean", "pred"])
        members = direct.predict(x).members.to(torch.float32)  # [particles, N, 1]
        assert torch.allclose(pred["pred"].transpose(0, 1), members, atol=1e-5)
        assert routed.losses[-1] < routed.losses[0]


def test_a_classifier_routes_with_cross_entropy():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 2, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)
    make = lambda: nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))  # noqa: E731
    with no_python_path(), ensemble.Ensemble(make, seed=1) as ens:
        ens.bayes_infer(loader, 30, loss_fn=nn.CrossEntropyLoss(), lr=0.05, num_ensembles=2)
        assert ens.losses[-1] < 0.5 * ens.losses[0]
        pred = ens.posterior_pred(x, f_reg=False, mode=["mean_prob", "mode", "logits"])
        assert pred["logits"].shape == (96, 2, 3)
        assert (pred["mode"] == y).float().mean() > 0.8
        assert torch.allclose(pred["mean_prob"].sum(1), torch.ones(96))


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(1, 1)

    def forward(self, x):
        return x + self.a(x)


class Items(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Frozen(MLP):
    def __init__(self, width):
        super().__init__(width)
        self.a.requires_grad_(False)


class Unused(MLP):
    def __init__(self, width):
        super().__init__(width)
        self.scale = nn.Parameter(torch.ones(1))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(1, 1), nn.Linear(1, 1)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class RandomDepth(MLP):
    def __init__(self, width):
        super().__init__(width)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.tanh(self.a(x))
        return self.b(torch.tanh(h) if self.calls % 2 else h)


def test_why_a_run_stays_python_code_is_said():
    loader, x, y = regression_loader(n=64, batch=32, shuffle=True)
    cases = [
        (MLP, (4,), dict(loss_fn=nn.L1Loss()), "the loss L1Loss"),
        (MLP, (4,), dict(loss_fn=lambda a, b: ((a - b) ** 2).mean()), "the loss <lambda>"),
        (MLP, (4,), dict(mk_optim=lambda p: torch.optim.SGD(p, lr=0.1)), "makes a SGD"),
        (MLP, (4,), dict(mk_optim=lambda p: torch.optim.Adam(p, lr=0.1, betas=(0.8, 0.99))), "other settings"),
        (MLP, (4,), dict(mk_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1)), "mk_scheduler"),
        (Residual, (), {}, "not a chain of layers"),
        (lambda: nn.Sequential(nn.Linear(1, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)), (), {}, "buffers"),
        (lambda: nn.Sequential(nn.Linear(1, 2)), (), {}, "labels' shape"),
        (MLP, (4,), dict(mk_optim=lambda p: torch.optim.Adam([{"params": p, "lr": 0.1}], lr=0.01)), None),
        (MLP, (4,), dict(mk_optim=lambda p: torch.optim.Adam([{"params": p, "eps": 1e-6}])), "other settings"),
        (Frozen, (4,), {}, "frozen parameters"),
        (Unused, (4,), {}, "does not use"),
        (Tied, (), {}, "tied weights"),
        (lambda: MLP(4).eval(), (), {}, "eval mode"),
        (RandomDepth, (4,), {}, "different chains"),
    ]
    for make, args, kwargs, why in cases:
        if why is None:  # a group's own rate is the rate: routed at 0.1, with its weight decay
            with ensemble.Ensemble(make, *args) as ens:
                assert ens._plan(loader, **kwargs).options["lr"] == 0.1
                decayed = dict(mk_optim=lambda p: torch.optim.Adam([{"params": p, "weight_decay": 0.1}]))
                assert ens._plan(loader, **decayed).options["weight_decay"] == 0.1
            continue
        with ensemble.Ensemble(make, *args) as ens:
            assert why in bayes.explain(ens, loader, **kwargs), why
            with pytest.warns(bayes.PythonPathWarning, match="trains as Python code") as caught:
                ens.bayes_infer(loader, 1, num_ensembles=2, **kwargs)
            assert caught[0].filename == __file__  # the user's line: shown once per place in the program
            assert len(ens.p_parameters()) == 2  # it trained, PusH's way
        with ensemble.Ensemble(make, *args) as ens, pytest.raises(ValueError, match="engine=True.*" + why[:8]):
            ens.bayes_infer(loader, 1, num_ensembles=2, engine=True, **kwargs)
    items = torch.utils.data.DataLoader(Items(x, y), batch_size=32)
    with ensemble.Ensemble(MLP, 4) as ens:
        assert "not a TensorDataset" in bayes.explain(ens, items)
        assert "the loss CrossEntropyLoss" in bayes.explain(ens, loader, loss_fn=nn.CrossEntropyLoss(ignore_index=0))
        assert "shuffle=False" in bayes.explain(ens, regression_loader(n=64, batch=32)[0])
        assert "prior=True" in bayes.explain(ens, loader, prior=True)
        assert "random_seed" in bayes.explain(ens, loader, random_seed=True)
        assert bayes.explain(ens, loader) == ""
        ens.bayes_infer(loader, 1, num_ensembles=2)
        assert "a second bayes_infer is refused" in bayes.explain(ens, loader)
    with ensemble.Ensemble(MLP, 4) as ens, no_python_path():
        ens.bayes_infer(loader, 1, num_ensembles=2)
        with pytest.raises(ValueError, match="trained on push's C.. engine.*make another Ensemble"):
            ens.bayes_infer(loader, 1, num_ensembles=2)
    with ensemble.Ensemble(MLP, 4) as ens, no_python_path():
        ens.bayes_infer(loader, 1, num_ensembles=2, engine=False)  # the Python path, asked for: no warning
        assert ens._routed is None and len(ens.push_dist.particle_ids()) == 2
    with ensemble.Ensemble(MLP, 4) as ens, pytest.raises(ValueError, match="engine must be"):
        ens.bayes_infer(loader, 1, engine="yes")
