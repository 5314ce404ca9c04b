"""PusH: a distribution of particles, PusH's API on push's runtime."""

import collections
import contextlib
import functools
import math
import os
import tempfile
import threading
import warnings
import weakref
from typing import Callable, Dict, Iterable, List, Optional

import torch

from push import _lifetime, _push
from push.particle import Particle
from push.pfuture import PFuture, Unwaited

class _Slot:
    __slots__ = ("module", "optimizer", "scheduler", "state", "device", "view")

    def __init__(self, module, optimizer, scheduler, state, device, view):
        self.module = module
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.state = state
        self.device = device
        self.view = view  # the module views of this particle show


# A state_dict as push's checkpoint can hold it: dicts whose keys are not all str (an
# optimizer's state is keyed by parameter index) become {_KEYED: [[key, value], ...]}.
_KEYED = "push.keyed"


class _Unstashable(TypeError):
    pass


def _stashable(value, dropped, path=""):
    """``value`` as push's checkpoint can hold it. A dict entry that cannot be held (a
    scheduler's function, say, which its constructor makes again) is left out, its path
    added to ``dropped``; anything else that cannot be raises _Unstashable."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, (list, tuple)):  # a tuple's subclass (a namedtuple) comes back a tuple
        items = [_stashable(v, dropped, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            try:
                items.append((_stashable(k, dropped), _stashable(v, dropped, f"{path}.{k}" if path else str(k))))
            except _Unstashable:
                dropped.append(f"{path}.{k}" if path else str(k))
        if all(isinstance(k, str) for k, _ in items) and _KEYED not in value:
            return dict(items)
        return {_KEYED: [[k, v] for k, v in items]}
    raise _Unstashable(type(value).__name__)


def _unstashed(value):
    if isinstance(value, list):
        return [_unstashed(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_unstashed(v) for v in value)
    if isinstance(value, dict):
        if set(value) == {_KEYED}:
            return {_unstashed(k): _unstashed(v) for k, v in value[_KEYED]}
        return {k: _unstashed(v) for k, v in value.items()}
    return value


class UnknownParticleError(KeyError, ValueError):
    """A particle id that does not exist: a KeyError, and the ValueError PusH raised."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


def _make_particle_of(ref):
    dist = ref()
    if dist is None:
        raise _push.CancelledError("push: the distribution is gone")
    return dist._make_particle()


