"""PusH's deep ensemble, as PusH's users call it, on push's particles.

``train_deep_ensemble`` trains any torch.nn.Module as Python code (the Python path): the
lead particle walks the DataLoader and steps on each batch, and sends every batch to the
other particles, which step on it too, as PusH does. For a torch.nn.Sequential of standard
layers, the same class trains in C++ with ``fit`` (push.bayes.Ensemble is this class).
"""

from typing import Callable, Dict, Optional

import torch

from push.bayes import engine_route
from push.bayes.both_ways import TrainsBothWays
from push.bayes.particle_infer import (Infer, adam, bootstrap_loaders, check_folder, check_int, check_number,
                                       combine, constant_scheduler, run_epochs, step_on, train_keys)

mk_scheduler = constant_scheduler
create_optimizer = adam  # PusH's: Adam at lr


def mk_optim(params):
    """PusH's default optimizer factory of this module: Adam at 0.03."""
    return torch.optim.Adam(params, lr=0.03)


def mk_empty_scheduler(optim):
    """No scheduler (PusH's mk_empty_scheduler)."""
    return None


def _deep_ensemble_main(particle, dataloader, loss_fn: Callable, epochs: int, bootstrap: bool = False):
    """The lead particle's loop; returns its mean loss per epoch. Each epoch ends with every
    particle's scheduler step."""
    others = particle.other_particles()
    loaders = (bootstrap_loaders(dataloader, len(others) + 1, particle.state.get("_seed", 0)) if bootstrap
               else [dataloader])

    def scheduler_steps():
        particle.wait([particle.send(pid, "SCHEDULER_STEP") for pid in others])
        _ensemble_scheduler_step(particle)

    return run_epochs(particle, loaders, others, loss_fn, "ENSEMBLE_STEP", epochs, scheduler_steps,
                      "push.bayes.ensemble")


_ensemble_step = step_on


def _ensemble_scheduler_step(particle, *args):
    if particle.scheduler is not None:
        particle.scheduler_step(*args)


def _ensemble_pred(particle, data):
    with torch.no_grad():
        return particle.forward(data).wait().detach().cpu()


