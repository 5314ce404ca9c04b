"""What PusH's Bayesian entry points share: the distribution they train on, predictions
gathered from every particle, bootstrap resamples and argument checks.

PusH's ``push.bayes.infer.Infer`` is the class ``Infer`` here (push.bayes.infer re-exports it;
push's C++ algorithms are push.bayes.models): ``push_dist``, ``num_devices``, ``p_parameters``,
``bayes_infer`` and ``posterior_pred`` for a subclass to define, ``get_var``.
"""

import math
import numbers
import os
from typing import Callable, Dict, Iterator, List, Sequence

import torch
from torch.utils.data import DataLoader, TensorDataset

import push
from push import _push

_REGRESSION_MODES = ("mean", "median", "min", "max", "std", "pred")
_CLASSIFICATION_MODES = ("logits", "prob", "mean_prob", "mode", "std", "mean")


def check_int(where: str, name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def check_number(where: str, name: str, value, positive: bool = True) -> float:
    """A finite real number (numpy's too), positive unless ``positive`` is False (then >= 0)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok or (positive and value <= 0) or (not positive and value < 0):
        raise ValueError(f"{where}: {name} must be a finite {'positive' if positive else 'non-negative'} number, "
                         f"got {value!r}")
    return float(value)


def check_seed(where: str, seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"{where}: seed must be an int in [0, 2**63), got {seed!r}")
    return seed


def check_folder(where: str, f_save):
    """PusH's f_save: False/None (no save), True (PusH's "particles" folder) or a folder."""
    if f_save is None or f_save is False:
        return None
    if f_save is True:
        return "particles"
    if isinstance(f_save, (str, os.PathLike)):
        return f_save
    raise TypeError(f"{where}: f_save must be a bool or a folder, got {type(f_save).__name__}")


def mix(*parts: int) -> int:
    """A seed from several non-negative integers, for generators of their own: push's one
    mixer (push::mix_seed, C++), so Python and C++ derive seeds alike."""
    return _push.mix_seed([int(p) for p in parts])


def adam(lr: float, weight_decay: float = 0.0) -> Callable:
    """PusH's create_optimizer(lr): Adam at ``lr``."""
    return lambda params: torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


def constant_scheduler(optim):
    """PusH's default mk_scheduler: LinearLR from 1.0 to 1.0, which leaves lr as it is."""
    return torch.optim.lr_scheduler.LinearLR(optim, start_factor=1.0, end_factor=1.0, total_iters=1)


def batches_of(dataloader, where: str = "push.bayes") -> Iterator[tuple]:
    """The (data, label) batches of one epoch of ``dataloader``; a batch of another form, or
    an epoch without a batch, raises ValueError naming it."""
    empty = True
    for batch in dataloader:
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise ValueError(f"{where}: the DataLoader must give (data, label) batches, got a "
                             f"{type(batch).__name__}" + (f" of {len(batch)}" if isinstance(batch, (tuple, list))
                                                          else ""))
        empty = False
        yield batch[0], batch[1]
    if empty:
        raise ValueError(f"{where}: the DataLoader gave no batch")


def pairs(dataloader) -> tuple:
    """Every (data, label) batch of ``dataloader`` joined: (X, Y)."""
    xs, ys = zip(*batches_of(dataloader))
    return torch.cat(xs), torch.cat(ys)


def bootstrap_loaders(dataloader, n: int, seed: int) -> List[DataLoader]:
    """``n`` bootstrap resamples of ``dataloader``'s data (as PusH's bootstrap=True), each a
    shuffled DataLoader of the same batch size; drawn from ``seed``, so a run repeats."""
    x, y = pairs(dataloader)
    batch_size = getattr(dataloader, "batch_size", None) or 1
    loaders = []
    for i in range(n):
        g = torch.Generator().manual_seed(mix(seed, i, 0))
        indices = torch.randint(0, len(x), (len(x),), generator=g)
        order = torch.Generator().manual_seed(mix(seed, i, 1))
        loaders.append(DataLoader(TensorDataset(x[indices], y[indices]), batch_size=batch_size, shuffle=True,
                                  generator=order))
    return loaders


def step_on(particle, loss_fn: Callable, data, label, *args):
    """The handler a lead particle's batches are sent to: one step of this particle."""
    return particle.step(loss_fn, data, label, *args).wait()


