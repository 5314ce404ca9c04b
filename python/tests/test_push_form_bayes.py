"""PusH's MultiSWAG and SVGD entry points, p_create's prior and train_key, as PusH calls them."""
import warnings

import pytest
import torch

import push
import push.bayes.ensemble as ensemble
import push.bayes.stein_vgd as stein_vgd
import push.bayes.swag as swag
from conftest import MLP, regression_loader
from push.bayes.particle_infer import bootstrap_loaders, combine


def test_train_mswag_as_pusH_calls_it():
    loader, x, y = regression_loader()
    with swag.train_mswag(loader, torch.nn.MSELoss(), 30, 6, MLP, 32, num_models=2, cov_mat_rank=4, lr=1e-2) as ms:
        assert len(ms.losses) == 36 and ms.losses[-1] < 0.05
        before = ms.p_parameters()
        pred = ms.posterior_pred(x, num_samples=8, mode=["mean", "std", "pred"])
        # Sampling puts each particle's weights back.
        assert all(torch.equal(a, b) for pa, pb in zip(before, ms.p_parameters()) for a, b in zip(pa, pb))
        assert pred["pred"].shape == (len(x), 2, 1)
        assert torch.nn.functional.mse_loss(pred["mean"], y).item() < 0.05
        assert (pred["std"] > 0).all()
        # Every sample differs: a second prediction is not the first.
        assert not torch.equal(ms.posterior_pred(x, num_samples=8)["mean"], pred["mean"])


def test_swag_moments_are_swag_s():
    # Three collections of known weights: mean, second moment and deviations as SWAG has them.
    weights = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 2.0]), torch.tensor([5.0, 8.0])]

    def run(p):
        for i, w in enumerate(weights):
            with torch.no_grad():
                p.module.weight.copy_(w.view(1, 2))
                p.module.bias.zero_()
            swag._swag_swag(p, i == 0, 2)
        return p.state[p.pid], p.state["n"]

    with push.PusH(torch.nn.Linear, 2, 1) as dist:
        pid = dist.p_create(None, receive={"RUN": run})
        moments, n = dist.p_launch(pid, "RUN").wait()
    w = torch.stack(weights)
    assert n == 3
    assert torch.allclose(moments["mom1"][0].view(-1), w.mean(0))
    assert torch.allclose(moments["mom2"][0].view(-1), (w * w).mean(0))
    # The last two deviations, each from the running mean that includes it.
    assert torch.allclose(moments["cov_mat_sqrt"][0], torch.stack([w[1] - w[:2].mean(0), w[2] - w.mean(0)]))


@pytest.mark.parametrize("shuffle", [False, True])  # Python code; push's C++ engine (push.bayes.engine_route)
def test_train_svgd_as_pusH_calls_it(shuffle):
    loader, x, y = regression_loader(shuffle=shuffle)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if not shuffle else "error", push.bayes.PythonPathWarning)
        sv = stein_vgd.train_svgd(loader, torch.nn.MSELoss(), 60, 4, MLP, 16, lengthscale=1.0, lr=0.3)
    with sv:
        assert (sv._routed is not None) == shuffle
        assert len(sv.losses) == 60 and sv.losses[-1] < 0.2 * sv.losses[0]
        pred = sv.posterior_pred(x, mode=["mean", "std"])
        assert torch.nn.functional.mse_loss(pred["mean"], y).item() < 0.05
        assert (pred["std"] > 0).all()


def test_svgd_update_is_liu_and_wangs():
    # The vectorised update against SVGD written out with PusH's kernel functions:
    # phi_i = 1/n sum_j k(p_j, p_i) grad_j - grad_{p_j} k(p_j, p_i).
    g = torch.Generator().manual_seed(0)
    params, grads = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g,
                                                                                      dtype=torch.float64)
    expected = torch.stack([
        sum(stein_vgd.torch_squared_exp_kernel(params[j], params[i], 1.3) * grads[j]
            - stein_vgd.torch_squared_exp_kernel_grad(params[j], params[i], 1.3) for j in range(5)) / 5
        for i in range(5)])
    assert torch.allclose(stein_vgd.svgd_updates(params, grads, 1.3), expected)


def test_svgd_particles_repel_each_other():
    # A loss without gradient leaves only the kernel's term: the particles must move apart.
    loader, _, _ = regression_loader(n=32, batch=32)

    def flat(run):
        return torch.stack([torch.cat([t.view(-1) for t in p]) for p in run.p_parameters()])

    with stein_vgd.SteinVGD(torch.nn.Linear, 1, 1) as sv:
        no_gradient = lambda out, label: (out * 0).sum()  # noqa: E731
        sv.bayes_infer(loader, 0, num_particles=3, loss_fn=no_gradient)
        start = torch.pdist(flat(sv))
        sv.push_dist.p_launch(0, "SVGD_LEADER", None, no_gradient, 1.0, 0.5, loader, 5).wait()
        assert (torch.pdist(flat(sv)) > start).all()


