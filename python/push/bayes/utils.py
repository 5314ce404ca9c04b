"""PusH's ``push.bayes.utils``: parameters flattened into one vector and back (SWAG's form)."""

from typing import List, Sequence

import torch


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors' elements, one after another, as one 1-D tensor."""
    return torch.cat([t.contiguous().view(-1) for t in tensors])


def unflatten_like(vector: torch.Tensor, like: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """``vector`` [1, N] (PusH's row form) cut into tensors shaped like ``like``, in order, as
    views of it."""
    out, at = [], 0
    for t in like:
        n = t.numel()
        out.append(vector[:, at:at + n].view(t.shape))
        at += n
    return out
