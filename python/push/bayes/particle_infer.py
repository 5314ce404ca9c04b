"""What PusH's Bayesian entry points share: the distribution they train on, predictions
gathered from every particle, bootstrap resamples and argument checks.

PusH's ``push.bayes.infer.Infer`` is this class here (push.bayes.infer holds the C++
algorithms): ``push_dist``, ``num_devices``, ``p_parameters`` and ``posterior_pred``.
"""

from typing import Callable, Dict, List, Sequence

import torch
from torch.utils.data import DataLoader, TensorDataset

import push

_REGRESSION_MODES = ("mean", "median", "min", "max", "std", "pred")
_CLASSIFICATION_MODES = ("logits", "prob", "mean_prob", "mode", "std", "mean")


def check_int(where: str, name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def check_number(where: str, name: str, value, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or (positive and value <= 0):
        raise ValueError(f"{where}: {name} must be a {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


def adam(lr: float, weight_decay: float = 0.0) -> Callable:
    """PusH's create_optimizer(lr): Adam at ``lr``."""
    return lambda params: torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


def constant_scheduler(optim):
    """PusH's default mk_scheduler: LinearLR from 1.0 to 1.0, which leaves lr as it is."""
    return torch.optim.lr_scheduler.LinearLR(optim, start_factor=1.0, end_factor=1.0, total_iters=1)


def pairs(dataloader) -> tuple:
    """Every (data, label) batch of ``dataloader`` joined: (X, Y)."""
    xs, ys = [], []
    for batch in dataloader:
        if not isinstance(batch, (tuple, list)) or len(batch) < 2:
            raise TypeError("push.bayes: the DataLoader must give (data, label) batches")
        xs.append(batch[0])
        ys.append(batch[1])
    if not xs:
        raise ValueError("push.bayes: the DataLoader is empty")
    return torch.cat(xs), torch.cat(ys)


def bootstrap_loaders(dataloader, n: int, seed: int) -> List[DataLoader]:
    """``n`` bootstrap resamples of ``dataloader``'s data (as PusH's bootstrap=True), each a
    shuffled DataLoader of the same batch size; drawn from ``seed``, so a run repeats."""
    x, y = pairs(dataloader)
    loaders = []
    for i in range(n):
        g = torch.Generator().manual_seed(seed * 1_000_003 + 42 * (i + 1))
        indices = torch.randint(0, len(x), (len(x),), generator=g)
        order = torch.Generator().manual_seed(seed * 1_000_003 + 42 * (i + 1) + 1)
        loaders.append(DataLoader(TensorDataset(x[indices], y[indices]), batch_size=dataloader.batch_size or 1,
                                  shuffle=True, generator=order))
    return loaders


def combine(preds: Sequence[torch.Tensor], f_reg: bool, mode: Sequence[str]) -> Dict[str, torch.Tensor]:
    """PusH's prediction modes over the particles' outputs ``preds`` ([N, ...] each):
    regression "mean", "median", "min", "max", "std", "pred" (all, [N, particles, ...]);
    classification (outputs are logits) "logits", "prob" (softmax per particle),
    "mean_prob" (and "mean": the averaged probabilities), "mode" (majority class), "std"."""
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
        probs = t.softmax(dim=-1)
        reducers = {"logits": lambda: t, "prob": lambda: probs, "mean_prob": lambda: probs.mean(dim=1),
                    "mean": lambda: probs.mean(dim=1), "mode": lambda: probs.argmax(dim=-1).mode(dim=1).values,
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


class ParticleInfer:
    """A PusH distribution of ``mk_nn(*args)`` particles that a Bayesian method trains (PusH's
    Infer). Close it (or use ``with``) to stop its lanes; the interpreter's exit does too."""

    _where = "push.bayes"

    def __init__(self, mk_nn: Callable, *args, num_devices: int = 1, cache_size: int = 4, view_size: int = 4,
                 seed: int = 0):
        check_int(self._where, "num_devices", num_devices, 1)
        self.mk_nn = mk_nn
        self.args = args
        self.seed = seed
        self.push_dist = push.PusH(mk_nn, *args, cache_size=cache_size, view_size=view_size, devices=num_devices,
                                   seed=seed)
        self.num_devices = self.push_dist.num_devices()
        self.losses: List[float] = []  # the lead particle's mean training loss per epoch

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.push_dist.close()

    def p_parameters(self) -> List[List[torch.Tensor]]:
        """Every particle's parameters (CPU copies), in particle order."""
        return [self.push_dist.p_parameters(pid) for pid in self.push_dist.particle_ids()]

    def _gather(self, msg: str, data, *args) -> List[torch.Tensor]:
        """Each particle's answer to ``msg`` on every batch of ``data``, joined: [particles]
        of [N, ...]; the particles answer concurrently, each on its own lane."""
        pids = self.push_dist.particle_ids()
        per_batch = []
        for x in batches(data):
            futures = [self.push_dist.p_launch(pid, msg, x, *args) for pid in pids]
            per_batch.append([f.wait() for f in futures])
        if not per_batch:
            raise ValueError(f"{self._where}: there is no data to predict on")
        return [torch.cat([b[i] for b in per_batch]) for i in range(len(pids))]