def mean_loss(losses: List[torch.Tensor]) -> float:
    return torch.stack(losses).mean().item() if losses else float("nan")


def check_finite(where: str, epoch: int, losses: List[tuple]) -> None:
    """Raises RuntimeError naming the first particle whose training loss in ``epoch`` (from
    0) is not finite: the run diverged, and would go on to NaN weights and predictions (PusH
    trained on). ``losses``: (pid, loss tensor) of each step of the epoch."""
    named = [(pid, torch.as_tensor(loss)) for pid, loss in losses if loss is not None]
    if not named:
        return
    try:  # one check for the epoch when every loss is a scalar, as usual
        if bool(torch.isfinite(torch.stack([loss for _, loss in named])).all()):
            return
    except RuntimeError:  # losses of different shapes (a loss without reduction)
        pass
    for pid, loss in named:
        if not bool(torch.isfinite(loss).all()):
            value = loss[~torch.isfinite(loss)].reshape(-1)[0].item()
            raise RuntimeError(f"{where}: the training loss of particle {pid} is non-finite ({value}) in epoch "
                               f"{epoch + 1}: training diverged; lower the learning rate or check the data for huge "
                               "values")


def run_epochs(particle, loaders, others: List[int], loss_fn: Callable, step_msg: str, epochs: int,
               after_epoch: Callable[[], None], where: str) -> List[float]:
    """The lead particle's training loop, PusH's: ``epochs`` epochs of every member. With
    one loader the lead steps on each batch and sends it to the others (``step_msg``); with
    one per member (bootstrap resamples) the others' batches are queued at once (each
    member takes its messages in order) while the lead steps on its own. Every member has
    taken every step of an epoch before ``after_epoch`` and the next epoch (PusH sent
    without waiting; here nothing is left running when training returns). Returns the
    lead's mean loss per epoch; a member's non-finite loss raises (check_finite)."""
    losses = []
    for epoch in range(epochs):
        pending, owners, mine = [], [], []
        if len(loaders) > 1:
            for pid, loader in zip(others, loaders[1:]):
                sent = [particle.send(pid, step_msg, loss_fn, data, label) for data, label in loader]
                pending += sent
                owners += [pid] * len(sent)
            mine = [particle.step(loss_fn, data, label).wait() for data, label in loaders[0]]
        else:
            for data, label in batches_of(loaders[0], where):
                pending += [particle.send(pid, step_msg, loss_fn, data, label) for pid in others]
                owners += others
                mine.append(particle.step(loss_fn, data, label).wait())
        theirs = particle.wait(pending)
        check_finite(where, epoch, [(particle.pid, loss) for loss in mine] + list(zip(owners, theirs)))
        after_epoch()
        losses.append(mean_loss(mine))
    return losses


def combine(preds: Sequence[torch.Tensor], f_reg: bool, mode: Sequence[str]) -> Dict[str, torch.Tensor]:
    """PusH's prediction modes over the particles' outputs ``preds`` ([N, ...] each):
    regression "mean", "median", "min", "max", "std", "pred" (all, [N, particles, ...]);
    classification (outputs are logits) "logits", "prob" (softmax per particle),
    "mean_prob" (and "mean": the averaged probabilities), "mode" (majority class), "std";
    the classes are each output's dimension 1, as in PusH."""
    if isinstance(mode, str):
        mode = [mode]
    valid = _REGRESSION_MODES if f_reg else _CLASSIFICATION_MODES
    for m in mode:
        if m not in valid:
            raise ValueError(f"push.bayes: prediction mode {m!r} is not one of {list(valid)} "
                             f"({'regression' if f_reg else 'classification'})")
    t = torch.stack(list(preds), dim=1)  # [N, particles, ...]
    out = {}
    if f_reg:
        reducers = {"mean": lambda: t.mean(dim=1), "median": lambda: t.median(dim=1).values,
                    "min": lambda: t.min(dim=1).values, "max": lambda: t.max(dim=1).values,
                    "std": lambda: t.std(dim=1), "pred": lambda: t}
    else:
        probs = t.softmax(dim=2)  # [N, particles, classes, ...]
        reducers = {"logits": lambda: t, "prob": lambda: probs, "mean_prob": lambda: probs.mean(dim=1),
                    "mean": lambda: probs.mean(dim=1), "mode": lambda: probs.argmax(dim=2).mode(dim=1).values,
                    "std": lambda: probs.std(dim=1)}
    for m in mode:
        out[m] = reducers[m]()
    return out


