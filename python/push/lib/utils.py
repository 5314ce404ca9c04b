"""PusH's ``push.lib.utils``: moving nested values (dicts, lists, tuples of tensors) between
devices, detached or not. Anything that is not a tensor or a container is returned as it is."""

from typing import Any

import torch


def _map(val: Any, leaf) -> Any:
    if isinstance(val, dict):
        return {k: _map(v, leaf) for k, v in val.items()}
    if isinstance(val, list):
        return [_map(v, leaf) for v in val]
    if isinstance(val, tuple):
        return tuple(_map(v, leaf) for v in val)
    if isinstance(val, torch.Tensor):
        return leaf(val)
    return val


def to_device(device, val: Any) -> Any:
    """``val`` with every tensor moved to ``device`` (still in its graph)."""
    return _map(val, lambda t: t.to(device))


def detach_to_device(device, val: Any, requires_grad: bool = False) -> Any:
    """``val`` with every tensor detached and moved to ``device``; with ``requires_grad``,
    floating-point tensors become leaves that require gradients (as PusH's does, for CPU
    float32 tensors)."""

    def leaf(t: torch.Tensor) -> torch.Tensor:
        out = t.detach().to(device)
        if requires_grad and t.dtype == torch.float32 and t.device.type == "cpu":
            out = out.requires_grad_()
        return out

    return _map(val, leaf)


def detach_to_cpu(val: Any) -> Any:
    """``val`` with every tensor detached and moved to the CPU (tuples too: PusH's leaves them
    as they are, a defect there)."""
    return _map(val, lambda t: t.detach().to("cpu"))