def test_prior_trains_only_the_trainable_part():
    # PusH's randomized-prior form: init_weights applied throughout, the optimizer over
    # `trainable` alone; the prior network stays as it was made.
    class WithPrior(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.trainable = torch.nn.Linear(2, 1)
            self.trainable.init_weights = self.init_weights
            self.prior = torch.nn.Linear(2, 1)

        @staticmethod
        def init_weights(m):
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.constant_(m.bias, 0.25)

        def forward(self, x):
            return self.trainable(x) + self.prior(x).detach()

    def train(p, x, y):
        for _ in range(5):
            p.step(torch.nn.functional.mse_loss, x, y).wait()

    with push.PusH(WithPrior) as dist:
        pid = dist.p_create(lambda ps: torch.optim.SGD(ps, lr=0.1), None, True, receive={"TRAIN": train})
        start = dict(dist.p_named_parameters(pid))
        assert start["prior.bias"].item() == 0.25 and start["trainable.bias"].item() == 0.25
        x = torch.randn(16, 2)
        dist.p_launch(pid, "TRAIN", x, x.sum(1, keepdim=True)).wait()
        end = dict(dist.p_named_parameters(pid))
    assert torch.equal(end["prior.weight"], start["prior.weight"]) and torch.equal(end["prior.bias"],
                                                                                    start["prior.bias"])
    assert not torch.equal(end["trainable.weight"], start["trainable.weight"])


def test_train_key_seeds_the_module():
    with push.PusH(torch.nn.Linear, 4, 2) as dist:
        a = dist.p_create(None, None, False, 123)
        b = dist.p_create(None, train_key=123)
        c = dist.p_create(None)  # -1, PusH's default: the particle's own seed
        assert torch.equal(dist.p_parameters(a)[0], dist.p_parameters(b)[0])
        assert not torch.equal(dist.p_parameters(a)[0], dist.p_parameters(c)[0])
        torch.manual_seed(123)
        assert torch.equal(torch.nn.Linear(4, 2).weight.detach(), dist.p_parameters(a)[0])


def test_classification_modes():
    logits = [torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.0], [3.0, 0.0]]),
              torch.tensor([[0.0, 5.0], [0.0, 2.0]])]
    out = combine(logits, False, ["mode", "mean_prob", "prob", "logits", "mean", "std"])
    assert out["mode"].tolist() == [0, 1]
    probs = torch.stack([t.softmax(-1) for t in logits], dim=1)
    assert torch.allclose(out["prob"], probs) and torch.allclose(out["mean_prob"], probs.mean(1))
    assert torch.equal(out["mean"], out["mean_prob"]) and torch.allclose(out["std"], probs.std(1))
    assert out["logits"].shape == (2, 3, 2)


def test_bad_arguments_are_named():
    loader, x, _ = regression_loader(n=16)
    with pytest.raises(ValueError, match="num_models must be an int >= 1"):
        swag.train_mswag(loader, torch.nn.MSELoss(), 1, 1, MLP, 4, num_models=0)
    with pytest.raises(ValueError, match="mswag_state may not hold 'n'"):
        swag.train_mswag(loader, torch.nn.MSELoss(), 1, 1, MLP, 4, mswag_state={"n": 3})
    with pytest.raises(ValueError, match="lengthscale must be a finite positive number"):
        stein_vgd.train_svgd(loader, torch.nn.MSELoss(), 1, 2, MLP, 4, lengthscale=0)
    with stein_vgd.SteinVGD(MLP, 4) as sv:
        with pytest.raises(ValueError, match="bootstrap is not defined for SVGD"):
            sv.bayes_infer(loader, 1, bootstrap=True, num_particles=2)
    with swag.train_mswag(loader, torch.nn.MSELoss(), 1, 1, MLP, 4) as ms:
        with pytest.raises(ValueError, match=r"prediction mode 'mode' is not one of \['mean'"):
            ms.posterior_pred(x, mode=["mode"])
        with pytest.raises(ValueError, match="predictions need a tensor or a DataLoader"):
            ms.posterior_pred([1, 2])
        with pytest.raises(ValueError, match="num_samples must be an int >= 1"):
            ms.posterior_pred(x, num_samples=0)


def test_swag_samples_repeat_on_several_lanes():
    # Particles on two lanes draw at once: each from a generator of its own.
    loader, x, _ = regression_loader(n=64)

    def run():
        with swag.train_mswag(loader, torch.nn.MSELoss(), 2, 3, MLP, 8, num_models=4, num_devices=2, seed=5,
                              cov_mat_rank=3) as ms:
            first = ms.posterior_pred(x, num_samples=5, mode=["pred"])["pred"]
            return first, ms.posterior_pred(x, num_samples=5, mode=["pred"])["pred"]

    a, b = run(), run()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], a[1])  # a second call draws new samples


