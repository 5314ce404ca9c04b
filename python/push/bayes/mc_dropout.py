"""PusH's MC dropout (``push.bayes.mc_dropout``) on push's particles, as Python code.

``train_mc_dropout`` / ``MultiMCDropout.bayes_infer`` train an ensemble of networks with
dropout (the lead particle walks the DataLoader, steps, and sends each batch to the others);
``posterior_pred`` draws ``num_samples`` forward passes from each with dropout on and
combines them in PusH's modes. With ``freeze_on_eval`` each pass keeps one dropout mask per
feature for the whole batch (PusH's FixableDropout) instead of one per value. For a
``torch.nn.Sequential`` of standard layers, push.bayes.MCDropout trains in C++.
"""

from typing import Callable, Dict

import torch
import torch.nn.functional as F

from push.bayes.particle_infer import Infer, batches, check_folder, check_int, combine, run_epochs, step_on


class FixableDropout(torch.nn.Module):
    """Dropout that stays on in evaluation mode; there, with ``freeze_on_eval``, one mask per
    feature is drawn for the whole batch (PusH's FixableDropout)."""

    def __init__(self, p: float, freeze_on_eval: bool = True):
        super().__init__()
        self.p = float(p)
        self.freeze_on_eval = freeze_on_eval

    def forward(self, x):
        if not self.training and self.freeze_on_eval:
            keep = torch.full(x.shape[1:], 1.0 - self.p, device=x.device, dtype=x.dtype)
            return x * torch.bernoulli(keep)  # unscaled, as PusH's
        return F.dropout(x, self.p, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p:.3}"


def patch_dropout(module: torch.nn.Module, freeze_on_eval: bool = True) -> torch.nn.Module:
    """Replaces each torch.nn.Dropout child of ``module`` by a FixableDropout of the same
    rate (used with ``module.apply``); returns ``module``."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Dropout):
            setattr(module, name, FixableDropout(child.p, freeze_on_eval))
    return module


def mk_module(mk_nn: Callable, patch: bool, *args) -> torch.nn.Module:
    """``mk_nn(*args)``, its dropout layers patched when ``patch``."""
    module = mk_nn(*args)
    return module.apply(patch_dropout) if patch else module


def mk_optim(params):
    """PusH's default optimizer of this module: Adam at 1e-4 with weight decay 1e-2."""
    return torch.optim.Adam(params, lr=1e-4, weight_decay=1e-2)


def _dropout_on(particle, freeze_on_eval: bool) -> None:
    """Evaluation mode with dropout on: patched layers in eval (frozen masks), plain ones in
    train; or everything in train when not ``freeze_on_eval``."""
    module = particle.module
    if not freeze_on_eval:
        module.train()
        return
    module.eval()
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.train()


def _multimc_step(particle, loss_fn: Callable, data, label, *args):
    particle.module.train()
    return step_on(particle, loss_fn, data, label, *args)


def _multimc_main(particle, dataloader, loss_fn: Callable, epochs: int):
    """The lead particle's loop; returns its mean loss per epoch."""
    particle.module.train()
    return run_epochs(particle, [dataloader], particle.other_particles(), loss_fn, "MULTIMC_STEP", epochs,
                      lambda: None, "push.bayes.mc_dropout")


def _multimc_pred(particle, data, num_samples: int, freeze_on_eval: bool):
    """``num_samples`` forward passes with dropout on: [num_samples, N, ...]."""
    _dropout_on(particle, freeze_on_eval)
    with torch.no_grad():
        return torch.stack([particle.forward(data).wait().detach().cpu() for _ in range(num_samples)])


class MultiMCDropout(Infer):
    """PusH's MultiMCDropout: ``bayes_infer`` trains ``size_ensemble`` networks with dropout,
    ``posterior_pred`` samples them."""

    _where = "push.bayes.mc_dropout"

    def __init__(self, mk_nn: Callable, *args, patch: bool = True, num_devices: int = 1, cache_size: int = 4,
                 view_size: int = 4, seed: int = 0):
        super().__init__(mk_module, mk_nn, patch, *args, num_devices=num_devices, cache_size=cache_size,
                         view_size=view_size, seed=seed)
        self.pids = []

    def bayes_infer(self, dataloader, epochs: int, loss_fn: Callable = torch.nn.CrossEntropyLoss(),
                    size_ensemble: int = 2, mk_optim: Callable = mk_optim, mk_scheduler=None, f_save=False,
                    mc_entry: Callable = _multimc_main):
        check_int(self._where, "epochs", epochs, 0)
        check_int(self._where, "size_ensemble", size_ensemble, 1)
        folder = check_folder(self._where, f_save)
        receive = {"MULTIMC_STEP": _multimc_step, "MULTIMC_PRED": _multimc_pred}
        self.pids = [self.push_dist.p_create(mk_optim, mk_scheduler, device=n % self.num_devices,
                                             receive=dict(receive, **({"MULTIMC_MAIN": mc_entry} if n == 0 else {})))
                     for n in range(size_ensemble)]
        result = self.push_dist.p_launch(self.pids[0], "MULTIMC_MAIN", dataloader, loss_fn, epochs).wait()
        if isinstance(result, list):
            self.losses += result
        if folder is not None:
            self.push_dist.save(folder)
        return self

    def posterior_pred(self, data, f_reg: bool = True, mode="mean", num_samples: int = 10,
                       freeze_on_eval: bool = False):
        """Every particle's ``num_samples`` passes on ``data`` (a tensor or a DataLoader),
        combined in ``mode`` (push.bayes.particle_infer.combine; PusH's "raw" is "pred"): a
        tensor for one mode given as a string, else {mode: tensor}."""
        check_int(self._where, "num_samples", num_samples, 1)
        if not self.pids:
            raise ValueError(f"{self._where}: there are no particles yet: bayes_infer trains them first")
        modes = ["pred" if m == "raw" else m for m in ([mode] if isinstance(mode, str) else mode)]
        per_batch = []
        for x in batches(data):
            futures = [self.push_dist.p_launch(pid, "MULTIMC_PRED", x, num_samples, freeze_on_eval)
                       for pid in self.pids]
            per_batch.append(torch.cat([f.wait() for f in futures]))  # [particles * samples, N, ...]
        samples = torch.cat(per_batch, dim=1)
        out: Dict[str, torch.Tensor] = combine(list(samples), f_reg, modes)
        return out[modes[0]] if isinstance(mode, str) else out


def train_mc_dropout(dataloader, loss_fn: Callable, epochs: int, nn: Callable, *args, num_devices: int = 1,
                     cache_size: int = 4, view_size: int = 4, size_ensemble: int = 2, mk_optim: Callable = mk_optim,
                     mc_entry: Callable = _multimc_main, patch: bool = False, seed: int = 0) -> MultiMCDropout:
    """Trains PusH's MC-dropout ensemble and returns it (close it, or use ``with``)."""
    model = MultiMCDropout(nn, *args, patch=patch, num_devices=num_devices, cache_size=cache_size,
                           view_size=view_size, seed=seed)
    try:
        return model.bayes_infer(dataloader, epochs, loss_fn, size_ensemble, mk_optim, mc_entry=mc_entry)
    except BaseException:
        model.close()
        raise
