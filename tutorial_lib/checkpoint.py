"""What keeps a run's work safe: checkpoint.pt written atomically and read without running code
(weights_only), the lock that keeps two runs out of one out_dir, and the stop signals (SIGUSR1, SIGTERM)
that end a run with a checkpoint. Errors are one line that names the file and the fix."""
from __future__ import annotations

import errno
import os
import platform
import shutil
import signal
from pathlib import Path

import torch

from .config import UserError

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)  # Slurm's warning before the time limit; scancel, the limit
CHECKPOINT_KEYS = ("step", "model", "optimizer", "scheduler", "scaler", "losses", "rng_cpu", "config", "world_size")


def write_checkpoint(state: dict, path: Path) -> None:
    """torch.save to a temporary file beside `path`, then one rename: a crash mid-write never leaves a
    half-written checkpoint. A full disk keeps the previous checkpoint and removes the partial file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        raise UserError(_write_error(path, tmp, e)) from None


def read_checkpoint(path: Path, device: torch.device) -> dict:
    """A workbook checkpoint, loaded with weights_only=True (a crafted file can't run code); a one-line error
    naming the file when it is truncated, empty, or not a workbook checkpoint."""
    fix = "move it away, or give resume=false to start afresh (it is then overwritten)"
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001  (RuntimeError, UnpicklingError, EOFError, ...: by the kind of damage)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"{path} can't be read as a checkpoint (truncated, empty, or not written by the workbook: "
                        f"{first}); {fix}") from None
    missing = [k for k in CHECKPOINT_KEYS if not (isinstance(state, dict) and k in state)]
    if missing:
        raise UserError(f"{path} is not a workbook checkpoint (it lacks {', '.join(missing)}); {fix}")
    return state


def _write_error(path: Path, tmp: Path, e: Exception) -> str:
    """The one-line message for a checkpoint that could not be written; the partial file is removed first."""
    try:
        full = shutil.disk_usage(path.parent).free < 1 << 20  # torch's writer hides ENOSPC behind an iostream error
    except OSError:
        full = False
    tmp.unlink(missing_ok=True)
    kept = f"the previous checkpoint {path} is kept" if path.is_file() else "no earlier checkpoint exists"
    fix = f"{kept}. Free space or use another out_dir"
    if getattr(e, "errno", None) == errno.EDQUOT:
        return f"disk quota exceeded on {path.parent} while writing the checkpoint; {fix}"
    if getattr(e, "errno", None) == errno.ENOSPC or full:
        return f"no space left on {path.parent} while writing the checkpoint; {fix}"
    return f"could not write the checkpoint {path} ({str(e).splitlines()[0] if str(e) else type(e).__name__}); {kept}"


def make_out_dir(out: Path) -> None:
    """Create out_dir, or a one-line error saying why it can't be used."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied")
    except OSError as e:
        raise UserError(f"out_dir={str(out)!r} can't be used ({e.strerror or e}); choose a folder you can write, "
                        "e.g. out_dir=runs/<name>") from None


class OutDirLock:
    """One run per out_dir at a time: an exclusive flock on out_dir/.lock, held by rank 0 for the whole fit().
    A second run gets an error naming the first (its PID and host), instead of both writing checkpoint.pt.tmp."""

    def __init__(self, out: Path, main: bool = True):
        self.path, self.fd, self.main = out / ".lock", None, main

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # Windows: no flock
            return self
        if not self.main:
            return self
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(self.fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            self.fd = None
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP):  # a file system without locks: run unguarded
                return self
            raise UserError(f"out_dir={str(self.path.parent)!r} is in use by another run ({holder}); wait for it, "
                            "or give this run another out_dir") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {platform.node()}".encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock




class StopSignals:
    """While active, SIGUSR1 and SIGTERM set `target.stop_requested` (and `stop_signal`, the signal's name)
    instead of ending the process; the run checks the flag at step boundaries and after its last steps.
    A signal before there is a target (set-up) is kept in `.signal` and handed over when one is set."""

    def __init__(self, target=None):
        self.target, self.signal, self.old = target, None, {}

    def __call__(self, signum, frame) -> None:
        self.signal = signal.Signals(signum).name
        self.hand_over()

    def hand_over(self, target=None) -> None:
        self.target = target or self.target
        if self.target is not None and self.signal:
            self.target.stop_requested, self.target.stop_signal = True, self.signal

    def __enter__(self) -> "StopSignals":
        try:
            self.old = {sig: signal.signal(sig, self) for sig in STOP_SIGNALS}
        except ValueError:  # not the main thread: signals can't be caught here
            self.old = {}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
