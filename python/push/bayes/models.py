"""The C++ Bayesian algorithms (push::bayes) with their options."""

from typing import Optional

import torch

from push import _lifetime, _push

def rebuild_blocker(module: torch.nn.Module) -> str:
    """Why ``module`` would not be rebuilt in C++ (naming the layer), or "" when it would.

    Rebuilt: a torch.nn.Sequential (nested ones too) of Linear, Conv2d, MaxPool2d,
    AvgPool2d, BatchNorm1d/2d, Flatten, Dropout, Identity, ReLU, LeakyReLU, ELU, GELU, SiLU,
    Softplus, Tanh and Sigmoid; exactly these classes, not subclasses.
    """
    return _push.bayes.rebuild_blocker(module)


class Predictive:
    """What ``predict`` returns: for regression ``mean`` and ``variance`` (total) and
    ``aleatoric`` [N, targets]; for classification ``probs`` [N, classes] (``mean`` is then
    the probabilities too); ``members``: each particle's own output."""

    __slots__ = ("classify", "mean", "variance", "aleatoric", "probs", "members")

    def __init__(self, d):
        for k in self.__slots__:
            setattr(self, k, d[k])

    @property
    def epistemic(self) -> Optional[torch.Tensor]:
        """The part of the variance that comes from the particles disagreeing."""
        if self.variance is None or self.aleatoric is None:
            return None
        return self.variance - self.aleatoric


def _tensors(x, y):
    """(x, y) from tensors, a Dataset of pairs or a DataLoader (its batches, in order)."""
    if y is not None:
        return x, y
    if isinstance(x, torch.utils.data.DataLoader) or isinstance(x, torch.utils.data.Dataset):
        xs, ys = [], []
        batches = x if isinstance(x, torch.utils.data.DataLoader) else torch.utils.data.DataLoader(x, batch_size=4096)
        for data, label in batches:
            xs.append(data)
            ys.append(label)
        if not xs:
            raise ValueError("push.bayes: the data is empty")
        return torch.cat(xs), torch.cat(ys)
    raise TypeError("push.bayes: fit takes (x, y) tensors, a Dataset of (x, y) pairs or a DataLoader")


class Infer:
    """Base of the algorithms: ``fit`` trains, ``predict`` gives the predictive
    distribution. Options are keyword arguments (a misspelt one is a TypeError):

    particles (4), lr (1e-3, Adam), cosine_epochs (0: a constant rate; T > 0: before
    epoch e the rate is lr (1 + cos(pi e / T)) / 2, 0 after T), batch_size (128), likelihood ("gaussian",
    "heteroscedastic", "categorical", "learned_noise"), noise_std (1.0), prior_std (1.0),
    fuse (False: True trains the particles as one batched computation when the model
    fuses), seed (0), devices, device_type ("cpu", "cuda"), cache_size, intra_op_threads,
    prior_scale (0: none; beta > 0 adds beta times a frozen prior network of the same
    architecture to each particle's output, Osband et al. 2018).
    """

    _kind = None

    def __init__(self, model, **options):
        """``model``: a factory (callable) of a torch.nn.Sequential, or one of push's model
        specs ("mlp:64,64", "cnn:16,32", as ``push train --model`` takes them) with
        ``input_shape``, ``outputs`` and optionally ``dropout``."""
        if isinstance(model, str):
            self._infer = _push.bayes.Infer(self._kind, model, dict(options))
            _lifetime.track(self)
            return
        if isinstance(model, torch.nn.Module):
            raise TypeError(f"push.bayes.{self._kind}: model must be a factory of a torch.nn.Sequential (each "
                            f"particle gets its own, initialised under its own seed), got a {type(model).__name__} "
                            "instance")
        if not callable(model):
            raise TypeError(f"push.bayes.{self._kind}: model must be a factory (callable) of a torch.nn.Sequential, "
                            f"got {type(model).__name__}")
        # Checked here, on one made without touching the caller's random stream; each
        # particle's own is made under its seed when fit() creates the particles.
        with torch.random.fork_rng(devices=[]):
            probe = model()
        if not isinstance(probe, torch.nn.Module):
            raise TypeError(f"push.bayes.{self._kind}: model() must return a torch.nn.Module, "
                            f"got {type(probe).__name__}")
        why = rebuild_blocker(probe)
        if why:
            raise ValueError(f"push.bayes.{self._kind}: cannot train this model in C++: {why}. "
                             "Train it as Python code with bayes_infer (push.bayes.ensemble.train_deep_ensemble, "
                             "push.bayes.swag.train_mswag, push.bayes.stein_vgd.train_svgd)")
        self._infer = _push.bayes.Infer(self._kind, model, dict(options))
        _lifetime.track(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Stops the particles' lanes and frees them (the model cannot be used after). The
        garbage collector and the interpreter's exit do it too."""
        self.__dict__.pop("_infer", None)  # the C++ model is freed without the GIL
        _lifetime.untrack(self)

    @property
    def _core(self):
        core = self.__dict__.get("_infer")
        if core is None:
            raise ValueError(f"push.bayes.{self._kind}: this model is closed")
        return core

    def fit(self, x, y=None, epochs: int = 1, num_classes: Optional[int] = None) -> "Infer":
        """Trains ``epochs`` more epochs on (x, y); classification when the likelihood is
        categorical (y: class indices, ``num_classes`` taken from y when not given)."""
        x, y = _tensors(x, y)
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError("push.bayes: x and y must be tensors")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"push.bayes: epochs must be a non-negative int, got {epochs!r}")
        classify = not torch.is_floating_point(y)
        if classify and num_classes is None:
            num_classes = int(y.max().item()) + 1 if y.numel() else 0
        self._core.fit(x, y, epochs, classify, num_classes or 0)
        return self

    def predict(self, x: torch.Tensor) -> Predictive:
        return Predictive(self._core.predict(x))

    def save(self, folder) -> None:
        self._core.save(str(folder))

    def load(self, folder) -> None:
        self._core.load(str(folder))

    @property
    def fused(self) -> bool:
        """Whether the particles train as one batched computation."""
        return self._core.fused()

    @property
    def epochs_done(self) -> int:
        return self._core.epochs_done

    @property
    def losses(self):
        """The mean training loss of each epoch."""
        return list(self._core.losses)

    @property
    def particle_losses(self) -> dict:
        """Each particle's best and last epoch loss (mean nll per point), by particle id:
        ``{pid: {"best", "best_epoch", "last", "last_epoch"}}``, epochs counted from 1."""
        return dict(self._core.particle_losses)

    def warnings(self, test=None, train=None, rise: float = 1.0) -> list:
        """The particles that trained badly although every number is finite, as dicts
        (``particle``, ``kind``, ``value``, ``reference``, ``message``): "loss_rose" when a
        particle's last epoch loss exceeds its best by more than ``rise`` nats per point;
        with ``test`` and ``train`` as (x, y) pairs, "worse_than_mean" when its own test
        predictions do worse than predicting the training mean (classification: the
        training class frequencies), and "miscalibrated" (``particle`` None: the whole
        predictive) when, for regression, the median of |y - mean| / sd on the test set is
        more than 3 times below (too wide) or 4 times above (too narrow) a calibrated
        Gaussian's 0.674. See push/bayes/warnings.h."""
        if (test is None) != (train is None):
            raise ValueError("push.bayes: warnings needs both test and train, or neither")
        if test is None:
            return self._core.warnings(float(rise), None, None, None, None, False)
        (tx, ty), (rx, ry) = _tensors(*test), _tensors(*train)
        classify = not torch.is_floating_point(ry)
        return self._core.warnings(float(rise), tx, ty, rx, ry, classify)

    def particle_ids(self):
        return list(self._core.particle_ids())

    def particle_parameters(self, pid: int):
        """[(name, tensor)] of particle ``pid``, copies on the CPU."""
        return list(self._core.particle_parameters(pid))

    def swag_moments(self, pid: int) -> dict:
        """MultiSWAG's: particle ``pid``'s SWAG moments, {"count", "mean", "sq_mean",
        "deviations" [k, D]}, flat in particle_parameters' order (push::bayes::SWAGMoments)."""
        return dict(self._core.swag_moments(pid))


