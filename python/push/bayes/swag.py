"""PusH's MultiSWAG, as PusH's users call it, on push's particles.

``train_mswag`` trains any torch.nn.Module as Python code: ``num_models`` particles train
``pretrain_epochs`` epochs, then ``swag_epochs`` more while each collects SWAG's moments of
its weights once per epoch (a running mean, a running second moment and the last
``cov_mat_rank`` deviations). ``posterior_pred`` samples each particle's Gaussian and
averages the predictions. For a torch.nn.Sequential of standard layers, the same class
trains in C++ with ``fit`` (push.bayes.MultiSWAG is this class).

Where push differs from PusH (docs/python.md): samples follow SWAG (Maddox et al. 2019),
mean + scale^1/2 (sigma z1 / sqrt 2 + D z2 / sqrt(2 (K - 1))), as push::bayes::MultiSWAG
does; PusH divides the low-rank part by sqrt(num_samples - 1) instead (infinite for one
sample). A particle's weights are put back after sampling (PusH left the last sample in).
"""

from typing import Callable, Dict, List, Optional

import torch

from push.bayes import engine_route
from push.bayes.both_ways import TrainsBothWays
from push.bayes.particle_infer import (Infer, adam, batches, bootstrap_loaders, check_folder, check_int,
                                       check_number, combine, constant_scheduler, mix, run_epochs, step_on,
                                       train_keys)

mk_scheduler = constant_scheduler


def create_optimizer(lr: float) -> Callable:
    """PusH's MultiSWAG optimizer: Adam at ``lr`` with weight decay lr / 1000."""
    return adam(lr, weight_decay=lr / 1e3)


_swag_step = step_on


def _swag_swag(particle, reset: bool, cov_mat_rank: int) -> None:
    """Starts (``reset``) or updates this particle's SWAG moments, kept in its state under
    its id as PusH keeps them: {"mom1", "mom2", "cov_mat_sqrt"} per parameter, and "n"."""
    state = particle.state
    with torch.no_grad():
        params = [p.detach() for p in particle.module.parameters()]
        if reset:
            state[particle.pid] = {"mom1": [p.clone() for p in params], "mom2": [p * p for p in params],
                                   "cov_mat_sqrt": [p.new_zeros((0, p.numel())) for p in params]}
            state["n"] = 1
            return
        moments, n = state[particle.pid], state["n"]
        for i, p in enumerate(params):
            mean = (moments["mom1"][i] * n + p) / (n + 1)
            moments["mom1"][i] = mean
            moments["mom2"][i] = (moments["mom2"][i] * n + p * p) / (n + 1)
            rows = torch.cat([moments["cov_mat_sqrt"][i], (p - mean).reshape(1, -1)])
            moments["cov_mat_sqrt"][i] = rows[-cov_mat_rank:] if cov_mat_rank > 0 else rows[:0]
        state["n"] = n + 1


def _mswag_particle(particle, dataloader, loss_fn: Callable, cov_mat_rank: int, pretrain_epochs: int,
                    swag_epochs: int, swag_pids: List[int], bootstrap: bool = False) -> List[float]:
    """The lead particle's loop (PusH's): pretraining, then SWAG epochs that end with every
    member updating its moments. Returns the lead's mean loss per epoch."""
    others = [pid for pid in swag_pids if pid != particle.pid]
    loaders = (bootstrap_loaders(dataloader, len(swag_pids), particle.state.get("_seed", 0)) if bootstrap
               else [dataloader])

    def collect(reset):
        futures = [particle.send(pid, "SWAG_SWAG", reset, cov_mat_rank) for pid in others]
        _swag_swag(particle, reset, cov_mat_rank)
        particle.wait(futures)

    where = "push.bayes.swag"
    losses = run_epochs(particle, loaders, others, loss_fn, "SWAG_STEP", pretrain_epochs, lambda: None, where)
    collect(True)
    losses += run_epochs(particle, loaders, others, loss_fn, "SWAG_STEP", swag_epochs, lambda: collect(False), where)
    return losses


