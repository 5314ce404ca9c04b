"""What the interpreter's exit closes: every open distribution and C++ model, through one
atexit hook.

Before the interpreter finalizes: from then on a lane or handler thread that needs the GIL
(to finish a handler, or to free a tensor Python also holds) is ended by CPython mid-C++
frame, which aborts the process. Then the threads that close distributions for handlers
and for the garbage collector are joined.
"""

import atexit
import traceback
import weakref

from push import _push

_open = weakref.WeakSet()


def track(obj) -> None:
    """``obj.close()`` runs at exit unless ``untrack(obj)`` came first."""
    _open.add(obj)


def untrack(obj) -> None:
    _open.discard(obj)


@atexit.register
def _close_all():
    for obj in list(_open):
        try:
            obj.close()
        except Exception:  # noqa: B902 -- a handler's exception nobody waited for: said, and the rest still close
            traceback.print_exc()
    _push.Distribution.join_closers()
