"""push.dist: one distribution over the processes of a job, from Python.

Each process of the job (started by ``push launch``, ``torchrun --no-python``, ``mpirun``
or Slurm's ``srun``, or by hand with ``rank=`` and ``world_size=``) joins it, then builds
the same distribution on it; particles are spread over every rank's device lanes::

    import torch, push, push.dist

    world = push.dist.World()            # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    with push.PusH(make_module, world=world) as dist:
        pids = [dist.p_create(mk_optim, receive={"TRAIN": train}) for _ in range(8)]
        if world.rank == 0:
            dist.p_wait([dist.p_launch(pid, "TRAIN", x, y) for pid in pids])
    # Leaving the with block is collective: every rank waits there for the others.

Every rank runs the same program: creating the distribution, each ``p_create`` (in the
same order, with the same handlers), ``save``, ``load``, ``barrier`` and closing it are
collective; ``PusH.barrier()`` fails at once when a rank is lost or the ranks have made
different particles.
A particle's module is made on the rank it lives on, under the same seed as in one
process, so a job trains the numbers one process does. Messages to a particle on another
rank carry tensors, None, bools, floats, 64-bit ints, strings, and lists, tuples and dicts
(str keys) of these; any other Python object is refused (docs/python.md).
"""

from push._push import World

__all__ = ["World"]
