"""PFuture: the eventual result of a message, a view or a particle operation."""

import itertools

_ids = itertools.count()


class PFuture:
    """A result that arrives later. ``wait()`` returns it, or raises what produced it.

    Waiting releases the GIL (other handlers run) and, on the main thread, stops with
    KeyboardInterrupt on Ctrl-C.
    """

    __slots__ = ("_future", "_value", "_convert", "_fid")

    def __init__(self, future=None, value=None, convert=None):
        self._future = future  # a push._push.Future or ViewFuture; None when ready
        self._value = value
        self._convert = convert
        self._fid = next(_ids)

    def wait(self, timeout=None):
        """The result; ``timeout`` in seconds (TimeoutError when it passes), None waits."""
        if self._future is None:
            return self._value
        value = self._future.wait(timeout)
        return self._convert(value) if self._convert is not None else value

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def __eq__(self, other) -> bool:
        return isinstance(other, PFuture) and self._fid == other._fid

    def __hash__(self) -> int:
        return self._fid