def batches(data):
    """The inputs to predict on: a tensor, or every batch of a DataLoader (its labels, if
    any, dropped)."""
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, DataLoader):
        return [b[0] if isinstance(b, (tuple, list)) else b for b in data]
    raise ValueError(f"push.bayes: predictions need a tensor or a DataLoader, got {type(data).__name__}")


def train_keys(random_seed: bool, n: int) -> list:
    """Each particle's train_key: drawn from torch's generator with PusH's random_seed=True
    (torch.manual_seed still repeats a run), else None (push's seed per particle)."""
    if random_seed:
        return torch.randint(0, 10**9, (n,), dtype=torch.int64).tolist()
    return [None] * n


class Infer:
    """A PusH distribution of ``mk_nn(*args)`` particles that a Bayesian method trains (PusH's
    ``push.bayes.infer.Infer``: subclass it and define ``bayes_infer`` and ``posterior_pred``).
    Close it (or use ``with``) to stop its lanes; the interpreter's exit does too."""

    _where = "push.bayes"

    def __init__(self, mk_nn: Callable, *args, num_devices: int = 1, cache_size: int = 4, view_size: int = 4,
                 seed: int = 0):
        check_int(self._where, "num_devices", num_devices, 1)
        check_seed(self._where, seed)
        self.mk_nn = mk_nn
        self.args = args
        self.seed = seed
        self._dist_options = dict(cache_size=cache_size, view_size=view_size, devices=num_devices, seed=seed)
        self._push_dist = None
        self._closed = False  # close() was called: nothing answers or trains any more
        self._num_devices = None
        self.losses: List[float] = []  # the lead particle's mean training loss per epoch

    @property
    def push_dist(self) -> "push.PusH":
        """The PusH distribution of ``mk_nn(*args)`` particles, made at its first use."""
        if self._push_dist is None:
            if self._closed:
                raise ValueError(f"{self._where}: this {type(self).__name__} is closed")
            self._push_dist = push.PusH(self.mk_nn, *self.args, **self._dist_options)
        return self._push_dist

    @push_dist.setter
    def push_dist(self, dist) -> None:
        self._push_dist = dist

    @property
    def num_devices(self) -> int:
        """The distribution's device lanes (GPUs, or CPU lanes without GPUs)."""
        return self._num_devices if self._num_devices is not None else self.push_dist.num_devices()

    @num_devices.setter
    def num_devices(self, n: int) -> None:
        self._num_devices = n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._closed = True
        if self._push_dist is not None:
            self._push_dist.close()

    def _cleanup(self) -> None:
        self.close()

    def bayes_infer(self, dataloader, epochs: int, **kwargs):
        """Trains the particles: a subclass defines it."""
        raise NotImplementedError(f"{type(self).__name__}.bayes_infer: a subclass of Infer defines it")

    def posterior_pred(self, data, f_reg: bool = True, mode="mean"):
        """Predicts with the trained particles: a subclass defines it."""
        raise NotImplementedError(f"{type(self).__name__}.posterior_pred: a subclass of Infer defines it")

    def p_parameters(self) -> List[List[torch.Tensor]]:
        """Every particle's parameters (CPU copies), in particle order."""
        return [self.push_dist.p_parameters(pid) for pid in self.push_dist.particle_ids()]

    @staticmethod
    def get_var(outputs: List[List[torch.Tensor]]) -> List[torch.Tensor]:
        """The variance over the particles of ``outputs`` (each particle's list of per-batch
        outputs): one tensor per batch."""
        return [torch.var(torch.stack(list(batch)), dim=0) for batch in zip(*outputs)]

    def _gather(self, msg: str, data, *args) -> List[torch.Tensor]:
        """Each particle's answer to ``msg`` on every batch of ``data``, joined: [particles]
        of [N, ...]; the particles answer concurrently, each on its own lane."""
        pids = self.push_dist.particle_ids()
        if not pids:
            raise ValueError(f"{self._where}: there are no particles yet: bayes_infer trains them first")
        per_batch = []
        for x in batches(data):
            futures = [self.push_dist.p_launch(pid, msg, x, *args) for pid in pids]
            per_batch.append([f.wait() for f in futures])
        if not per_batch:
            raise ValueError(f"{self._where}: there is no data to predict on")
        return [torch.cat([b[i] for b in per_batch]) for i in range(len(pids))]