def torch_threads_per_lane(devices: Optional[int], device_type: Optional[str]) -> Optional[int]:
    """The intra-op threads of each lane when the program lowered torch's count below the
    cores (torch.set_num_threads): that count shared by the lanes. None otherwise: push's
    default (the cores shared by the lanes)."""
    threads = torch.get_num_threads()
    if threads >= _push.usable_cores():
        return None
    on_gpus = device_type != "cpu" and torch.cuda.is_available()
    lanes = devices or (torch.cuda.device_count() if on_gpus else 1)
    return max(1, threads // max(1, lanes))


def _dispatch(ref, call, fn, args):
    dist = ref()
    if dist is None:
        raise _push.CancelledError("push: the distribution is gone")
    return fn(Particle(dist, call), *args)


class PusH:
    """A distribution of particles (neural networks) trained together.

    ``PusH(mk_module, *args)`` makes each particle's module with ``mk_module(*args)``, under
    the particle's own seed (``seed`` and its id), so a run is repeatable. Particles run on
    device lanes: one per GPU, or one CPU lane (``devices``, ``device_type`` choose).

    ``cache_size`` particles per device are resident at a time, the others swapped out to
    host memory (their Python optimizers' state stays where it is). PusH's ``multi`` is
    accepted and has no effect: push's lanes already run concurrently in this process.

    ``intra_op_threads``: each lane's intra-op threads, which its Python handlers compute
    with too; by default push's (the cores shared by the lanes), or, when the program set
    torch's count lower (torch.set_num_threads), that count shared by the lanes.

    ``world`` (a push.dist.World) spreads the particles over every process of a job
    (push.dist says how); every rank then runs the same program.
    """

    def __init__(self, mk_module: Callable, *args, cache_size: int = 4, view_size: int = 4, multi: bool = False,
                 devices: Optional[int] = None, device_type: Optional[str] = None, seed: int = 0, world=None,
                 intra_op_threads: Optional[int] = None, **kwargs):
        if not callable(mk_module):
            raise TypeError(f"push: mk_module must be callable, got {type(mk_module).__name__}")
        sizes = {}
        for name, value in (("cache_size", cache_size), ("view_size", view_size)):
            # A whole count; a float is cut to one as PusH does (its tutorial computes the
            # cache size with '/'), a count below 1 refused.
            if isinstance(value, float) and math.isfinite(value):
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"push: {name} must be a number >= 1, got {value!r}")
            sizes[name] = value
        cache_size, view_size = sizes["cache_size"], sizes["view_size"]
        self._mk_module = functools.partial(mk_module, *args, **kwargs)
        self._slots: Dict[int, _Slot] = {}
        self._lock = threading.Condition()
        self._create_lock = threading.Lock()
        self._making = None  # (mk_optim, mk_scheduler, prior, train_key) of the p_create in progress
        self._unwaited = Unwaited()  # futures of messages dropped without a wait (PFuture.__del__)
        self._made = None  # (module, optimizer, scheduler) its factory call made
        # Weak references only: the runtime holds these callables where the garbage collector
        # cannot see them, so a strong one (a bound method) would keep a dropped distribution,
        # and its lanes' threads, alive for good.
        self._core = _push.Distribution(functools.partial(_make_particle_of, weakref.ref(self)),
                                        functools.partial(_dispatch, weakref.ref(self)),
                                        devices=devices, device_type=device_type, cache_size=cache_size,
                                        view_size=view_size, seed=seed, world=world,
                                        intra_op_threads=(torch_threads_per_lane(devices, device_type)
                                                          if intra_op_threads is None else intra_op_threads))
        _lifetime.track(self)

    # -- lifetime --------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.close()

    def close(self) -> None:
        """Lets running handlers finish, then stops every lane and handler thread. Raises
        the exception of a message nobody waited for, if one failed."""
        self._core.close()
        _lifetime.untrack(self)
        self._unwaited.raise_failed()

    def __del__(self):
        # Garbage may be collected on any thread, a lane's or a handler's too, where waiting
        # for the runtime to stop could wait for this very thread: a closer thread stops it.
        core = getattr(self, "_core", None)
        if core is not None:
            core.close_later()

    # -- particles -------------------------------------------------------------------

    def particle_ids(self) -> List[int]:
        return list(self._core.particle_ids())

    def num_particles(self) -> int:
        return len(self._core.particle_ids())

    def num_devices(self) -> int:
        return self._core.num_devices()

    @property
    def rank(self) -> int:
        """This process's rank in the distribution's world (0 without one)."""
        return self._core.rank()

    @property
    def world_size(self) -> int:
        return self._core.world_size()

    def barrier(self) -> None:
        """Returns once every rank has called it (at once without a world). Fails at once,
        on every rank, when a rank is lost or the ranks have made different particles
        (p_create called differently)."""
        self._core.barrier()

    def rank_of(self, pid: int) -> int:
        """The rank particle ``pid`` lives on."""
        self._check_pid(pid)
        return self._core.rank_of(pid)

    def p_create(self, mk_optim: Optional[Callable], mk_scheduler: Optional[Callable] = None, prior: bool = False,
                 train_key: Optional[int] = -1, device: Optional[int] = 0, receive: Dict[str, Callable] = None,
                 state: Dict[str, object] = None, rank: Optional[int] = None) -> int:
        """A new particle on device lane ``device`` (None: push places it) that answers
        ``receive`` ({message: fn(particle, *args)}); returns its id. PusH's signature.

        ``mk_optim(parameters)`` makes its optimizer (None: no optimizer, ``step`` then only
        computes gradients); ``mk_scheduler(optimizer)`` its learning-rate scheduler.
        ``prior``: PusH's randomized-prior form: the module has a ``trainable`` part, whose
        ``init_weights`` initialises every submodule and whose parameters alone the
        optimizer trains. ``train_key``: the seed the module is made under (None or -1:
        the particle's own, from the distribution's ``seed`` and the particle's id).
        With a world, ``rank`` chooses the rank it lives on (None: push's rule, global lane
        pid % all lanes) and ``device`` the lane there; every rank makes the same calls.
        """
        if mk_optim is not None and not callable(mk_optim):
            raise TypeError(f"push: mk_optim must be callable or None, got {type(mk_optim).__name__}")
        if mk_scheduler is not None and (mk_optim is None or not callable(mk_scheduler)):
            raise TypeError("push: mk_scheduler must be callable, and needs mk_optim")
        if train_key is not None and (isinstance(train_key, bool) or not isinstance(train_key, int)):
            raise TypeError(f"push: train_key is an int seed (or None), got {type(train_key).__name__}")
        if train_key is not None and train_key != -1 and not 0 <= train_key < 2**64:
            raise ValueError(f"push: train_key must be in [0, 2**64) (or -1 or None), got {train_key}")
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
            raise TypeError(f"push: device is a lane index (int), got {type(device).__name__}")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
            raise TypeError(f"push: rank is an int, got {type(rank).__name__}")
        if self._core.world_size() > 1 and device == 0 and rank is None:
            device = None  # PusH's default: here, push's rule spreads particles over the ranks
        receive = {} if receive is None else receive
        if not isinstance(receive, dict):
            raise TypeError(f"push: receive must be a dict of message -> handler, got {type(receive).__name__}")
        state = {} if state is None else state
        if not isinstance(state, dict):
            raise TypeError(f"push: state must be a dict, got {type(state).__name__}")
        with self._create_lock:
            # The runtime calls _make_particle under the particle's seed: a module, optimizer
            # or scheduler that fails leaves no particle behind.
            self._making = (mk_optim, mk_scheduler, bool(prior), None if train_key == -1 else train_key)
            try:
                pid = self._core.create(receive, device, rank)
                # Made here only when the particle lives on this rank.
                module, optimizer, scheduler, view = self._made or (None, None, None, None)
            finally:
                self._making = self._made = None
        here = self._core.rank_of(pid) == self._core.rank()
        if not here:
            # Views of a particle on another rank show its tensors in a module made here.
            view = self._view_module()
        lane_device = torch.device(self._core.device(self._core.lane_of(pid))) if here else None
        with self._lock:
            self._slots[pid] = _Slot(module, optimizer, scheduler, state, lane_device, view)  # shared, as in PusH
            self._lock.notify_all()
        return pid

    def _make_particle(self):
        if self._making is None:  # a scratch module for load
            return self._mk_module()
        mk_optim, mk_scheduler, prior, train_key = self._making
        if train_key is not None:
            # The CPU generator only: the runtime restores it after this call.
            torch.random.default_generator.manual_seed(train_key)
        module = self._mk_module()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"push: the module factory must return a torch.nn.Module, got {type(module).__name__}")
        trained = module
        if prior:
            trained = getattr(module, "trainable", None)
            if not isinstance(trained, torch.nn.Module) or not callable(getattr(trained, "init_weights", None)):
                raise ValueError(f"push: prior=True needs a module with a 'trainable' submodule that has "
                                 f"init_weights (PusH's randomized-prior form); {type(module).__name__} has none")
            module.apply(trained.init_weights)
        optimizer = mk_optim(trained.parameters()) if mk_optim is not None else None
        scheduler = mk_scheduler(optimizer) if mk_scheduler is not None else None
        self._made = (module, optimizer, scheduler, self._view_module())
        return module

    def _view_module(self):
        # The module a view of a particle shows (PusH's ParticleView.view()): made while
        # the particle's seed is set (or, for a particle of another rank, under a forked
        # generator), so that no random stream is touched later; its parameters are
        # dropped, a view puts its own in (buffers are not in views, as in PusH: they keep
        # their initial values).
        with torch.random.fork_rng(devices=[]):
            view = self._mk_module()
        with torch.no_grad():
            for t in view.parameters():
                t.data = torch.empty(0, dtype=t.dtype)
        return view

    def p_launch(self, pid_to: int, msg: str, *args, sync: bool = False) -> Optional[PFuture]:
        """Sends ``msg`` with ``args`` to particle ``pid_to`` from outside; its result later
        (``sync=True`` waits and returns None, as PusH does)."""
        self._check_pid(pid_to)
        if not isinstance(msg, str):
            raise TypeError(f"push: a message name is a str, got {type(msg).__name__}")
        future = PFuture(self._core.launch(pid_to, msg, *args), unwaited=self._unwaited)
        if sync:
            future.wait()
            return None
        return future

    def p_wait(self, futures: Iterable[PFuture]) -> Dict[int, object]:
        """Waits for every future; returns {future id: result} as PusH does. The first
        failure raises (a Python handler's own exception, noted with the particle)."""
        futures = list(futures)
        for f in futures:
            if not isinstance(f, PFuture):
                raise TypeError(f"push: p_wait takes PFutures, got {type(f).__name__}")
        self._unwaited.raise_failed()
        results = {f._fid: f.wait() for f in futures}
        self._unwaited.raise_failed()
        return results

    def p_parameters(self, pid: int, sync: bool = True) -> List[torch.Tensor]:
        """Copies of particle ``pid``'s parameters, on the CPU."""
        self._check_pid(pid)
        return list(self._core.parameters(pid))

    def p_named_parameters(self, pid: int):
        self._check_pid(pid)
        return list(self._core.named_parameters(pid))

    def save(self, path: str = None, sync: bool = True, pids: Optional[Iterable[int]] = None) -> None:
        """Saves the particles to the folder ``path`` (written whole or not at all; ``load``
        reads it back, checked): parameters, buffers and the Python optimizer's and
        scheduler's state of each. ``pids``: only those particles (``load_particles``
        reads them back). Without ``path``, as PusH does:
        ``particles/device{lane}_particle{pid}.pth`` in the working folder, each the
        module's ``state_dict()`` for ``module.load_state_dict(torch.load(file))``."""
        if pids is not None:
            pids = sorted(set(pids))
            for pid in pids:
                self._check_pid(pid)
        if path is not None:
            with self._stashed(pids):
                self._core.save(os.fspath(path), pids)
            return
        self._save_pusH_files("particles", pids)

    def save_to_disk(self, pid: int, path: str = "./particles") -> None:
        """PusH's ``save_to_disk``: particle ``pid``'s ``state_dict()`` to
        ``{path}/device{lane}_particle{pid}.pth`` (PusH writes under ``particles`` whatever
        ``path`` says; here ``path`` is honoured)."""
        self._check_pid(pid)
        self._save_pusH_files(os.fspath(path), [pid])

    def _save_pusH_files(self, folder: str, pids) -> None:
        os.makedirs(folder, exist_ok=True)
        # push's own checkpoint first (from the particles' lanes), then each particle's
        # state_dict under PusH's name, replaced whole.
        with tempfile.TemporaryDirectory(dir=folder, prefix=".push-save-") as scratch:
            checkpoint = os.path.join(scratch, "checkpoint")
            self._core.save(checkpoint, None if pids is None else list(pids))
            keys = list(self._mk_module().state_dict().keys())
            for pid in self.particle_ids() if pids is None else pids:
                source = os.path.join(checkpoint, f"particle-{pid}.pt")
                if not os.path.exists(source):
                    continue  # another rank's particle: that rank writes its file
                archive = torch.jit.load(source, map_location="cpu")
                saved = dict(archive.named_parameters())
                saved.update(archive.named_buffers())
                state = collections.OrderedDict((k, saved["module." + k].detach().clone()) for k in keys)
                name = os.path.join(folder, f"device{self._core.lane_of(pid)}_particle{pid}.pth")
                torch.save(state, os.path.join(scratch, "part"))
                os.replace(os.path.join(scratch, "part"), name)

    def load(self, path: str) -> None:
        """Restores every particle saved in the folder ``path`` into the particle of the same
        id here: parameters and buffers, in place (the modules and their optimizers keep
        the same tensors), and the Python optimizer's and scheduler's state. Create the
        particles first, as the saving program did; a saved particle that is not here, a
        particle here that was not saved, another network's shapes or a damaged checkpoint
        raise RuntimeError naming it, and change nothing."""
        self._load(path, self._core.load)

    def load_particles(self, path: str) -> List[int]:
        """As ``load``, for a folder ``save(path, pids=...)`` wrote: the particles it holds
        are restored, the others stay as they are. Returns the restored ids."""
        return self._load(path, self._core.load_particles)

    def _load(self, path, load):
        if path is None:
            raise ValueError("push: load needs the folder a save wrote")
        with self._create_lock:
            # The runtime checks the checkpoint against scratch modules from the factory
            # (no optimizer, no view) before it changes the live particles.
            self._making = None
            try:
                loaded = load(os.fspath(path))  # None: every particle (a whole load)
            finally:
                self._made = None
        self._unstash(apply=True, pids=loaded)
        return loaded

    # What save keeps in each particle's (C++) state for the Python layer, which push's
    # checkpoint then holds with the particle's tensors.
    _STASH_PUT, _STASH_TAKE = "push.python/put", "push.python/take"
    _STASHED = ("push.python.optimizer", "push.python.scheduler")

    def _local_slots(self, pids=None):
        rank = self._core.rank()
        with self._lock:
            return [(pid, slot) for pid, slot in self._slots.items()
                    if self._core.rank_of(pid) == rank and (pids is None or pid in pids)]

    @contextlib.contextmanager
    def _stashed(self, pids=None):
        # The state is read on this thread: save when no message is running (after p_wait).
        try:
            futures, dropped = [], []
            for pid, slot in self._local_slots(pids):
                for key, part in zip(self._STASHED, (slot.optimizer, slot.scheduler)):
                    if part is not None:
                        left_out = []
                        state = _stashable(part.state_dict(), left_out)
                        dropped += [f"particle {pid}'s {key.rsplit('.', 1)[1]} '{k}'" for k in left_out]
                        futures.append(self._core.launch(pid, self._STASH_PUT, key, state))
            for f in futures:
                f.wait(None)
            if dropped:
                warnings.warn("push: save leaves out what a checkpoint cannot hold (made again by the "
                              "constructor on load): " + ", ".join(dropped[:4]) + (" ..." if len(dropped) > 4 else ""),
                              stacklevel=3)
            yield
        finally:
            self._unstash(apply=False, pids=pids)

    def _unstash(self, apply: bool, pids=None) -> None:
        # Every local particle's stash is taken out, kept or not: none stays to be saved again.
        taken = []
        for pid, slot in self._local_slots(pids):
            for key, part in zip(self._STASHED, (slot.optimizer, slot.scheduler)):
                taken.append((key, part, self._core.launch(pid, self._STASH_TAKE, key)))
        for key, part, f in taken:
            state = f.wait(None)
            if not apply or part is None:
                continue
            if state is not None:
                part.load_state_dict(_unstashed(state))
            elif key == self._STASHED[0]:
                # A checkpoint without it (an older push's, or C++'s): the moments of training
                # after it must not stay; the learning rates are the optimizer's own.
                part.state = collections.defaultdict(dict)

    # -- internals the particle uses -------------------------------------------------

    def _slot(self, pid: int) -> _Slot:
        # A message may reach a new particle between the runtime listing it and p_create
        # recording its module here: that is a moment.
        with self._lock:
            if not self._lock.wait_for(lambda: pid in self._slots, timeout=60):
                raise UnknownParticleError(f"push: particle {pid} has no module here")
            return self._slots[pid]

    def _check_pid(self, pid) -> None:
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise TypeError(f"push: a particle id is an int, got {type(pid).__name__}")
        if pid not in self._slots and pid not in self._core.particle_ids():
            raise UnknownParticleError(f"push: particle {pid} does not exist (particles: {sorted(self._slots)})")
