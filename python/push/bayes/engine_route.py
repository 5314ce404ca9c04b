"""When PusH's ``bayes_infer`` trains on push's C++ engine instead of as Python handlers.

An unchanged PusH program calls ``Ensemble.bayes_infer`` (``train_deep_ensemble``),
``MultiSWAG.bayes_infer`` (``train_mswag``) or ``SteinVGD.bayes_infer`` (``train_svgd``)
with a DataLoader, a loss and a module factory. When the run means what the engine computes, it trains there, fused, without the
GIL:
- the module is a chain of standard layers (push.bayes.as_sequential) without buffers;
- the loss is torch.nn.MSELoss or CrossEntropyLoss with mean reduction (or F.mse_loss,
  F.cross_entropy). MSE over o outputs is the engine's Gaussian likelihood at noise
  variance o / 2 less its constant, so the gradients are MSE's and the losses reported are
  MSE's; cross entropy is the categorical likelihood. No weight prior (prior_std infinite);
- the optimizer is Adam with torch's defaults but the rate and weight decay (PusH's, or
  mk_optim's; MultiSWAG's Adam decays at lr / 1000, PusH's create_optimizer). SVGD's
  moves each particle by -lr times its update (plain SGD on the engine), with the kernel
  exp(-|d|^2 / (2 lengthscale^2)) (the engine's bandwidth 2 lengthscale^2) and the
  gradient of the batch's mean loss (likelihood_weight 1);
- the scheduler leaves the rate as it is (PusH's default, mk_empty_scheduler or None);
- the data is a TensorDataset of (x, y) reshuffled each epoch (shuffle=True), batches of a
  fixed size, the last one kept; the engine reshuffles for each member on its own;
- every parameter trains (none frozen, none unused by forward, none shared between
  layers), no module or parameter has hooks, and the module is made in training mode;
- the labels are what the loss takes from the model: for MSE of the model's dtype, for
  cross entropy int64 class indices;
- PusH's own training loop (no ensemble_entry, ensemble_state, mswag_entry, mswag_state,
  svgd_entry, svgd_state, prior, random_seed or f_save), on a model that has not trained
  yet.
Otherwise the run trains as Python code on push's particles, as PusH does, and ``explain``
(or the one warning) says why.
"""

import inspect
import math
import os
import sys
import warnings
from typing import Callable, Optional, Tuple, Union

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, TensorDataset

from push.bayes.as_sequential import as_sequential
from push.bayes.models import rebuild_blocker
from push.push import torch_threads_per_lane

_F = torch.nn.functional


class PythonPathWarning(UserWarning):
    """A PusH-form run that trains as Python code although engine=None let it go to C++."""


class Route:
    """What the engine trains for one bayes_infer: its options, data and factory."""

    __slots__ = ("options", "x", "y", "num_classes", "factory", "loss_offset", "names")

    def __init__(self, options: dict, x, y, num_classes: Optional[int], factory: Callable, loss_offset: float,
                 names: list):
        self.options, self.x, self.y, self.num_classes, self.factory = options, x, y, num_classes, factory
        self.loss_offset = loss_offset  # subtracted from the engine's losses: MSE's own figures
        self.names = names  # the user's module's parameter names, in the engine's order


def _loss(loss_fn) -> Tuple[Optional[str], str]:
    if loss_fn is _F.mse_loss or (type(loss_fn) is torch.nn.MSELoss and loss_fn.reduction == "mean"):
        return "mse", ""
    if loss_fn is _F.cross_entropy or (type(loss_fn) is torch.nn.CrossEntropyLoss and loss_fn.reduction == "mean"
                                       and loss_fn.weight is None and loss_fn.ignore_index < 0
                                       and getattr(loss_fn, "label_smoothing", 0.0) == 0.0):
        return "cross_entropy", ""
    name = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    return None, (f"the loss {name} is not one the engine has (torch.nn.MSELoss or CrossEntropyLoss with mean "
                  "reduction and no class weights, ignored class or smoothing, F.mse_loss, F.cross_entropy)")


def adam_steps(mk_optim: Optional[Callable], lr: float, weight_decay: float = 0.0) -> Union[dict, str]:
    """The engine's options for PusH's Adam at ``lr`` (and ``weight_decay``), or for the
    Adam ``mk_optim`` makes; or why the engine cannot step as it does."""
    if mk_optim is None:
        if not (math.isfinite(lr) and lr > 0 and math.isfinite(weight_decay) and weight_decay >= 0):
            return "lr is not a positive number"
        return dict(lr=float(lr), weight_decay=float(weight_decay))
    try:  # asked twice: one that makes another optimizer for each particle cannot be one setting
        optim, again = (mk_optim([torch.nn.Parameter(torch.zeros(1))]) for _ in range(2))
    except Exception as e:  # noqa: BLE001 - a factory that wants a real module is a reason
        return f"mk_optim could not be asked which optimizer it makes ({type(e).__name__}: {e})"
    if type(optim) is not torch.optim.Adam:
        return f"mk_optim makes a {type(optim).__name__}; the engine trains with Adam"
    if len(optim.param_groups) != 1:
        return "mk_optim's Adam has several parameter groups"
    g = optim.param_groups[0]  # what the parameters train with (a group's own settings win over the defaults)
    if type(again) is not type(optim) or len(again.param_groups) != 1 or any(
            again.param_groups[0].get(k) != v for k, v in g.items() if k != "params"):
        return "mk_optim makes an optimizer of other settings at each call (the engine trains one setting)"
    plain = (tuple(g.get("betas", ())) == (0.9, 0.999) and g.get("eps") == 1e-8 and g.get("weight_decay", 0) >= 0
             and not g.get("amsgrad") and not g.get("maximize", False) and g.get("lr", 0) > 0)
    if not plain:
        return "mk_optim's Adam has other settings than torch's defaults (betas, eps, amsgrad, maximize)"
    return dict(lr=float(g["lr"]), weight_decay=float(g.get("weight_decay", 0)))


