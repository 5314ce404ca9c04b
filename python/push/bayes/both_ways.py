"""One class per algorithm, trained either way: PusH's ``bayes_infer`` (Python handlers on
push's particles, any torch.nn.Module) or push's ``fit`` (the C++ engine, for a
torch.nn.Sequential of standard layers). push.bayes.Ensemble is
push.bayes.ensemble.Ensemble, and push.bayes.MultiSWAG is push.bayes.swag.MultiSWAG.

Both ways draw every particle's seed from the one ``seed`` through push's seed mixer
(push::mix_seed). They train separate sets of particles: ``posterior_pred`` and
``p_parameters`` answer for what ``bayes_infer`` trained, ``predict`` and
``particle_parameters`` for what ``fit`` trained; ``losses`` is the latest run's.

``bayes_infer`` itself trains on the C++ engine when the run means what the engine
computes (push.bayes.engine_route): its particles are then the engine's, and
``posterior_pred`` and ``p_parameters`` answer from them through the user's own module.
"""

import torch

from push.bayes import models
from push.bayes.routed_run import RoutedRun

# What the C++ engine's model answers, forwarded as they are.
_FORWARDED = ("predict", "save", "load", "warnings", "particle_ids", "particle_parameters", "swag_moments")


class TrainsBothWays(RoutedRun):
    """The C++ half of a class whose PusH half is push.bayes.particle_infer.Infer."""

    _kind = None  # the C++ algorithm: "Ensemble", "MultiSWAG"

    def _start(self, mk_nn, args, seed: int, num_devices: int, cache_size: int, options: dict) -> None:
        """Keeps what fit needs. With C++ options given, or a model spec ("mlp:64,64"), the
        engine is made now, so that a misspelt option or a model it cannot rebuild fails
        here; otherwise at the first fit. PusH's num_devices and cache_size, when not their
        defaults (1 and 4), are the engine's devices and cache_size unless those are given."""
        if isinstance(mk_nn, torch.nn.Module):
            raise TypeError(f"push.bayes.{self._kind}: model must be a factory of a torch.nn.Module (each particle "
                            f"gets its own, initialised under its own seed), got a {type(mk_nn).__name__} instance")
        eager = bool(options) or isinstance(mk_nn, str)
        options = dict(options, seed=seed)
        if num_devices != 1:
            options.setdefault("devices", num_devices)
        if cache_size != 4:
            options.setdefault("cache_size", cache_size)
        self._engine = None
        self._engine_args = (mk_nn, args, options)
        self._fit_last = False
        if eager:
            self._make_engine()

    def _make_engine(self):
        mk_nn, args, options = self._engine_args
        model = mk_nn if isinstance(mk_nn, str) or not args else (lambda: mk_nn(*args))
        self._engine = models.engine(self._kind, model, options)
        return self._engine

    @property
    def _cpp(self):
        if self._closed:
            raise ValueError(f"push.bayes.{self._kind}: this model is closed")
        if self._engine is None:
            return self._make_engine()
        return self._engine

    def fit(self, x, y=None, epochs: int = 1, num_classes=None):
        """push's way: trains ``epochs`` more epochs on (x, y) with the C++ engine (see
        push.bayes.Infer.fit)."""
        self._cpp.fit(x, y, epochs=epochs, num_classes=num_classes)
        self._fit_last = True
        return self

    def __getattr__(self, name):
        # Only for names not found the usual way: the engine's methods and properties.
        if name in _FORWARDED or name in ("fused", "epochs_done", "particle_losses"):
            return getattr(self._cpp, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def losses(self):
        """The mean training loss of each epoch of the latest run (fit's, or bayes_infer's)."""
        if self._fit_last and self._engine is not None:
            return self._engine.losses
        return self._python_losses

    @losses.setter
    def losses(self, value):
        self._python_losses = value
        self._fit_last = False

    def close(self) -> None:
        """Stops both ways' particles and frees them."""
        engine, self._engine = self.__dict__.get("_engine"), None
        if engine is not None:
            engine.close()
        super().close()  # the routed run's engine (RoutedRun), then the Python particles; closed (Infer)
