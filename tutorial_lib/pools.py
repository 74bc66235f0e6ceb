"""Process pools that a stop signal can end, even in a process that catches it.

A training run catches SIGTERM and SIGUSR1 (Slurm's stop signals) to checkpoint. A forked worker inherits
those handlers, so a pool's terminate(), which sends SIGTERM, would leave it running and the `with` block would
hang. Each worker resets the signals to their default action before its first task; they stay blocked from
before the fork until then, so a SIGTERM that comes earlier waits and then ends the worker.
"""
from __future__ import annotations

import multiprocessing
import signal

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1") if hasattr(signal, name))


def stoppable_pool(processes: int, method: str = "fork"):
    """A multiprocessing Pool of `processes` workers started by `method` whose workers a stop signal ends."""
    if not hasattr(signal, "pthread_sigmask"):  # no POSIX signal masks: nothing inherited to guard against
        return multiprocessing.get_context(method).Pool(processes)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:  # the pool's threads keep the signals blocked; this thread's handlers run once they are unblocked
        return multiprocessing.get_context(method).Pool(processes, initializer=default_stop_signals)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def default_stop_signals() -> None:
    """In a worker: the stop signals' default action (end the process), then let them through."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
