"""What the interpreter's exit closes: every open distribution and C++ model, through one
atexit hook.

Before the interpreter finalizes: from then on a lane or handler thread that needs the GIL
(to finish a handler, or to free a tensor Python also holds) is ended by CPython mid-C++
frame, which aborts the process. Then the threads that close distributions for handlers
and for the garbage collector are joined.

A handler still running at exit (nobody waited for it, or Ctrl-C stopped the wait) keeps
its lane until it returns. The exit waits for it at most ``push.exit_grace`` seconds, and
a Ctrl-C during that wait ends it at once; then the process ends without waiting (its
exit status 1, or 130 after Ctrl-C), saying so: what those handlers had not finished, and
any result they would have sent, is lost.
"""

import atexit
import os
import sys
import time
import traceback
import weakref

from push import _push

_open = weakref.WeakSet()

# Seconds the exit waits for handlers still running (push.exit_grace sets it).
exit_grace = 10.0


def track(obj) -> None:
    """``obj.close()`` runs at exit unless ``untrack(obj)`` came first."""
    _open.add(obj)


def untrack(obj) -> None:
    _open.discard(obj)


def _abandon(running: int, why: str, status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: B902 -- a closed stream: nothing to flush
            pass
    os.write(2, (f"push: {running} distribution(s) still had a handler running at exit ({why}): ending without "
                 "waiting for it; what it had not finished is lost\n").encode())
    os._exit(status)


@atexit.register
def _close_all():
    # Distributions: each stopped by a closer thread, waited for here a slice at a time, so
    # that the grace and a Ctrl-C are seen. Models (C++ only) close as they are.
    stopping = []
    for obj in list(_open):
        core = getattr(obj, "_core", None)
        if isinstance(core, _push.Distribution):
            core.close_later()
            stopping.append(obj)
            continue
        try:
            obj.close()
        except Exception:  # noqa: B902 -- said, and the rest still close
            traceback.print_exc()
    grace = float(getattr(sys.modules.get("push"), "exit_grace", exit_grace))
    deadline = time.monotonic() + grace
    try:
        while stopping:
            stopping = [obj for obj in stopping if not obj._core.wait_stopped(0.05)]
            if stopping and time.monotonic() >= deadline:
                _abandon(len(stopping), f"push.exit_grace = {grace:g} s passed", 1)
    except KeyboardInterrupt:
        _abandon(len(stopping), "interrupted", 130)
    for obj in list(_open):
        try:
            obj.close()  # stopped already: says what a handler nobody waited for raised
        except Exception:  # noqa: B902 -- said, and the rest still close
            traceback.print_exc()
    _push.Distribution.join_closers()
