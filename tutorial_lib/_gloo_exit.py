"""A workaround, not a lesson: gloo's worker threads must not touch a Python tensor during the interpreter's
shutdown. (distributed.py, which notebook 05 teaches from, calls the two functions below around each collective.)

A gloo collective hands its tensors to one of gloo's worker threads, which drops its reference when the work is
done, a little after the caller's wait() returned. For a tensor made in Python, dropping that reference takes the
interpreter's lock (torch gives the tensor's Python object back to Python). If the process has meanwhile reached
the interpreter's shutdown, Python ends that thread, and the process aborts ("terminate called without an
active exception": a core dump of a rank at the end of a loaded CPU run showed exactly this, in
~AsyncAllreduceWork). So every collective of distributed.py hands its tensors over through `hand_over`: the
caller gets them back only once gloo has let go of them, and each kind's last ones are kept for the life of the
process in a dict never freed. With NCCL (GPU tensors, no Python-side reference in its threads) nothing waits.
"""
from __future__ import annotations

import ctypes
import time

_HELD: dict = {}
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_HELD))  # one reference too many: never freed, not even at exit


def hand_over(backend: str | None, kind: str, *tensors):
    """Before a collective of this `kind` on `tensors`: keep them until the process ends (the previous ones of
    the same kind are freed here, by this thread), and return the function to call once the collective is done
    and its work dropped, which waits until gloo's threads have let go of them."""
    _HELD[kind] = tensors
    before = [t._use_count() for t in tensors]  # C++ references: 1 when Python alone holds the tensor
    return lambda: let_go(backend, tensors, before)


def let_go(backend: str | None, tensors, before: list[int], timeout_s: float = 2.0) -> None:
    """Wait until gloo's worker threads hold no reference to `tensors` (each back to its count `before` the
    collective): no worker touches a Python tensor after this returns, so none can during shutdown."""
    if backend != "gloo":
        return
    deadline = time.monotonic() + timeout_s
    while any(t._use_count() > b for t, b in zip(tensors, before)) and time.monotonic() < deadline:
        time.sleep(0.0002)
