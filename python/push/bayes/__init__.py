"""push's Bayesian deep learning from Python.

The classes here (Ensemble, MultiSWAG, SVGD, MCDropout, SGLD, SGHMC, Laplace) are push's C++ algorithms: the
model, a factory of a torch.nn.Sequential of standard layers, is rebuilt as the C++ module
with the same weights and trains fused where it can, without the GIL. Ensemble and
MultiSWAG are also PusH's classes (push.bayes.ensemble.Ensemble, push.bayes.swag.MultiSWAG:
the same objects), which train any torch.nn.Module PusH's way (push.bayes.both_ways).

PusH's own entry points (push.bayes.ensemble.train_deep_ensemble, push.bayes.swag.train_mswag,
push.bayes.stein_vgd.train_svgd) take any torch.nn.Module and train it as Python code on
push's particles, as PusH does; Ensemble's trains on the C++ engine instead when the run
means what the engine computes, and ``explain`` says why one does not (push.bayes.engine_route).
"""

from push.bayes.models import SGHMC, SGLD, SVGD, Infer, Laplace, MCDropout, Predictive, rebuild_blocker
from push.bayes.ensemble import Ensemble
from push.bayes.engine_route import PythonPathWarning, explain
from push.bayes.swag import MultiSWAG

__all__ = ["Ensemble", "Infer", "Laplace", "MCDropout", "MultiSWAG", "Predictive", "PythonPathWarning", "SGHMC",
           "SGLD", "SVGD", "explain", "rebuild_blocker"]
