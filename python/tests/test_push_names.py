"""The names PusH programs import, beyond the entry points: push.lib.utils, push.bayes.utils,
push.bayes.ensemble's factories, and push.bayes.infer.Infer subclassed as PusH's README does."""
import torch
from torch.utils.data import DataLoader, TensorDataset

from push.bayes.ensemble import create_optimizer, mk_empty_scheduler, mk_optim, mk_scheduler
from push.bayes.infer import Infer
from push.bayes.utils import flatten, unflatten_like
from push.lib.utils import detach_to_cpu, detach_to_device, to_device


def test_push_lib_utils_move_nested_values():
    x = torch.ones(2, requires_grad=True) * 2
    value = {"a": [x, (x, 3)], "b": "text"}
    cpu = detach_to_cpu(value)
    assert not cpu["a"][0].requires_grad and not cpu["a"][1][0].requires_grad
    assert cpu["a"][1][1] == 3 and cpu["b"] == "text"
    assert torch.equal(cpu["a"][0], x.detach())
    leaf = detach_to_device("cpu", [x], requires_grad=True)[0]
    assert leaf.requires_grad and leaf.is_leaf
    assert to_device("cpu", (x,))[0].grad_fn is not None  # still in its graph


def test_push_bayes_utils_flatten_and_unflatten_like():
    tensors = [torch.arange(6.0).view(2, 3), torch.tensor([7.0])]
    flat = flatten(tensors)
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 7]
    back = unflatten_like(flat.view(1, -1), tensors)
    assert [b.shape for b in back] == [t.shape for t in tensors]
    assert all(torch.equal(b, t) for b, t in zip(back, tensors))


def test_the_ensemble_modules_factories():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert isinstance(mk_optim(params), torch.optim.Adam) and mk_optim(params).param_groups[0]["lr"] == 0.03
    assert create_optimizer(0.5)(params).param_groups[0]["lr"] == 0.5
    assert mk_empty_scheduler(mk_optim(params)) is None
    optim = mk_optim(params)
    mk_scheduler(optim).step()
    assert optim.param_groups[0]["lr"] == 0.03


class _Mean(Infer):
    """PusH's README recipe: a method as a subclass of push.bayes.infer.Infer."""

    def __init__(self, mk_nn, *args, num_devices=1, cache_size=4, view_size=4):
        super().__init__(mk_nn, *args, num_devices=num_devices, cache_size=cache_size, view_size=view_size)

    def bayes_infer(self, dataloader, epochs, num_particles=2):
        def train(particle, loader, epochs):
            for _ in range(epochs):
                for x, y in loader:
                    particle.step(torch.nn.functional.mse_loss, x, y).wait()

        pids = [self.push_dist.p_create(lambda ps: torch.optim.SGD(ps, lr=0.1), receive={"TRAIN": train})
                for _ in range(num_particles)]
        self.push_dist.p_wait([self.push_dist.p_launch(pid, "TRAIN", dataloader, epochs) for pid in pids])


def test_infer_is_pushs_base_class_to_subclass():
    torch.manual_seed(0)
    x = torch.randn(32, 2)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    with _Mean(torch.nn.Linear, 2, 1) as method:
        method.bayes_infer(loader, 3)
        params = method.p_parameters()
        assert len(params) == 2 and all(len(p) == 2 for p in params)
        # Trained: the weights moved from their initial values toward [1, 1].
        assert all((p[0] - torch.ones(1, 2)).abs().max() < 1.0 for p in params)
        var = method.get_var([[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 2.0])]])
        assert torch.equal(var[0], torch.tensor([2.0, 0.0]))
    base = Infer(torch.nn.Linear, 2, 1)
    try:
        try:
            base.bayes_infer(loader, 1)
            raise AssertionError("bayes_infer of the base class must raise")
        except NotImplementedError as e:
            assert "subclass" in str(e)
    finally:
        base.close()


class _DropNet(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a = torch.nn.Linear(1, width)
        self.drop = torch.nn.Dropout(0.2)
        self.b = torch.nn.Linear(width, 1)

    def forward(self, x):
        return self.b(self.drop(torch.tanh(self.a(x))))


def test_pushs_mc_dropout_trains_and_samples():
    from push.bayes import mc_dropout

    g = torch.Generator().manual_seed(1)
    x = torch.rand(64, 1, generator=g) * 4 - 2
    loader = DataLoader(TensorDataset(x, torch.sin(2 * x)), batch_size=16)
    with mc_dropout.train_mc_dropout(loader, torch.nn.MSELoss(), 3, _DropNet, 16, size_ensemble=2, patch=True,
                                     mk_optim=lambda ps: torch.optim.Adam(ps, lr=1e-2)) as model:
        assert len(model.losses) == 3 and all(loss == loss for loss in model.losses)
        assert len(model.push_dist.particle_ids()) == 2
        out = model.posterior_pred(x, num_samples=4, mode=["mean", "std", "pred"])
        assert out["pred"].shape == (64, 8, 1)  # 2 networks x 4 passes each
        assert torch.allclose(out["mean"], out["pred"].mean(dim=1))
        assert out["std"].mean() > 0  # dropout on: the passes differ
        frozen = model.posterior_pred(x, num_samples=2, mode="raw", freeze_on_eval=True)
        assert frozen.shape == (64, 4, 1)
        # One mask per feature for the whole batch: rows through the same mask agree with the
        # network's output for that mask, so two identical inputs give identical outputs.
        same = model.posterior_pred(torch.ones(2, 1), num_samples=1, mode="raw", freeze_on_eval=True)
        assert torch.equal(same[0], same[1])
