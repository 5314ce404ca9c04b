"""PusH's Stein variational gradient descent, as PusH's users call it, on push's particles.

``train_svgd`` trains any torch.nn.Module as Python code: on every batch each particle
computes its loss gradient (particles have no optimizer), the lead particle reads every
other's parameters and gradients through views, and moves each particle by SVGD's update
(Liu & Wang 2016) with a squared-exponential kernel of length scale ``lengthscale``:

    p_i <- p_i - lr / n * sum_j k(p_j, p_i) (grad_j + (p_j - p_i) / lengthscale^2)

The first term descends the kernel-weighted loss; the second pushes the particles apart.
PusH's train_svgd adds the kernel's gradient with the opposite sign, which pulls the
particles together (docs/python.md). For a torch.nn.Sequential of standard layers,
push.bayes.SVGD trains in C++ with a prior and a bandwidth rule.

``bayes_infer`` itself trains on push's C++ engine (push.bayes.SVGD, fused, plain SGD at
``lr``, bandwidth 2 lengthscale^2, the gradient of the batch's mean loss: likelihood_weight
1) when the run means what the engine computes (push.bayes.engine_route); else as above.
"""

from typing import Callable, Dict, List, Optional

import torch

from push.bayes import engine_route
from push.bayes.ensemble import _ensemble_pred
from push.bayes.particle_infer import (Infer, batches_of, check_finite, check_int, check_number, combine, mean_loss,
                                       step_on, train_keys)
from push.bayes.routed_run import RoutedRun


def torch_squared_exp_kernel(x: torch.Tensor, y: torch.Tensor, length_scale: float) -> torch.Tensor:
    """k(x, y) = exp(-|x - y|^2 / (2 length_scale^2)), as PusH's."""
    diff = (x - y) / length_scale
    return torch.exp(-0.5 * torch.dot(diff, diff))


def torch_squared_exp_kernel_grad(x: torch.Tensor, y: torch.Tensor, length_scale: float) -> torch.Tensor:
    """The gradient of k(x, y) with respect to x."""
    return -(x - y) / length_scale**2 * torch_squared_exp_kernel(x, y, length_scale)


def svgd_updates(params: torch.Tensor, grads: torch.Tensor, lengthscale: float) -> torch.Tensor:
    """SVGD's update of every particle ([n, d] each): row i is
    1/n sum_j k(p_j, p_i) grad_j - grad_{p_j} k(p_j, p_i), to be subtracted times lr."""
    n = params.size(0)
    # Centred first: both terms only see differences between particles, and close particles
    # of many parameters would otherwise lose them to rounding (kernel @ params against
    # rowsum * params; cdist's matrix-product form, its default above 25 rows).
    params = params - params.mean(dim=0, keepdim=True)
    distances = torch.cdist(params, params, compute_mode="donot_use_mm_for_euclid_dist")
    kernel = torch.exp(-0.5 * distances.pow(2) / lengthscale**2)  # symmetric
    repulsion = (kernel @ params - kernel.sum(dim=1, keepdim=True) * params) / lengthscale**2
    return (kernel @ grads + repulsion) / n


def _flat(tensors, like=None) -> torch.Tensor:
    """``tensors`` flattened into one vector; a missing one (None: a parameter without a
    gradient yet) is zeros shaped as its counterpart in ``like``."""
    return torch.cat([(torch.zeros_like(like[i]) if t is None else t).detach().reshape(-1)
                      for i, t in enumerate(tensors)])


_svgd_step = step_on


def _svgd_follow(particle, lr: float, update: torch.Tensor) -> None:
    """Moves this particle by ``-lr * update`` (its flattened parameters' update)."""
    update = update.to(particle.device)
    with torch.no_grad():
        offset = 0
        for p in particle.module.parameters():
            p.add_(update[offset:offset + p.numel()].view_as(p), alpha=-lr)
            offset += p.numel()