def test_svgd_update_is_exact_for_many_close_particles():
    # Past 25 rows cdist's default is a matrix product that cancels between close points.
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 20000, generator=g)
    params = base + 1e-3 * torch.randn(30, 20000, generator=g)
    grads = torch.randn(30, 20000, generator=g)
    exact = stein_vgd.svgd_updates(params.double(), grads.double(), 0.2)
    assert torch.allclose(stein_vgd.svgd_updates(params, grads, 0.2).double(), exact, rtol=1e-4, atol=1e-5)


def test_a_dataloader_without_pairs_or_batches_is_named():
    x = torch.randn(8, 1)
    empty = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:0], x[:0]), batch_size=4)
    singles = torch.utils.data.DataLoader(x, batch_size=4)
    for loader, why in ((empty, "gave no batch"), (singles, "must give \\(data, label\\) batches, got a Tensor")):
        with pytest.raises(ValueError, match=why):
            ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 1, MLP, 4)
        with pytest.raises(ValueError, match=why):
            swag.train_mswag(loader, torch.nn.MSELoss(), 1, 1, MLP, 4)
        with pytest.raises(ValueError, match=why):
            stein_vgd.train_svgd(loader, torch.nn.MSELoss(), 1, 2, MLP, 4)


def test_bootstrap_resamples_differ_between_members():
    loader, _, _ = regression_loader(n=64, batch=16)
    loaders = bootstrap_loaders(loader, 3, seed=0)
    xs = [torch.cat([b[0] for b in ld]).sort(dim=0).values for ld in loaders]
    assert all(len(t) == 64 for t in xs)
    assert not torch.equal(xs[0], xs[1]) and not torch.equal(xs[1], xs[2])
    again = [torch.cat([b[0] for b in ld]).sort(dim=0).values for ld in bootstrap_loaders(loader, 3, seed=0)]
    assert all(torch.equal(a, b) for a, b in zip(xs, again))


def test_pusH_s_entry_and_f_save(tmp_path, monkeypatch):
    loader, _, _ = regression_loader(n=32)
    seen = []

    def entry(particle, dataloader, loss_fn, epochs, bootstrap):  # PusH's form: bootstrap always passed
        seen.append(bootstrap)
        return ensemble._deep_ensemble_main(particle, dataloader, loss_fn, epochs, bootstrap)

    monkeypatch.chdir(tmp_path)
    with ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 1, MLP, 4, ensemble_entry=entry) as ens:
        ens.bayes_infer(loader, 1, f_save=True)  # two more particles, saved where PusH saved them
    assert seen == [False] and (tmp_path / "particles").is_dir()
    with pytest.raises(TypeError, match="f_save must be a bool or a folder, got int"):
        swag.train_mswag(loader, torch.nn.MSELoss(), 1, 1, MLP, 4, f_save=3)


def test_classes_are_dimension_one():
    # Outputs [N, classes, positions]: probabilities over dimension 1, as PusH's softmax(dim=1).
    logits = [torch.randn(5, 3, 4), torch.randn(5, 3, 4)]
    out = combine(logits, False, ["mean_prob", "mode"])
    assert torch.allclose(out["mean_prob"].sum(1), torch.ones(5, 4))
    assert out["mode"].shape == (5, 4)


def test_numbers_are_checked():
    loader, x, _ = regression_loader(n=16)
    with pytest.raises(ValueError, match="lr must be a finite positive number, got inf"):
        ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 1, MLP, 4, lr=float("inf"))
    with pytest.raises(ValueError, match="seed must be an int in \\[0, 2\\*\\*63\\)"):
        ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 1, MLP, 4, seed=-1)
    with swag.train_mswag(loader, torch.nn.MSELoss(), 1, 1, MLP, 4) as ms:
        with pytest.raises(ValueError, match="var_clamp must be a finite non-negative number"):
            ms.posterior_pred(x, var_clamp=-1.0)
    with swag.MultiSWAG(MLP, 4) as ms:
        with pytest.raises(ValueError, match="no particles yet: bayes_infer trains them first"):
            ms.posterior_pred(x)


def test_numpy_numbers_are_numbers():
    np = pytest.importorskip("numpy")  # Debian's python3-torch has it; the 2.x wheel does not need it
    loader, _, _ = regression_loader(n=16)
    with ensemble.train_deep_ensemble(loader, torch.nn.MSELoss(), 1, MLP, 4, lr=np.float32(0.01)) as ens:
        assert len(ens.losses) == 1


