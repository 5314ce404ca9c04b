"""PusH's deep ensemble entry point, as PusH's users call it, on push's particles.

``train_deep_ensemble`` trains any torch.nn.Module as Python code (the Python path): the
first particle walks the DataLoader and steps on each batch, and sends every batch to the
other particles, which step on it too, as PusH does. For a torch.nn.Sequential of standard
layers, push.bayes.Ensemble trains the same kind of ensemble in C++.
"""

from typing import Callable, List

import torch

import push


def mk_optim(params):
    """PusH's default: Adam, lr 0.1, weight decay 0.01."""
    return torch.optim.Adam(params, lr=1e-1, weight_decay=1e-2)


def _deep_ensemble_main(particle, dataloader, loss_fn, epochs):
    others = particle.other_particles()
    for _ in range(epochs):
        pending = []
        for data, label in dataloader:
            particle.step(loss_fn, data, label).wait()
            pending += [particle.send(pid, "ENSEMBLE_STEP", loss_fn, data, label) for pid in others]
        # Every member has taken every step of the epoch before the next one starts (PusH
        # sent without waiting; here nothing is left running when training returns).
        particle.wait(pending)


def _ensemble_step(particle, loss_fn, data, label, *args):
    particle.step(loss_fn, data, label, *args)


def train_deep_ensemble(dataloader, loss_fn: Callable, epochs: int, nn: Callable, *args, num_devices: int = 1,
                        cache_size: int = 4, view_size: int = 4, num_ensembles: int = 2, mk_optim=mk_optim,
                        ensemble_entry=_deep_ensemble_main, ensemble_state=None, seed: int = 0) -> List[List[torch.Tensor]]:
    """Trains ``num_ensembles`` networks ``nn(*args)`` on ``dataloader`` for ``epochs``
    epochs; returns each one's parameters (CPU copies), as PusH's does.

    ``num_devices`` device lanes (GPUs, or CPU lanes without GPUs) share the particles.
    ``ensemble_entry(particle, dataloader, loss_fn, epochs)`` is the first particle's
    training loop and ``ensemble_state`` its state, as in PusH.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"push: epochs must be a non-negative int, got {epochs!r}")
    if isinstance(num_ensembles, bool) or not isinstance(num_ensembles, int) or num_ensembles < 1:
        raise ValueError(f"push: num_ensembles must be an int >= 1, got {num_ensembles!r}")
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"push: num_devices must be an int >= 1, got {num_devices!r}")
    with push.PusH(nn, *args, cache_size=cache_size, view_size=view_size, devices=num_devices, seed=seed) as dist:
        pids = [dist.p_create(mk_optim, device=0, receive={"ENSEMBLE_MAIN": ensemble_entry},
                              state=dict(ensemble_state or {}))]
        for n in range(1, num_ensembles):
            pids.append(dist.p_create(mk_optim, device=n % dist.num_devices(),
                                      receive={"ENSEMBLE_STEP": _ensemble_step}))
        dist.p_wait([dist.p_launch(pids[0], "ENSEMBLE_MAIN", dataloader, loss_fn, epochs)])
        return [dist.p_parameters(pid) for pid in pids]