def sgd_steps(lr: float, lengthscale: float) -> Union[dict, str]:
    """The engine's options for SteinVGD's PusH form: plain SGD at ``lr`` on SVGD's update,
    the kernel exp(-|d|^2 / (2 lengthscale^2)); or why not."""
    bandwidth = 2.0 * float(lengthscale) * float(lengthscale)
    if not (math.isfinite(bandwidth) and bandwidth > 0 and math.isfinite(lr) and lr > 0):
        return "lengthscale and lr are not positive numbers whose squares are finite and not 0"
    return dict(lr=float(lr), optimizer="sgd", bandwidth=bandwidth, likelihood_weight=1.0)


def _data(dataloader) -> Tuple[Optional[tuple], str]:
    if not isinstance(dataloader, DataLoader):
        return None, f"the data is a {type(dataloader).__name__}, not a DataLoader"
    ds = dataloader.dataset
    if type(ds) is not TensorDataset or len(ds.tensors) != 2:
        return None, ("the DataLoader's dataset is not a TensorDataset of (x, y) (a dataset that makes its items, "
                      "with random augmentation say, would be frozen by reading it once)")
    if dataloader.batch_size is None or dataloader.drop_last:
        return None, "the DataLoader has a batch sampler or drops its last batch"
    sampler = dataloader.sampler
    if type(sampler) is SequentialSampler:
        return None, "the DataLoader reads the data in one fixed order (shuffle=False); the engine reshuffles it"
    plain = type(sampler) is RandomSampler and not sampler.replacement and sampler.num_samples == len(ds)
    if not plain or dataloader.collate_fn is not torch.utils.data.default_collate:
        return None, "the DataLoader has its own sampler or collate_fn"
    x, y = ds.tensors
    if not torch.is_floating_point(x) or len(x) == 0:
        return None, "the inputs are not a non-empty floating-point tensor"
    return (x, y, dataloader.batch_size), ""


def _same_parameters(module: torch.nn.Module, seq: torch.nn.Sequential) -> str:
    """Why the chain would not train exactly the module's parameters, or ""."""
    layers = [id(p) for layer in seq for p in layer.parameters()]
    if len(layers) != len(set(layers)):
        return "shares a parameter between layers (tied weights), which the engine would train apart"
    if set(layers) != {id(p) for p in module.parameters()}:
        return "has parameters its forward does not use"
    return ""


def _hooks(module: torch.nn.Module) -> str:
    """Why hooks would make the module compute other than its chain of layers, or ""."""
    for m in module.modules():
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if getattr(m, kind, None):
                return f"has {kind.strip('_').replace('_', ' ')} (weight_norm's, say), which the engine would not run"
    if any(getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None)
           for p in module.parameters()):
        return "has gradient hooks on its parameters, which the engine would not run"
    functions = torch.nn.modules.module
    if any(getattr(functions, g, None) for g in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                                 "_global_backward_hooks", "_global_backward_pre_hooks")):
        return "runs under global module hooks, which the engine would not run"
    return ""


def _factory(mk_nn: Callable, args: tuple) -> Callable:
    def make():
        seq = as_sequential(mk_nn(*args))
        if isinstance(seq, str):  # the probe's chain was checked: a factory that changes its mind
            raise ValueError(f"push.bayes: {seq}")
        return seq
    return make


