"""The particle a handler receives, and views of other particles."""

from typing import Callable, Dict, List

import torch

from push._push import CancelledError
from push.pfuture import PFuture


def _to(device, value):
    return value.to(device) if isinstance(value, torch.Tensor) else value


class Particle:
    """What a handler sees: its own module, optimizer and state, and messages to others.

    Valid while the handler runs. ``forward``, ``step``, ``zero_grad`` and
    ``scheduler_step`` run here, on the handler's thread; ``send``, ``get`` and
    ``register_receive`` go through the particle's lane.
    """

    def __init__(self, dist, call):
        slot = dist._slot(call.pid)
        self._dist = dist
        self._call = call
        self._slot_ = slot
        self.pid: int = call.pid
        self.device: torch.device = slot.device
        self.module: torch.nn.Module = slot.module
        self.state: Dict[str, object] = slot.state

    @property
    def optimizer(self):
        return self._slot_.optimizer

    @property
    def scheduler(self):
        return self._slot_.scheduler

    # -- other particles ------------------------------------------------------------

    def particle_ids(self) -> List[int]:
        return self._dist.particle_ids()

    def other_particles(self) -> List[int]:
        return [pid for pid in self._dist.particle_ids() if pid != self.pid]

    def register_receive(self, msg: str, fn: Callable, state: Dict[str, object] = None) -> None:
        """Answer ``msg`` with ``fn(particle, *args)`` from now on; ``state`` is merged
        into this particle's state."""
        if not isinstance(msg, str):
            raise TypeError(f"push: a message name is a str, got {type(msg).__name__}")
        if state:
            self.state.update(state)
        self._dist._core.register_receive(self._call, msg, fn)

    def send(self, pid: int, msg: str, *args) -> PFuture:
        """Runs particle ``pid``'s handler for ``msg`` with ``args``; its result later."""
        self._dist._check_pid(pid)
        if not isinstance(msg, str):
            raise TypeError(f"push: a message name is a str, got {type(msg).__name__}")
        return PFuture(self._call.send(pid, msg, *args), unwaited=self._dist._unwaited)

    def get(self, pid: int) -> PFuture:
        """A view of particle ``pid``'s parameters (and gradients) as they are now."""
        self._dist._check_pid(pid)
        dist = self._dist
        return PFuture(self._call.get(pid), convert=lambda view: ParticleView(dist, view))

    def wait(self, pfutures: List[PFuture]) -> List[object]:
        return [f.wait() for f in pfutures]

    # -- this particle's network ----------------------------------------------------

    def _check_active(self, what):
        if not self._call.active:
            raise CancelledError(f"[push] particle {self.pid}'s handler for '{self._call.message}' has ended: "
                                      f"{what} can only be used while the handler runs")

    def zero_grad(self) -> PFuture:
        """Clears the module's gradients (to None, on every torch), with or without an optimizer."""
        self._check_active("zero_grad")
        self.module.zero_grad(set_to_none=True)
        return PFuture(value=None)

    def forward(self, x: torch.Tensor, *args) -> PFuture:
        self._check_active("forward")
        return PFuture(value=self.module(_to(self.device, x), *[_to(self.device, a) for a in args]))

    def step(self, loss_fn: Callable, data: torch.Tensor, label: torch.Tensor, *args) -> PFuture:
        """One optimizer step on ``loss_fn(module(data, *args), label)``; the loss later.
        Without an optimizer (p_create's mk_optim None) only the gradients are computed,
        as in PusH: SVGD's particles step that way and move by their kernel's update."""
        self._check_active("step")
        self.module.zero_grad()
        out = self.module(_to(self.device, data), *[_to(self.device, a) for a in args])
        loss = loss_fn(out, _to(self.device, label))
        loss.backward()
        if self._slot_.optimizer is not None:
            self._slot_.optimizer.step()
        return PFuture(value=loss.detach())

    def scheduler_step(self, *args) -> PFuture:
        self._check_active("scheduler_step")
        scheduler = self._slot_.scheduler
        if scheduler is None:
            raise ValueError(f"push: particle {self.pid} was created without mk_scheduler")
        scheduler.step(*args)
        return PFuture(value=None)


class ParticleView:
    """Another particle's parameters as they were when ``get`` read them."""

    def __init__(self, dist, view):
        self._dist = dist
        self._view = view
        self.pid: int = view.pid

    @property
    def version(self) -> int:
        return self._view.version

    def parameters(self) -> List[torch.Tensor]:
        return list(self._view.parameters)

    def named_parameters(self):
        return list(zip(self._view.names, self._view.parameters))

    def gradients(self) -> List[torch.Tensor]:
        return list(self._view.gradients)

    def view(self) -> torch.nn.Module:
        """The other particle as a module (PusH's form): its one view module, holding this
        view's tensors (no copy). As in PusH it is shared: the latest view() of a particle
        is what its module shows."""
        module = self._dist._slot(self.pid).view
        params = dict(module.named_parameters())
        for name, tensor, grad in zip(self._view.names, self._view.parameters, self._view.gradients):
            params[name].data = tensor
            params[name].grad = grad
        return module