def test_swag_samples_follow_swag_s_formula():
    # Known moments in a particle's state; the predictions of a linear module are its sampled
    # weights (input 1): their covariance must be scale (diag(var) + D^T D / (K - 1)) / 2.
    def run(p, n):
        with torch.no_grad():
            p.module.weight.zero_()
        mean = [torch.tensor([[1.0, -2.0]]), torch.tensor([0.5])]
        var = torch.tensor([0.3, 0.1, 0.2])
        rows = torch.tensor([[1.0, 0.5, 0.0], [-1.0, 0.5, 0.2], [0.0, -1.0, 0.4]])  # K = 3 deviations
        p.state[p.pid] = {"mom1": mean, "mom2": [mean[0] ** 2 + var[:2].view(1, 2), mean[1] ** 2 + var[2:]],
                          "cov_mat_sqrt": [rows[:, :2], rows[:, 2:]]}
        eye = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # rows: w0, w1, the bias alone
        outs = [swag._mswag_pred(p, eye, 0.5, 1e-30, 1, True, seed) for seed in range(n)]
        return torch.stack([o[:, 0] for o in outs]), var, rows

    with push.PusH(torch.nn.Linear, 2, 1) as dist:
        pid = dist.p_create(None, receive={"RUN": run})
        samples, var, rows = dist.p_launch(pid, "RUN", 4000).wait()
    # Output j = w . e_j + b: recover the weights and the bias.
    b = samples[:, 2]
    theta = torch.stack([samples[:, 0] - b, samples[:, 1] - b, b], dim=1)
    expected = 0.5 * (torch.diag(var) + rows.t() @ rows / 2) / 2
    assert torch.allclose(theta.mean(0), torch.tensor([1.0, -2.0, 0.5]), atol=0.05)
    assert torch.allclose(torch.cov(theta.t()), expected, atol=0.03), (torch.cov(theta.t()), expected)


def test_seeds_come_from_the_one_cpp_mixer():
    # PusH-form draws (bootstrap resamples, SWAG samples) are seeded by push::mix_seed, the
    # C++ mixer every other seed of push comes from; here against its definition, written
    # out again (push/core/seed.h).
    from push import _push
    from push.bayes.particle_infer import mix

    def reference(*values):
        m = (1 << 64) - 1
        h = 0x9E3779B97F4A7C15
        for v in values:
            h ^= (v + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2)) & m
            h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & m
            h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & m
            h ^= h >> 31
        return h

    for values in [(), (0,), (7, 3), (3, 7), (2**63, 1, 2), (2**64 - 1,)]:
        assert _push.mix_seed(list(values)) == reference(*values)
        assert mix(*values) == reference(*values)
    assert mix(7, 3) != mix(3, 7)
    with pytest.raises(TypeError):
        mix(-1)


def test_one_class_per_algorithm_trains_either_way_from_one_seed():
    # push.bayes.Ensemble is PusH's push.bayes.ensemble.Ensemble (and MultiSWAG likewise):
    # bayes_infer trains PusH's way, fit push's C++ way, and both make each particle under
    # the seed push's mixer draws from the one seed, so their particles start equal.
    assert push.bayes.Ensemble is ensemble.Ensemble
    assert push.bayes.MultiSWAG is swag.MultiSWAG
    loader, x, y = regression_loader(n=32)
    seq = lambda: torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))  # noqa: E731
    for cls in (push.bayes.Ensemble, push.bayes.MultiSWAG):
        with cls(seq, seed=5, particles=3) as model:
            model.fit(x, y, epochs=0)
            cpp = [[t for _, t in model.particle_parameters(pid)] for pid in model.particle_ids()]
        with cls(seq, seed=5) as model:
            if cls is push.bayes.Ensemble:
                model.bayes_infer(loader, 0, num_ensembles=3)
            else:
                model.bayes_infer(loader, 0, 0, num_models=3)
            python = model.p_parameters()
        assert len(cpp) == len(python) == 3
        for a, b in zip(cpp, python):
            assert all(torch.equal(u, v) for u, v in zip(a, b)), cls.__name__
    # losses are the latest run's; a module fit cannot rebuild trains PusH's way.
    with push.bayes.Ensemble(MLP, 8, seed=1) as model:
        model.bayes_infer(loader, 2, num_ensembles=2)
        assert len(model.losses) == 2
        with pytest.raises(ValueError, match="cannot train this model in C.*bayes_infer"):
            model.fit(x, y, epochs=1)
    with push.bayes.Ensemble(seq, seed=1, particles=2) as model:
        model.fit(x, y, epochs=3)
        assert len(model.losses) == 3
        model.bayes_infer(loader, 1, num_ensembles=2)
        assert len(model.losses) == 1
        model.fit(x, y, epochs=1)
        assert len(model.losses) == 4
