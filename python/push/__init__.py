"""push: PusH's particle API on push's C++ runtime.

A PusH program runs on push by changing its imports::

    import torch
    import push

    with push.PusH(make_module) as dist:
        pid = dist.p_create(make_optimizer, receive={"MAIN": main})
        dist.p_wait([dist.p_launch(pid, "MAIN")])

Handlers are Python functions; each runs on a thread of its own while the particle's
device lane serves what it asks of the runtime (docs/python.md).
"""

import torch  # noqa: F401  (loads the LibTorch the extension links against)

from push._push import CancelledError, ParticleError
from push.particle import Particle, ParticleView
from push.pfuture import PFuture
from push.push import PusH

# Seconds the interpreter's exit waits for handlers still running before it ends without
# them (a Ctrl-C during the wait ends it at once); see push._lifetime.
exit_grace = 10.0

__all__ = ["CancelledError", "Particle", "ParticleError", "ParticleView", "PFuture", "PusH"]