class Ensemble(TrainsBothWays, Infer):
    """A deep ensemble, trained either way (push.bayes.both_ways): PusH's ``bayes_infer``
    and ``posterior_pred`` on any torch.nn.Module, or push's ``fit`` and ``predict`` in C++
    for a torch.nn.Sequential of standard layers, with push.bayes.Infer's options and
    ``bootstrap`` (False) as keyword arguments."""

    _where = "push.bayes.ensemble"
    _kind = "Ensemble"

    def __init__(self, mk_nn, *args, num_devices: int = 1, cache_size: int = 4, view_size: int = 4, seed: int = 0,
                 **options):
        Infer.__init__(self, mk_nn, *args, num_devices=num_devices, cache_size=cache_size, view_size=view_size,
                       seed=seed)
        self._start(mk_nn, args, seed, num_devices, cache_size, options)

    def bayes_infer(self, dataloader, epochs: int, loss_fn: Callable = torch.nn.MSELoss(), lr: float = 0.01,
                    num_ensembles: int = 2, mk_scheduler: Optional[Callable] = mk_scheduler, prior: bool = False,
                    random_seed: bool = False, bootstrap: bool = False, ensemble_entry=_deep_ensemble_main,
                    ensemble_state: Optional[Dict] = None, f_save: bool = False, mk_optim: Optional[Callable] = None,
                    engine: Optional[bool] = None):
        """Creates ``num_ensembles`` particles and trains them ``epochs`` epochs.
        push's additions: ``mk_optim`` replaces PusH's Adam at ``lr``; ``engine``: None
        trains on push's C++ engine when the run means what it computes (push.bayes.
        engine_route; else as Python code, with a warning saying why), True insists on
        it, False keeps the Python path. ``f_save``: True saves the particles to the
        folder "particles" (PusH's), a path to that folder."""
        check_int(self._where, "epochs", epochs, 0)
        check_int(self._where, "num_ensembles", num_ensembles, 1)
        self._fit_last = False
        check_number(self._where, "lr", lr)
        folder = check_folder(self._where, f_save)
        if engine not in (None, True, False):
            raise ValueError(f"{self._where}: engine must be None, True or False, got {engine!r}")
        self._refuse_second_run()
        if engine is not False:
            route = engine_route.decide(engine, self._plan(dataloader, loss_fn, lr, num_ensembles, mk_scheduler,
                                                           prior, random_seed, bootstrap, ensemble_entry,
                                                           ensemble_state, f_save, mk_optim), self._where)
            if route is not None:
                return self._train_routed(route, epochs)
        mk_optim = mk_optim or adam(lr)
        keys = train_keys(random_seed, num_ensembles)
        state = dict(ensemble_state or {}, _seed=self.seed)
        receive = {"ENSEMBLE_STEP": _ensemble_step, "ENSEMBLE_PRED": _ensemble_pred,
                   "SCHEDULER_STEP": _ensemble_scheduler_step}
        pids = [self.push_dist.p_create(mk_optim, mk_scheduler, prior, keys[n], device=n % self.num_devices,
                                        receive=dict(receive, **({"ENSEMBLE_MAIN": ensemble_entry} if n == 0
                                                                 else {})), state=state if n == 0 else {})
                for n in range(num_ensembles)]
        result = self.push_dist.p_launch(pids[0], "ENSEMBLE_MAIN", dataloader, loss_fn, epochs, bootstrap).wait()
        if isinstance(result, list):
            self.losses += result
        if folder is not None:
            self.push_dist.save(folder)
        return self

    def _plan(self, dataloader, loss_fn=torch.nn.MSELoss(), lr: float = 0.01, num_ensembles: int = 2,
              mk_scheduler=mk_scheduler, prior: bool = False, random_seed: bool = False, bootstrap: bool = False,
              ensemble_entry=_deep_ensemble_main, ensemble_state=None, f_save=False, mk_optim=None):
        """bayes_infer's run on the C++ engine (an engine_route.Route), or why it trains as Python code."""
        python_only = next((why for cond, why in (
            (ensemble_entry is not _deep_ensemble_main, "ensemble_entry replaces PusH's training loop"),
            (ensemble_state is not None, "ensemble_state is read by PusH's training loop"),
            (prior, "prior=True trains PusH's randomized prior as Python code"),
            (random_seed, "random_seed=True draws the particles' seeds from torch's generator"),
            (bool(f_save), "f_save writes PusH's particle files"),
            (self._routed is not None, "this Ensemble trained on the engine: a second bayes_infer is refused"),
            (self._trained_before(), "this Ensemble has trained particles: bayes_infer adds to them PusH's way"))
            if cond), "")
        neutral = mk_scheduler is None or mk_scheduler in (constant_scheduler, mk_empty_scheduler)
        options = dict(particles=num_ensembles, seed=self.seed, bootstrap=bool(bootstrap))
        options.update(engine_route.lanes(self._dist_options["devices"], self._dist_options["cache_size"],
                                          num_ensembles))
        return engine_route.plan(self.mk_nn, self.args, dataloader, loss_fn, engine_route.adam_steps(mk_optim, lr),
                                 neutral, python_only, options)

    def posterior_pred(self, data, f_reg: bool = True, mode=("mean",)) -> Dict[str, torch.Tensor]:
        """The ensemble's prediction on ``data`` (a tensor or a DataLoader) in each ``mode``
        (push.bayes.particle_infer.combine lists them): {mode: tensor}."""
        if self._routed is not None:
            return combine(self._routed_outputs(data), f_reg, mode)
        return combine(self._gather("ENSEMBLE_PRED", data), f_reg, mode)


def train_deep_ensemble(dataloader, loss_fn: Callable, epochs: int, nn: Callable, *args, lr: float = 0.01,
                        num_devices: int = 1, cache_size: int = 4, view_size: int = 4, num_ensembles: int = 2,
                        prior: bool = False, random_seed: bool = False, bootstrap: bool = False,
                        ensemble_entry=_deep_ensemble_main, ensemble_state: Optional[Dict] = None,
                        mk_optim: Optional[Callable] = None, seed: int = 0, engine: Optional[bool] = None) -> Ensemble:
    """Trains ``num_ensembles`` networks ``nn(*args)`` on ``dataloader`` for ``epochs``
    epochs with Adam at ``lr``, as PusH's does; returns the Ensemble (``posterior_pred``,
    ``p_parameters``, ``losses``, ``close``).

    push's additions: ``mk_optim`` (an optimizer factory instead of Adam at ``lr``),
    ``engine`` (Ensemble.bayes_infer's: None trains on push's C++ engine when it can) and
    ``seed`` (the run's seed; ``random_seed=True`` makes each particle under a seed drawn
    from torch's generator instead, as PusH does).
    ``num_devices`` device lanes (GPUs, or CPU lanes without GPUs) share the particles.
    """
    ensemble = Ensemble(nn, *args, num_devices=num_devices, cache_size=cache_size, view_size=view_size,
                        seed=seed)
    try:
        ensemble.bayes_infer(dataloader, epochs, loss_fn=loss_fn, lr=lr, num_ensembles=num_ensembles, prior=prior,
                             random_seed=random_seed, bootstrap=bootstrap, ensemble_entry=ensemble_entry,
                             ensemble_state=ensemble_state, mk_optim=mk_optim, engine=engine)
    except BaseException:
        ensemble.close()
        raise
    return ensemble