def _mswag_pred(particle, data, scale: float, var_clamp: float, num_samples: int, f_reg: bool = True,
                seed: int = 0) -> torch.Tensor:
    """This particle's prediction on ``data``, averaged over ``num_samples`` weights drawn
    from its SWAG Gaussian (swag_average). The draws come from a generator of this
    particle's own, seeded from ``seed`` and its id: particles on several lanes draw at
    once, and a run repeats."""
    moments = particle.state.get(particle.pid)
    if moments is None:
        raise ValueError(f"push.bayes.swag: particle {particle.pid} has no SWAG moments yet (bayes_infer "
                         "collects them)")
    mean = torch.cat([m.reshape(-1) for m in moments["mom1"]])
    var = torch.cat([m.reshape(-1) for m in moments["mom2"]]) - mean * mean
    rows = torch.cat(moments["cov_mat_sqrt"], dim=1)  # [K, parameters]
    return swag_average(lambda: particle.forward(data).wait().detach().cpu(), list(particle.module.parameters()),
                        (mean, var, rows), scale, var_clamp, num_samples, f_reg, mix(seed, particle.pid))


def swag_average(forward: Callable[[], torch.Tensor], params: List[torch.Tensor], moments: tuple, scale: float,
                 var_clamp: float, num_samples: int, f_reg: bool, seed: int) -> torch.Tensor:
    """``forward()``'s output averaged over ``num_samples`` weights drawn into ``params``
    from the SWAG Gaussian of ``moments`` (mean, diagonal variance before ``var_clamp``,
    deviations [K, D], flat in ``params``' order), the weights put back after: regression
    outputs are averaged; for classification (``f_reg`` False) the probabilities over the
    classes (dimension 1), returned as their log (logits again)."""
    mean, var, rows = moments
    var = torch.clamp(var, min=var_clamp)
    k = rows.size(0)
    g = torch.Generator(device=mean.device).manual_seed(seed)
    kept = [p.detach().clone() for p in params]
    total = None
    try:
        with torch.no_grad():
            for _ in range(num_samples):
                theta = var.sqrt() * torch.randn(var.shape, generator=g, dtype=var.dtype, device=var.device)
                if k >= 2:
                    z = torch.randn(k, generator=g, dtype=rows.dtype, device=rows.device)
                    theta = (theta + rows.t().mv(z) / (k - 1) ** 0.5) / 2 ** 0.5
                sample = mean + scale ** 0.5 * theta
                offset = 0
                for p in params:
                    p.copy_(sample[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
                out = forward()
                out = out if f_reg else out.softmax(dim=1)
                total = out if total is None else total + out
    finally:
        with torch.no_grad():
            for p, v in zip(params, kept):
                p.copy_(v)
    average = total / num_samples
    return average if f_reg else average.clamp_min(torch.finfo(average.dtype).tiny).log()


class MultiSWAG(TrainsBothWays, Infer):
    """MultiSWAG, trained either way (push.bayes.both_ways): PusH's ``bayes_infer`` and
    ``posterior_pred`` on any torch.nn.Module, or push's ``fit`` and ``predict`` in C++ for a
    torch.nn.Sequential of standard layers, with push.bayes.Infer's options and
    ``pretrain_epochs`` (10), ``rank`` (10), ``collect_every_steps`` (0: each epoch),
    ``swag_lr``, ``collect_momentum`` (0.9), ``samples`` (10), ``min_variance`` as keyword
    arguments."""

    _where = "push.bayes.swag"
    _kind = "MultiSWAG"

    def __init__(self, mk_nn: Callable, *args, num_devices: int = 1, cache_size: int = 4, view_size: int = 4,
                 seed: int = 0, **options):
        Infer.__init__(self, mk_nn, *args, num_devices=num_devices, cache_size=cache_size, view_size=view_size,
                       seed=seed)
        self._start(mk_nn, args, seed, num_devices, cache_size, options)
        self.swag_pids: List[int] = []
        self._pred_calls = 0

    def bayes_infer(self, dataloader, pretrain_epochs: int, swag_epochs: int, loss_fn: Callable = torch.nn.MSELoss(),
                    lr: float = 0.01, num_models: int = 1, cov_mat_rank: int = 20, prior: bool = False,
                    random_seed: bool = False, bootstrap: bool = False, mswag_entry=_mswag_particle,
                    mswag_state: Optional[Dict] = None, f_save=False, mswag_sample_entry=None, mswag_sample=None,
                    mk_optim: Optional[Callable] = None, engine: Optional[bool] = None):
        """Creates ``num_models`` particles and trains them. ``mswag_sample_entry`` and
        ``mswag_sample`` (PusH's sampling hooks) are not used: posterior_pred samples.
        ``f_save``: True saves the particles to the folder "particles" (PusH's), a path to
        that folder. ``engine``: None trains on push's C++ engine when the run means what it
        computes (push.bayes.engine_route; else as Python code, with a warning saying why),
        True insists on it, False keeps the Python path."""
        check_int(self._where, "pretrain_epochs", pretrain_epochs, 0)
        check_int(self._where, "swag_epochs", swag_epochs, 0)
        self._fit_last = False
        check_int(self._where, "num_models", num_models, 1)
        check_int(self._where, "cov_mat_rank", cov_mat_rank, 0)
        check_number(self._where, "lr", lr)
        folder = check_folder(self._where, f_save)
        if mswag_state and "n" in mswag_state:
            raise ValueError(f"{self._where}: mswag_state may not hold 'n' (MultiSWAG counts its samples there)")
        if engine not in (None, True, False):
            raise ValueError(f"{self._where}: engine must be None, True or False, got {engine!r}")
        self._refuse_second_run()
        if engine is not False:
            route = engine_route.decide(engine, self._plan(dataloader, pretrain_epochs, swag_epochs, loss_fn, lr,
                                                           num_models, cov_mat_rank, prior, random_seed, bootstrap,
                                                           mswag_entry, mswag_state, f_save, mk_optim), self._where)
            if route is not None:
                self._swag_rows = min(swag_epochs, cov_mat_rank)  # the deviations PusH's form keeps
                return self._train_routed(route, pretrain_epochs + swag_epochs)
        mk_optim = mk_optim or create_optimizer(lr)
        keys = train_keys(random_seed, num_models)
        state = dict(mswag_state or {}, _seed=self.seed)  # each particle its own copy: its own count "n"
        receive = {"SWAG_STEP": _swag_step, "SWAG_SWAG": _swag_swag, "SWAG_PRED": _mswag_pred}
        self.swag_pids = [self.push_dist.p_create(mk_optim, mk_scheduler, prior, keys[n], device=n % self.num_devices,
                                                  receive=dict(receive, **({"SWAG_PARTICLE": mswag_entry} if n == 0
                                                                           else {})), state=dict(state))
                          for n in range(num_models)]
        result = self.push_dist.p_launch(self.swag_pids[0], "SWAG_PARTICLE", dataloader, loss_fn, cov_mat_rank,
                                         pretrain_epochs, swag_epochs, self.swag_pids, bootstrap).wait()
        if isinstance(result, list):
            self.losses += result
        if folder is not None:
            self.push_dist.save(folder)
        return self

    def _plan(self, dataloader, pretrain_epochs: Optional[int] = None, swag_epochs: int = 0, loss_fn=torch.nn.MSELoss(),
              lr: float = 0.01, num_models: int = 1, cov_mat_rank: int = 20, prior: bool = False,
              random_seed: bool = False, bootstrap: bool = False, mswag_entry=_mswag_particle, mswag_state=None,
              f_save=False, mk_optim=None):
        """bayes_infer's run on the C++ engine (an engine_route.Route), or why it trains as
        Python code. The engine's MultiSWAG collects at the end of each epoch from
        pretrain_epochs on; PusH's form collects the pretrained weights too: the engine's
        pretraining is one epoch shorter, and its first deviation (zero) is left out.
        ``pretrain_epochs`` None (explain without it): the run's other reasons."""
        python_only = next((why for cond, why in (
            (mswag_entry is not _mswag_particle, "mswag_entry replaces PusH's training loop"),
            (mswag_state is not None, "mswag_state is read by PusH's training loop"),
            (prior, "prior=True trains PusH's randomized prior as Python code"),
            (random_seed, "random_seed=True draws the particles' seeds from torch's generator"),
            (bool(bootstrap), "bootstrap resamples the data PusH's way; the engine's MultiSWAG has none"),
            (bool(f_save), "f_save writes PusH's particle files"),
            (pretrain_epochs == 0, "pretrain_epochs=0 collects the untrained weights, which the engine does not"),
            (self._routed is not None, "this MultiSWAG trained on the engine: a second bayes_infer is refused"),
            (self._trained_before(), "this MultiSWAG has trained particles: bayes_infer adds to them PusH's way"))
            if cond), "")
        options = dict(particles=num_models, seed=self.seed, pretrain_epochs=max((pretrain_epochs or 1) - 1, 0),
                       rank=max(cov_mat_rank, 1),  # the engine keeps one at least; none is read back
                       collect_every_steps=0, collect_momentum=None)
        options.update(engine_route.lanes(self._dist_options["devices"], self._dist_options["cache_size"],
                                          num_models))
        steps = engine_route.adam_steps(mk_optim, lr, weight_decay=lr / 1e3)  # create_optimizer's, by default
        return engine_route.plan(self.mk_nn, self.args, dataloader, loss_fn, steps, True, python_only, options)

    def _routed_moments(self, index: int, net: torch.nn.Module) -> tuple:
        """The routed particle's SWAG moments as PusH's form keeps them, flat in ``net``'s
        parameter order: (mean, diagonal variance, deviations [K, D]). The variance is the
        engine's double-precision second moment less the mean's square (in the weights'
        precision a small variance would be lost to cancellation)."""
        engine, route = self._routed
        pid = engine.particle_ids()[index]
        m = engine.swag_moments(pid)
        sizes = [t.numel() for _, t in engine.particle_parameters(pid)]
        where = dict(zip(route.names, range(len(sizes))))
        order = [where[name] for name, _ in net.named_parameters()]

        dtype = next(net.parameters()).dtype  # PusH's form keeps its moments as the weights (the engine in double)

        def reorder(flat):  # [..., D] from the engine's parameter order to net's
            parts = flat.split(sizes, dim=-1)
            return torch.cat([parts[i] for i in order], dim=-1).to(dtype)

        # The last rows: without the zero deviation of the pretrained weights, or the one
        # row a rank of 0 makes the engine keep.
        rows = m["deviations"][m["deviations"].size(0) - self._swag_rows:]
        return reorder(m["mean"]), reorder(m["sq_mean"] - m["mean"] * m["mean"]), reorder(rows)

    def posterior_pred(self, data, loss_fn=None, num_samples: int = 20, scale: float = 1.0, var_clamp: float = 1e-30,
                       mode=("mean",), f_reg: bool = True) -> Dict[str, torch.Tensor]:
        """The MultiSWAG prediction on ``data`` (a tensor or a DataLoader): each particle
        averages ``num_samples`` SWAG samples, then the particles combine in each ``mode``
        (push.bayes.particle_infer.combine lists them). ``loss_fn`` is PusH's and unused."""
        check_int(self._where, "num_samples", num_samples, 1)
        check_number(self._where, "scale", scale, positive=False)
        check_number(self._where, "var_clamp", var_clamp, positive=False)
        # Each call draws new samples; the same calls of the same run draw the same ones.
        self._pred_calls += 1
        seed = mix(self.seed, self._pred_calls)
        if self._routed is None:
            return combine(self._gather("SWAG_PRED", data, scale, var_clamp, num_samples, f_reg, seed), f_reg, mode)
        inputs = batches(data)
        if not inputs:
            raise ValueError(f"{self._where}: there is no data to predict on")
        outputs = []
        for index, net in enumerate(self._routed_modules()):
            moments, params = self._routed_moments(index, net), list(net.parameters())
            # As _mswag_pred: each batch from the particle's generator seeded anew (particle ids from 0 alike).
            outputs.append(torch.cat([swag_average(lambda: net(x.cpu()).detach(), params, moments, scale, var_clamp,
                                                   num_samples, f_reg, mix(seed, index)) for x in inputs]))
        return combine(outputs, f_reg, mode)


def train_mswag(dataloader, loss_fn: Callable, pretrain_epochs: int, swag_epochs: int, nn: Callable, *args,
                lr: float = 0.01, num_devices: int = 1, cache_size: int = 4, view_size: int = 4, num_models: int = 1,
                cov_mat_rank: int = 20, prior: bool = False, random_seed: bool = False, bootstrap: bool = False,
                mswag_entry=_mswag_particle, mswag_state: Optional[Dict] = None, f_save=False,
                mswag_sample_entry=None, mswag_sample=None, mk_optim: Optional[Callable] = None,
                seed: int = 0, engine: Optional[bool] = None) -> MultiSWAG:
    """Trains a MultiSWAG of ``num_models`` networks ``nn(*args)``, as PusH's does; returns
    the MultiSWAG (``posterior_pred``, ``p_parameters``, ``losses``, ``close``).
    push's additions: ``mk_optim``, ``seed`` and ``engine``, as train_deep_ensemble's."""
    mswag = MultiSWAG(nn, *args, num_devices=num_devices, cache_size=cache_size, view_size=view_size, seed=seed)
    try:
        mswag.bayes_infer(dataloader, pretrain_epochs, swag_epochs, loss_fn=loss_fn, lr=lr, num_models=num_models,
                          cov_mat_rank=cov_mat_rank, prior=prior, random_seed=random_seed, bootstrap=bootstrap,
                          mswag_entry=mswag_entry, mswag_state=mswag_state, f_save=f_save, mk_optim=mk_optim,
                          engine=engine)
    except BaseException:
        mswag.close()
        raise
    return mswag
