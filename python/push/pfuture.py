"""PFuture: the eventual result of a message, a view or a particle operation."""

import itertools
import threading

from push import _push

_ids = itertools.count()


class Unwaited:
    """A distribution's futures of messages dropped without a wait, until it looks at them:
    those that failed are raised (``raise_failed``), those that succeeded forgotten. Dropped
    futures come from any thread (PFuture.__del__); past ``limit`` the finished ones that
    succeeded are forgotten at once, so that a program that never waits keeps few."""

    def __init__(self, limit: int = 1024):
        self._lock = threading.Lock()
        self._futures = []
        self._limit = limit

    def add(self, future) -> None:
        with self._lock:
            self._futures.append(future)
            if len(self._futures) > self._limit:
                self._futures = [f for f in self._futures if not f.done() or _failed(f)]
                self._limit = max(self._limit, 2 * len(self._futures))

    def raise_failed(self) -> None:
        """Raises the first finished one's exception (the handler's own, with a note naming
        the particle and the message), once; the others wait for the next call."""
        with self._lock:
            done = [f for f in self._futures if f.done()]
            self._futures = [f for f in self._futures if not f.done()]
        for i, future in enumerate(done):
            if _failed(future):
                with self._lock:
                    self._futures.extend(done[i + 1:])  # still to say
                future.wait(0)


def _failed(future) -> bool:
    """Whether a finished future failed (a distribution closed before it ran is no failure)."""
    try:
        future.wait(0)
    except _push.CancelledError:
        return False
    except BaseException:  # noqa: B902 -- any exception of the handler
        return True
    return False


class PFuture:
    """A result that arrives later. ``wait()`` returns it, or raises what produced it.

    Waiting releases the GIL (other handlers run) and, on the main thread, stops with
    KeyboardInterrupt on Ctrl-C. A message's future dropped without a wait is kept by its
    distribution, so that the handler's exception, if it raises one, is not lost: the
    distribution's next ``p_wait`` or its ``close`` raises it.
    """

    __slots__ = ("_future", "_value", "_convert", "_fid", "_unwaited")

    def __init__(self, future=None, value=None, convert=None, unwaited=None):
        self._future = future  # a push._push.Future or ViewFuture; None when ready
        self._value = value
        self._convert = convert
        self._fid = next(_ids)
        self._unwaited = unwaited  # the distribution's list of dropped futures, until waited

    def wait(self, timeout=None):
        """The result; ``timeout`` in seconds (TimeoutError when it passes), None waits."""
        self._unwaited = None
        if self._future is None:
            return self._value
        value = self._future.wait(timeout)
        return self._convert(value) if self._convert is not None else value

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def __del__(self):
        # Dropped without a wait: its distribution looks at it later (list.append is atomic).
        try:
            if self._unwaited is not None and self._future is not None:
                self._unwaited.add(self._future)
        except Exception:  # noqa: B902 -- at interpreter exit the module may be gone: nothing to keep
            pass

    def __eq__(self, other) -> bool:
        return isinstance(other, PFuture) and self._fid == other._fid

    def __hash__(self) -> int:
        return self._fid