def _svgd_leader(particle, prior, loss_fn: Callable, lengthscale: float, lr: float, dataloader, epochs: int,
                 bootstrap: bool = False) -> List[float]:
    """The lead particle's loop (PusH's); returns its mean loss per epoch: the loss of each
    batch before its update (PusH's showed the loss after it)."""
    if bootstrap:
        raise ValueError("push.bayes.stein_vgd: bootstrap is not defined for SVGD (PusH has none either)")
    others = particle.other_particles()
    losses = []
    for epoch in range(epochs):
        mine, steps = [], []
        for data, label in batches_of(dataloader, "push.bayes.stein_vgd"):
            futures = [particle.send(pid, "SVGD_STEP", loss_fn, data, label) for pid in others]
            mine.append(particle.step(loss_fn, data, label).wait())
            steps += [(particle.pid, mine[-1])] + list(zip(others, particle.wait(futures)))
            views = particle.wait([particle.get(pid) for pid in others])
            own = list(particle.module.parameters())
            params = [_flat(own)] + [_flat(v.parameters()).to(particle.device) for v in views]
            grads = [_flat([p.grad for p in own], own)]
            grads += [_flat(v.gradients(), v.parameters()).to(particle.device) for v in views]
            updates = svgd_updates(torch.stack(params), torch.stack(grads), lengthscale)
            if not bool(torch.isfinite(updates).all()):  # would leave NaN weights behind, with no loss to show it
                pid = ([particle.pid] + others)[int((~torch.isfinite(updates)).any(dim=1).nonzero()[0])]
                raise RuntimeError(f"push.bayes.stein_vgd: the SVGD update of particle {pid} is non-finite in epoch "
                                   f"{epoch + 1}: training diverged; lower the learning rate or check the data for "
                                   "huge values")
            futures = [particle.send(pid, "SVGD_FOLLOW", lr, updates[i + 1]) for i, pid in enumerate(others)]
            _svgd_follow(particle, lr, updates[0])
            particle.wait(futures)
        check_finite("push.bayes.stein_vgd", epoch, steps)
        losses.append(mean_loss(mine))
    return losses


