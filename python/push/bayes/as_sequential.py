"""A torch.nn.Module whose forward is a chain of layers, as the torch.nn.Sequential of those
layers, so that push's C++ engine can rebuild it.

PusH's programs define their networks as classes with a ``forward`` (``self.b(torch.tanh(
self.a(x)))``); the engine rebuilds a Sequential of standard layers. torch.fx traces the
forward; when its graph is one chain from the input to the output, each link a submodule
(used once, or any number of times when it holds no parameters or buffers: a ReLU), an
element-wise activation called with the chain's value alone, or a flattening of all but
the first dimension (``torch.flatten(h, 1)``, ``h.flatten(1)``, ``h.view(h.size(0), -1)``,
``h.reshape(h.size(0), -1)``: a Flatten), the chain is that Sequential, holding the
module's own layers (the same parameters, not copies). The
forward is traced twice, and two different chains are refused; a forward whose Python
branches trace alike twice and differ later (a rare random draw) is beyond what a trace sees.
"""

import inspect
from typing import Tuple, Union

import torch
import torch.fx

_F = torch.nn.functional

# Activations a forward may call as functions or tensor methods, as the layer that does it.
_FUNCTIONS = {
    torch.relu: torch.nn.ReLU, _F.relu: torch.nn.ReLU, torch.tanh: torch.nn.Tanh, _F.tanh: torch.nn.Tanh,
    torch.sigmoid: torch.nn.Sigmoid, _F.sigmoid: torch.nn.Sigmoid, _F.gelu: torch.nn.GELU, _F.silu: torch.nn.SiLU,
    _F.softplus: torch.nn.Softplus, _F.elu: torch.nn.ELU, _F.leaky_relu: torch.nn.LeakyReLU,
}
_METHODS = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid}


def as_sequential(module: torch.nn.Module) -> Union[torch.nn.Sequential, str]:
    """``module`` itself when it is a Sequential; else the Sequential its forward's chain
    is, or why it is not one (a one-line reason)."""
    if isinstance(module, torch.nn.Sequential):
        return module
    # Traced twice: a forward that branches on Python values (random depth, say) may trace
    # to another chain each time, and no one chain is what it computes.
    first, second = _chain(module), _chain(module)
    if isinstance(first, str):
        return first
    if isinstance(second, str) or [type(m) if _made(m, module) else id(m) for m in first] != \
            [type(m) if _made(m, module) else id(m) for m in second]:
        return f"{type(module).__name__}'s forward traces to different chains (it branches on Python values)"
    return first


def _made(layer: torch.nn.Module, module: torch.nn.Module) -> bool:
    """Whether ``layer`` is an activation made for the chain, not one of the module's own."""
    return all(layer is not m for m in module.modules())


def _chain(module: torch.nn.Module) -> Union[torch.nn.Sequential, str]:
    name = type(module).__name__
    try:
        graph = torch.fx.symbolic_trace(module).graph
    except Exception as e:  # noqa: BLE001 - any tracing failure is a reason, not an error
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"{name}'s forward could not be traced ({first})"
    layers, used = [], set()
    previous = None
    for node in graph.nodes:
        if _leading_size(node, previous):
            continue  # h.size(0) of a h.view(h.size(0), -1): read with the view
        if node.op == "placeholder":
            if previous is not None:
                return f"{name}'s forward takes more than one input"
            previous = node
            continue
        if node.op == "output":
            if node.args != (previous,):
                return f"{name}'s forward does not return its chain's last value"
            break
        step, why = _link(module, node, previous, used)
        if why:
            return f"{name}'s forward is not a chain of layers: {why}"
        layers.append(step)
        previous = node
    if not layers:
        return f"{name}'s forward has no layer"
    return torch.nn.Sequential(*layers)


def _defaults(node) -> bool:
    """Whether ``node``'s keyword arguments are all its function's defaults (F.relu's
    inplace=False, as the trace records it)."""
    if not node.kwargs:
        return True
    try:
        params = inspect.signature(node.target).parameters
    except (TypeError, ValueError):
        return False
    return all(k in params and params[k].default == v for k, v in node.kwargs.items())


def _leading_size(node, previous) -> bool:
    """Whether ``node`` is ``previous.size(0)`` read only by a view or reshape of ``previous``."""
    return (node.op == "call_method" and node.target == "size" and node.args == (previous, 0) and not node.kwargs
            and len(node.users) == 1 and _flattens(next(iter(node.users)), previous))


def _flattens(node, previous) -> bool:
    """Whether ``node`` flattens ``previous`` to [batch, everything else]."""
    if node.kwargs:
        return False
    if node.op == "call_function" and node.target is torch.flatten or node.op == "call_method" and \
            node.target == "flatten":
        return node.args in ((previous, 1), (previous, 1, -1))
    if node.op == "call_method" and node.target in ("view", "reshape") and len(node.args) == 3:
        size = node.args[1]
        return (node.args[0] is previous and node.args[2] == -1 and isinstance(size, torch.fx.Node)
                and size.op == "call_method" and size.target == "size" and size.args == (previous, 0))
    return False


def _link(module: torch.nn.Module, node, previous, used: set) -> Tuple[torch.nn.Module, str]:
    """The layer that ``node`` is, when it takes the chain's value ``previous`` alone."""
    if _flattens(node, previous):
        return torch.nn.Flatten(), ""
    if node.args != (previous,) or not _defaults(node):
        return None, f"{node.name} takes other arguments than the value before it"
    if node.op == "call_module":
        layer = module.get_submodule(node.target)
        stateless = not any(True for _ in layer.parameters()) and not any(True for _ in layer.buffers())
        if node.target in used and not stateless:
            return None, f"the layer {node.target} is used twice"
        used.add(node.target)
        return layer, ""
    if node.op == "call_function" and node.target in _FUNCTIONS:
        return _FUNCTIONS[node.target](), ""
    if node.op == "call_method" and node.target in _METHODS:
        return _METHODS[node.target](), ""
    what = getattr(node.target, "__name__", str(node.target))
    return None, f"{node.op} {what} is not a layer or an activation push rebuilds"
