"""PusH's ``push.bayes.infer``: ``Infer``, the base a Bayesian method on a PusH distribution
subclasses (PusH's README recipe). push's C++ algorithms are push.bayes.Ensemble, SVGD, ...
(push.bayes.models), whose common base is ``push.bayes.Infer``, another class."""

from push.bayes.particle_infer import Infer

__all__ = ["Infer"]
