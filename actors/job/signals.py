"""SIGINT and SIGTERM as a job's orderly end.

Inside :func:`interrupts` both signals raise :class:`Interrupted` (a KeyboardInterrupt)
in the main thread, so a job unwinds through its ``finally`` blocks (finished rows
committed, Ray shut down, the output's lock released) instead of dying where it stands:
Python's default for SIGTERM ends the process without running any of them.

:func:`deferred` holds a signal over a step that must not be cut in two (the lock's
release, Ray's shutdown, the console's log) and raises it once the step is done. A second
signal during the hold raises at once: a step that hangs can still be stopped.
:func:`unswallowed` raises a signal whose exception something dropped. Signals are
delivered to the main thread only, so elsewhere these are no-ops.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


class Interrupted(KeyboardInterrupt):
    """The job was asked to stop by ``signum``."""

    def __init__(self, signum: int):
        super().__init__(_NAMES.get(signum, f"signal {signum}"))
        self.signum = signum


def describe(exc: BaseException) -> str:
    """The signal behind a KeyboardInterrupt, for a message."""
    return str(exc) if isinstance(exc, Interrupted) else _NAMES[signal.SIGINT]


_held = 0                      # depth of deferred() blocks in the main thread
_pending: int | None = None    # a signal that arrived during one
_handled = [0, None]           # signals handled so far, and the last one


def _on_signal(signum, frame) -> None:
    global _pending
    _handled[:] = [_handled[0] + 1, signum]
    if _held and _pending is None:
        _pending = signum
        return
    raise Interrupted(signum)


def active() -> bool:
    """Whether this process's SIGTERM currently raises :class:`Interrupted`."""
    return signal.getsignal(signal.SIGTERM) is _on_signal


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def interrupts():
    """SIGINT and SIGTERM raise :class:`Interrupted` inside; the previous handlers come
    back on the way out."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _on_signal)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def reclaim() -> None:
    """Install this module's handler again, for a block of code that replaced it: at
    Python's level (``ray.init``'s own SIGTERM handler) or under Python's feet (Ray's core
    worker installs a C++ SIGTERM handler; seen: a job that exited 130 then ended by
    SIGABRT)."""
    if _main_thread():
        for s in SIGNALS:
            signal.signal(s, _on_signal)


@contextlib.contextmanager
def deferred():
    """A signal arriving inside is raised when the block ends; one already on its way out
    (an exception leaving the block) is not raised again: the job is ending anyway."""
    global _held, _pending
    if not _main_thread():
        yield
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held:
            signum, _pending = _pending, None
            if signum is not None and sys.exc_info()[1] is None:
                raise Interrupted(signum)


@contextlib.contextmanager
def unswallowed():
    """Raises, when the block ends normally, a signal whose Interrupted did not leave it:
    Python reports and drops an exception raised inside a finalizer or some callbacks, and
    ``ray.init`` runs many (seen: a SIGTERM lost in a logging lock's release)."""
    before = _handled[0]
    yield
    if _handled[0] > before and _main_thread():
        raise Interrupted(_handled[1])


@contextlib.contextmanager
def shielded(manager):
    """``manager`` entered and exited with signals deferred: a context whose exit restores
    state (the console's file descriptors) is never left half undone."""
    with deferred():
        value = manager.__enter__()
    try:
        yield value
    except BaseException:
        with deferred():
            if not manager.__exit__(*sys.exc_info()):
                raise
    else:
        with deferred():
            manager.__exit__(None, None, None)
