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
        world.barrier()

Every rank runs the same program: creating the distribution, each ``p_create`` (in the
same order, with the same handlers), ``save``, ``load`` and closing it are collective.
A particle's module is made on the rank it lives on, under the same seed as in one
process, so a job trains the numbers one process does. Messages to a particle on another
rank carry tensors, numbers, strings, None and lists, tuples and dicts of these; any other
Python object is refused there with an error naming its type (docs/python.md).
"""

from push._push import World

__all__ = ["World"]
