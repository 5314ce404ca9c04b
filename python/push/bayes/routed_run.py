"""A PusH-form ``bayes_infer`` that trained on push's C++ engine (push.bayes.engine_route):
what the class keeps of it, and how ``posterior_pred`` and ``p_parameters`` answer from the
engine's particles through the user's own module. push.bayes.ensemble.Ensemble and
push.bayes.swag.MultiSWAG (through push.bayes.both_ways) and push.bayes.stein_vgd.SteinVGD
share it."""

import torch

from push.bayes import models
from push.bayes.engine_route import Route
from push.bayes.particle_infer import batches


class RoutedRun:
    """Mixed in before push.bayes.particle_infer.Infer; ``_kind`` names the C++ algorithm."""

    _kind = None  # "Ensemble", "MultiSWAG", "SVGD"
    _routed = None  # (engine, route) of a bayes_infer that trained in C++
    _routed_nets = None

    def _trained_before(self) -> bool:
        """Whether bayes_infer has made Python particles (a routed run is self._routed)."""
        return self._push_dist is not None and bool(self._push_dist.particle_ids())

    def _refuse_second_run(self) -> None:
        self._refuse_closed()
        if self._routed is not None:
            name = type(self).__name__
            raise ValueError(f"{self._where}: this {name} trained on push's C++ engine, whose particles a second "
                             f"bayes_infer cannot add to; make another {name}, or train with engine=False from the "
                             "first bayes_infer")

    def _train_routed(self, route: Route, epochs: int):
        """bayes_infer on the C++ engine: the route's particles, ``epochs`` epochs."""
        engine = models.engine(self._kind, route.factory, route.options)
        try:
            engine.fit(route.x, route.y, epochs=epochs, num_classes=route.num_classes)
        except BaseException:
            engine.close()  # a failed run leaves nothing: bayes_infer may run again
            raise
        self._routed = (engine, route)
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

    def _refuse_closed(self) -> None:
        if self._closed:
            raise ValueError(f"{self._where}: this {type(self).__name__} is closed")

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

    def close(self) -> None:
        """Stops the routed run's engine too."""
        routed, self._routed, self._routed_nets = self.__dict__.get("_routed"), None, None
        if routed is not None:
            routed[0].close()
        super().close()