def plan(mk_nn: Callable, args: tuple, dataloader, loss_fn, steps: Union[dict, str], scheduler_is_neutral: bool,
         python_only: str, options: dict) -> Union[Route, str]:
    """The engine's run for this bayes_infer, or why it trains as Python code.
    ``steps``: the engine's optimizer options (adam_steps, sgd_steps) or why it cannot
    step as the program does; ``python_only`` names an argument that needs PusH's loop (""
    when none does); ``options``: the algorithm's engine options (particles, seed,
    devices, ...)."""
    if python_only:
        return python_only
    if not scheduler_is_neutral:
        return "mk_scheduler changes the rate (the engine's own schedule is cosine_epochs)"
    kind, why = _loss(loss_fn)
    if why:
        return why
    if isinstance(steps, str):
        return steps
    data, why = _data(dataloader)
    if why:
        return why
    x, y, batch_size = data
    with torch.random.fork_rng(devices=[]):  # a probe, without touching the caller's random stream
        probe = mk_nn(*args)
    if not isinstance(probe, torch.nn.Module):
        return f"the factory made a {type(probe).__name__}, not a torch.nn.Module"
    name = type(probe).__name__
    if any(True for _ in probe.buffers()):
        return f"{name} has buffers (BatchNorm's statistics, say), which PusH's form keeps per particle"
    if not all(p.requires_grad for p in probe.parameters()):
        return f"{name} has frozen parameters (requires_grad=False); the engine trains every parameter"
    if not all(m.training for m in probe.modules()):
        return f"{name} is made in eval mode; the engine trains in training mode"
    why = _hooks(probe)
    if why:
        return f"{name} {why}"
    seq = as_sequential(probe)
    if isinstance(seq, str):
        return seq
    why = _same_parameters(probe, seq)
    if why:
        return f"{name} {why}"
    why = rebuild_blocker(seq)
    if why:
        return why
    with torch.no_grad():
        try:
            out = probe(x[:1])
        except Exception as e:  # noqa: BLE001 - the run itself would raise it; say so
            return f"the model does not take the data ({type(e).__name__}: {e})"
    if kind == "mse":
        if not torch.is_floating_point(y) or y.dim() != 2 or out.shape[1:] != y.shape[1:]:
            return (f"the labels' shape {list(y.shape)} is not [N, outputs] with the model's {list(out.shape[1:])} "
                    "outputs (MSELoss would broadcast them)")
        if y.dtype != out.dtype:
            return f"the labels are {y.dtype}, the model's outputs {out.dtype} (MSELoss would refuse them)"
        outputs = y.shape[1]
        noise_std = math.sqrt(outputs / 2)
        offset = outputs * (math.log(noise_std) + 0.5 * math.log(2 * math.pi))
        likelihood = dict(likelihood="gaussian", noise_std=noise_std)
        num_classes = None
    else:
        if y.dtype != torch.int64 or y.dim() != 1 or out.dim() != 2 or (len(y) and (y.min() < 0 or
                                                                                     y.max() >= out.shape[1])):
            return "the labels are not int64 class indices [N] below the model's outputs [N, classes]"
        offset = 0.0
        likelihood = dict(likelihood="categorical")
        num_classes = out.shape[1]
    order = {id(p): n for n, p in probe.named_parameters()}
    names = [order[id(p)] for p in seq.parameters()]
    engine_options = dict(options, batch_size=batch_size, prior_std=math.inf, fuse=True, **likelihood, **steps)
    return Route(engine_options, x, y, num_classes, _factory(mk_nn, args), offset, names)


def lanes(devices: int, cache_size: int, particles: int) -> dict:
    """The engine's lanes for PusH's ``num_devices`` and ``cache_size``: on GPUs those; on
    CPU lanes every particle resident (PusH's cache bounds GPU memory; on the CPU a swap
    would copy within the same memory). The intra-op threads as push.PusH's."""
    options = dict(devices=devices, cache_size=cache_size if torch.cuda.is_available() else max(cache_size, particles))
    threads = torch_threads_per_lane(devices, None)
    if threads is not None:
        options["intra_op_threads"] = threads
    return options


def decide(engine: Optional[bool], route: Union[Route, str], where: str) -> Optional[Route]:
    """The route to take under bayes_infer's ``engine`` (None: when it can, True: must, False: never)."""
    if engine is False:
        return None
    if isinstance(route, Route):
        return route
    if engine is True:
        raise ValueError(f"{where}: engine=True, but this run cannot train in C++: {route}")
    warnings.warn(f"{where}: trains as Python code, not on push's C++ engine: {route} "
                  "(push.bayes.explain says this; engine=False keeps the Python path without it)",
                  PythonPathWarning, stacklevel=_callers_level())
    return None


def _callers_level() -> int:
    """The stack level of the first frame outside the push package: the user's call, so
    that the warning shows once per place in the user's program."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def explain(model, dataloader, **bayes_infer_args) -> str:
    """Why ``model.bayes_infer(dataloader, epochs, **bayes_infer_args)`` would train as Python
    code instead of on push's C++ engine; "" when it would train on the engine."""
    bayes_infer_args.pop("epochs", None)
    bayes_infer_args.pop("engine", None)
    plan_of = getattr(model, "_plan", None)
    if plan_of is None:
        return (f"{type(model).__name__}.bayes_infer trains as Python code (only Ensemble's, MultiSWAG's and "
                "SteinVGD's go to the engine)")
    # The arguments bayes_infer takes (another is its TypeError), passed on where the plan reads them.
    wrong = [name for name in bayes_infer_args if name not in inspect.signature(model.bayes_infer).parameters]
    if wrong:
        raise TypeError(f"{type(model).__name__}.bayes_infer got an unexpected keyword argument {wrong[0]!r}")
    read = inspect.signature(plan_of).parameters
    route = plan_of(dataloader, **{k: v for k, v in bayes_infer_args.items() if k in read})
    return "" if isinstance(route, Route) else route
