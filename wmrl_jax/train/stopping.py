"""Stopping a run on a signal without cutting a checkpoint write in half.

A preemption (SIGTERM) or Ctrl-C (SIGINT) should stop training at once: the
trainer's `finally` then closes its executors (their sandboxes stopped and
removed), its checkpoints and its lock. But a signal raised while a library is
inside its own critical work (orbax waiting on its asynchronous save thread)
unwinds that library from the middle: it logs the interrupted wait as a failure,
with a traceback, and may leave its threads half done. So the raise is deferred
while the main thread is inside `deferred()`, and delivered when it leaves:

    with stopping.on_signals():            # the entry point, around the whole run
        ...
        with stopping.deferred():          # around each checkpoint write or wait
            manager.save(...)

Inside `on_signals`, the first SIGTERM or SIGINT raises `Stopped` (a
`BaseException`, so no `except Exception` swallows it); a second one is ignored,
so it cannot cut the clean-up of the first short. Signals are only delivered to
the main thread; `deferred()` entered on another thread defers nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """A signal asked the run to stop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    depth = 0  # How many `deferred()` blocks the main thread is inside.
    pending: int | None = None  # A signal that arrived inside one.


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _handler(signum, frame) -> None:
    for s in SIGNALS:  # The first signal only; later ones must not interrupt clean-up.
        signal.signal(s, signal.SIG_IGN)
    if _State.depth:
        _State.pending = signum
    else:
        raise Stopped(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal that arrives inside this block is raised as `Stopped` when it ends."""
    if not _on_main_thread():
        yield
        return
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if _State.depth == 0 and _State.pending is not None:
            signum, _State.pending = _State.pending, None
            raise Stopped(signum)


@contextlib.contextmanager
def on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise `Stopped` inside this block; the old handlers after it."""
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _State.pending = None