class SteinVGD(RoutedRun, Infer):
    """PusH's SteinVGD: ``bayes_infer`` trains, ``posterior_pred`` predicts."""

    _where = "push.bayes.stein_vgd"
    _kind = "SVGD"

    def bayes_infer(self, dataloader, epochs: int, prior=False, random_seed: bool = False, bootstrap: bool = False,
                    loss_fn: Callable = torch.nn.MSELoss(), num_particles: int = 1, lengthscale: float = 1.0,
                    lr: float = 1e-3, svgd_entry=_svgd_leader, svgd_state: Optional[Dict] = None,
                    engine: Optional[bool] = None):
        """Creates ``num_particles`` particles and trains them ``epochs`` epochs. push's
        addition: ``engine`` (None trains on push's C++ engine when the run means what it
        computes, else as Python code with a warning saying why; True insists; False never)."""
        check_int(self._where, "epochs", epochs, 0)
        check_int(self._where, "num_particles", num_particles, 1)
        check_number(self._where, "lengthscale", lengthscale)
        check_number(self._where, "lr", lr)
        if not 0 < float(lengthscale) * float(lengthscale) < float("inf"):
            raise ValueError(f"{self._where}: lengthscale {lengthscale} is out of range (its square is "
                             f"{float(lengthscale) * float(lengthscale)})")
        if bootstrap:
            raise ValueError(f"{self._where}: bootstrap is not defined for SVGD (PusH has none either)")
        if engine not in (None, True, False):
            raise ValueError(f"{self._where}: engine must be None, True or False, got {engine!r}")
        self._refuse_second_run()
        if engine is not False:
            route = engine_route.decide(engine, self._plan(dataloader, prior, random_seed, loss_fn, num_particles,
                                                           lengthscale, lr, svgd_entry, svgd_state), self._where)
            if route is not None:
                return self._train_routed(route, epochs)
        keys = train_keys(random_seed, num_particles)
        receive = {"SVGD_STEP": _svgd_step, "SVGD_FOLLOW": _svgd_follow, "ENSEMBLE_PRED": _ensemble_pred}
        pids = [self.push_dist.p_create(None, None, prior, keys[n], device=n % self.num_devices,
                                        receive=dict(receive, **({"SVGD_LEADER": svgd_entry} if n == 0 else {})),
                                        state=dict(svgd_state or {}))
                for n in range(num_particles)]
        result = self.push_dist.p_launch(pids[0], "SVGD_LEADER", prior, loss_fn, lengthscale, lr, dataloader,
                                         epochs, bootstrap).wait()
        if isinstance(result, list):
            self.losses += result
        return self

    def _plan(self, dataloader, prior=False, random_seed: bool = False, loss_fn=torch.nn.MSELoss(),
              num_particles: int = 1, lengthscale: float = 1.0, lr: float = 1e-3, svgd_entry=_svgd_leader,
              svgd_state=None, bootstrap: bool = False):
        """bayes_infer's run on the C++ engine (an engine_route.Route), or why it trains as Python code."""
        python_only = next((why for cond, why in (
            (svgd_entry is not _svgd_leader, "svgd_entry replaces PusH's training loop"),
            (svgd_state is not None, "svgd_state is read by PusH's training loop"),
            (bool(prior), "prior is given to PusH's particles"),
            (random_seed, "random_seed=True draws the particles' seeds from torch's generator"),
            (bool(bootstrap), "bootstrap is not defined for SVGD"),
            (self._routed is not None, "this SteinVGD trained on the engine: a second bayes_infer is refused"),
            (self._trained_before(), "this SteinVGD has trained particles: bayes_infer adds to them PusH's way"))
            if cond), "")
        options = dict(particles=num_particles, seed=self.seed)
        options.update(engine_route.lanes(self._dist_options["devices"], self._dist_options["cache_size"],
                                          num_particles))
        return engine_route.plan(self.mk_nn, self.args, dataloader, loss_fn, engine_route.sgd_steps(lr, lengthscale),
                                 True, python_only, options)

    def posterior_pred(self, data, f_reg: bool = True, mode=("mean",)) -> Dict[str, torch.Tensor]:
        """The particles' prediction on ``data`` (a tensor or a DataLoader) in each ``mode``
        (push.bayes.particle_infer.combine lists them): {mode: tensor}."""
        if self._routed is not None:
            return combine(self._routed_outputs(data), f_reg, mode)
        return combine(self._gather("ENSEMBLE_PRED", data), f_reg, mode)


def train_svgd(dataloader, loss_fn: Callable, epochs: int, num_particles: int, nn: Callable, *args,
               lengthscale: float = 1.0, lr: float = 1e-3, prior=None, num_devices: int = 1, cache_size: int = 4,
               view_size: int = 4, svgd_entry=_svgd_leader, svgd_state: Optional[Dict] = None,
               random_seed: bool = False, seed: int = 0, engine: Optional[bool] = None) -> SteinVGD:
    """Trains ``num_particles`` networks ``nn(*args)`` by SVGD, as PusH's does; returns the
    SteinVGD (``posterior_pred``, ``p_parameters``, ``losses``, ``close``). ``engine``:
    SteinVGD.bayes_infer's (None trains on push's C++ engine when it can)."""
    stein_vgd = SteinVGD(nn, *args, num_devices=num_devices, cache_size=cache_size, view_size=view_size, seed=seed)
    try:
        stein_vgd.bayes_infer(dataloader, epochs, prior=prior, random_seed=random_seed, loss_fn=loss_fn,
                              num_particles=num_particles, lengthscale=lengthscale, lr=lr, svgd_entry=svgd_entry,
                              svgd_state=svgd_state, engine=engine)
    except BaseException:
        stein_vgd.close()
        raise
    return stein_vgd