class SVGD(Infer):
    """Stein variational gradient descent. Also ``bandwidth`` (None: the rule's),
    ``bandwidth_rule`` ("median", "median_log_n"), ``repulsive`` (True)."""

    _kind = "SVGD"


class MCDropout(Infer):
    """MC dropout (the model needs Dropout layers). Also ``samples`` (20)."""

    _kind = "MCDropout"


class SGLD(Infer):
    """Stochastic gradient Langevin dynamics: each particle a chain (push/bayes/sgmcmc.h).
    Also ``step_size`` (1e-3, per training point), ``preconditioned`` (False: True is
    pSGLD), ``precondition_decay`` (0.99), ``precondition_eps`` (1e-5),
    ``hold_preconditioner`` (False; True holds pSGLD's V while samples are kept: exact up to
    the step's discretisation, needs a burn-in), ``temperature`` (1),
    ``cycle_epochs`` (0: a constant step; L: cyclical over L epochs), ``exploration`` (0.5),
    ``burn_in_epochs`` (0), ``thin`` (1) and ``samples`` (20, kept per chain)."""

    _kind = "SGLD"

    def __init__(self, model, **options):
        for name in ("lr", "cosine_epochs"):
            if name in options:
                raise TypeError(f"push.bayes.{self._kind}: the chains take step_size (and cycle_epochs), not {name}")
        super().__init__(model, **options)

    def mixing(self, x: torch.Tensor):
        """Whether the chains have mixed: the split-R-hat of their predictions at ``x``
        and their drift (push/bayes/mixing.h), ``{"rhat_median", "rhat_max", "above_1.1",
        "drift_median", "drift_max", "values", "samples_per_chain"}``; near 1 when mixed,
        above 1.1 when not (drift: a chain still moving). None with fewer than 2
        chains or 4 kept samples each."""
        return self._core.mixing(x)


class SGHMC(SGLD):
    """Stochastic gradient Hamiltonian Monte Carlo (Chen et al. 2014): each particle a
    chain. Also ``friction`` (0.1) and SGLD's options but the preconditioner."""

    _kind = "SGHMC"


class Laplace(Infer):
    """Ensemble members, each with a last-layer Laplace approximation (push/bayes/laplace.h):
    ``fit`` trains the MAP networks, ``approximate(x, y)`` fits each last layer's posterior
    on the training data, then ``predict`` uses it. Also ``structure`` ("full",
    "diagonal"), ``predictive`` ("linearized", "sampling"), ``prior_precision`` (None: the
    marginal likelihood's), ``samples`` (20, sampling) and ``bootstrap`` (False)."""

    _kind = "Laplace"

    def approximate(self, x, y=None) -> "Laplace":
        x, y = _tensors(x, y)
        self._core.approximate(x, y, not torch.is_floating_point(y))
        return self


class _Engine(Infer):
    """The C++ engine of a class that also trains PusH's way (push.bayes.both_ways)."""

    def __init__(self, kind: str, model, options: dict):
        self._kind = kind
        super().__init__(model, **options)


def engine(kind: str, model, options: dict) -> Infer:
    """The C++ algorithm ``kind`` on ``model`` (a factory or a model spec) with ``options``."""
    return _Engine(kind, model, options)
