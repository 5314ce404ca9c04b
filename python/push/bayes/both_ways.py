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
from push.bayes.engine_route import Route
from push.bayes.particle_infer import batches

# What the C++ engine's model answers, forwarded as they are.
_FORWARDED = ("predict", "save", "load", "warnings", "particle_ids", "particle_parameters")


class TrainsBothWays:
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
        self._closed = False
        self._engine_args = (mk_nn, args, options)
        self._fit_last = False
        self._routed = None  # (engine, route) of a bayes_infer that trained in C++
        self._routed_nets = None
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

    def _trained_before(self) -> bool:
        """Whether bayes_infer has made Python particles (a routed run is self._routed)."""
        return self._push_dist is not None and bool(self._push_dist.particle_ids())

    def _train_routed(self, route: Route, epochs: int):
        """bayes_infer on the C++ engine: the route's particles, ``epochs`` epochs."""
        engine = models.engine(self._kind, route.factory, route.options)
        self._routed = (engine, route)
        engine.fit(route.x, route.y, epochs=epochs, num_classes=route.num_classes)
        self.losses = [loss - route.loss_offset for loss in engine.losses]
        return self

    def _routed_modules(self) -> list:
        """The routed particles as the user's own modules (made without touching the
        caller's random stream), their parameters the engine's."""
        if self._routed_nets is None:
            engine, route = self._routed
            nets = []
            for pid in engine.particle_ids():
                with torch.random.fork_rng(devices=[]):
                    net = self.mk_nn(*self.args)
                values = [t for _, t in engine.particle_parameters(pid)]
                net.load_state_dict(dict(zip(route.names, values)))
                nets.append(net)
            self._routed_nets = nets
        return self._routed_nets

    def _routed_outputs(self, data) -> list:
        """Each routed particle's output on every batch of ``data``, joined: [particles] of [N, ...]."""
        inputs = batches(data)
        if not inputs:
            raise ValueError(f"{self._where}: there is no data to predict on")
        with torch.no_grad():  # the routed particles live on the CPU; the Python path's outputs do too
            return [torch.cat([net(x.cpu()).detach() for x in inputs]) for net in self._routed_modules()]

    def p_parameters(self):
        """Every particle's parameters (CPU copies), in particle order."""
        if self._routed is not None:
            return [[p.detach().clone() for p in net.parameters()] for net in self._routed_modules()]
        return super().p_parameters()

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
        engine, self._engine, self._closed = self.__dict__.get("_engine"), None, True
        routed, self._routed, self._routed_nets = self.__dict__.get("_routed"), None, None
        for e in (engine, routed[0] if routed else None):
            if e is not None:
                e.close()
        super().close()
