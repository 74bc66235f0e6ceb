"""What keeps a run's work safe: checkpoint.pt written atomically and read without running code
(weights_only), the lock that keeps two runs out of one out_dir, and the stop signals (SIGUSR1, SIGTERM)
that end a run with a checkpoint; and what a checkpoint holds of a Run (`run_state`), put back by `resume`.
Errors are one line that names the file and the fix."""
from __future__ import annotations

import errno
import os
import platform
import signal
import stat
import time
from pathlib import Path

import torch

from .config import ConfigError, UserError, resume_differences
from .results import disk_problem, fresh_file, make_folder

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)  # Slurm's warning before the time limit; scancel, the limit
CHECKPOINT_KEYS = ("step", "model", "optimizer", "scheduler", "scaler", "losses", "rng_cpu", "config", "world_size")


def write_checkpoint(state: dict, path: Path) -> None:
    """torch.save to a fresh temporary file beside `path` (results.fresh_file: never through a planted link),
    then one rename: a crash mid-write never leaves a half-written checkpoint. A full disk keeps the previous
    checkpoint and removes the partial file."""
    tmp = None
    try:
        f, tmp = fresh_file(path)
        with f:
            torch.save(state, f)
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
    wrong = [f"{key} is {state[key]!r}" for key, ok in _SHAPES.items() if not ok(state[key])]
    if wrong:
        raise UserError(f"{path} is not a workbook checkpoint ({wrong[0][:80]}); {fix}")
    return state


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_SHAPES = {"step": _count, "world_size": lambda v: _count(v) and v > 0, "losses": lambda v: isinstance(v, list),
           "config": lambda v: isinstance(v, dict), "model": lambda v: isinstance(v, dict),
           "optimizer": lambda v: isinstance(v, dict)}  # what resuming reads as numbers, lists and mappings


def check_length(path: Path, step: int, cfg, total_steps: int) -> None:
    """A checkpoint past the end of the run `cfg` would be reported as a run of its steps under a config of fewer."""
    if step > total_steps:
        length = f"steps={cfg.steps}" if cfg.steps else f"epochs={cfg.epochs} ({total_steps} steps)"
        raise ConfigError(f"{path} holds a run at step {step}, past {length}: a run can't be shortened; give "
                          f"steps >= {step} to keep it, or resume=false to train {total_steps} steps afresh")


def _write_error(path: Path, tmp: Path | None, e: Exception) -> str:
    """The one-line message for a checkpoint that could not be written; the partial file is removed first."""
    problem = disk_problem(path.parent, e)  # torch's writer hides ENOSPC behind an iostream error
    if tmp is not None:
        tmp.unlink(missing_ok=True)
    kept = f"the previous checkpoint {path} is kept" if path.is_file() else "no earlier checkpoint exists"
    if problem:
        return f"{problem} while writing the checkpoint; {kept}. Free space or use another out_dir"
    return f"could not write the checkpoint {path} ({str(e).splitlines()[0] if str(e) else type(e).__name__}); {kept}"


def run_state(run) -> dict:
    """What a checkpoint holds of an engine.Run: only tensors, numbers, strings, lists and dicts, so that it
    loads with torch.load(weights_only=True)."""
    timing = run.clock.carried() if run.clock is not None else run.prior_timing
    state = {"step": run.step, "model": run.raw_model.state_dict(), "optimizer": run.opt.state_dict(),
             "scheduler": run.sched.state_dict(), "scaler": run.scaler.state_dict(),
             "losses": run.losses, "rng_cpu": torch.get_rng_state(), "config": run.cfg.to_dict(),
             "world_size": run.env.world_size, "timing": timing,
             **run.history.state(run.synced_time(), time.perf_counter() - (run.t_start or time.perf_counter()))}
    if run.device.type == "cuda":
        state["rng_cuda"] = torch.cuda.get_rng_state(run.device)
    return state


def restore(run, state: dict) -> None:
    """Everything a checkpoint holds, back into the engine.Run."""
    run.raw_model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    restore_progress(run, state)


def restore_progress(run, state: dict) -> None:
    """All but the weights and the optimizer state (a sharded model's come from its shards: sharding.py)."""
    run.sched.load_state_dict(state["scheduler"])
    run.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng_cpu"])
    if "rng_cuda" in state and run.device.type == "cuda":
        torch.cuda.set_rng_state(state["rng_cuda"], run.device)
    run.step, run.resumed_from = state["step"], state["step"]
    run.loss_log.values = [float(v) for v in state["losses"]]
    run.prior_timing = state.get("timing") or run.prior_timing
    run.history.resume(state, run.step)


def resume(run) -> bool:
    """Continue the engine.Run from out_dir/checkpoint.pt when resume=true and the file exists: True once
    restored. A checkpoint of another run (config, world size, length, model) is refused with the fix."""
    path = run.out / "checkpoint.pt"
    if not (run.cfg.resume and path.is_file()):
        return False
    state = read_checkpoint(path, run.device)
    differ = resume_differences(state["config"], run.cfg)
    if state["world_size"] != run.env.world_size:
        differ.append(f"world size {state['world_size']} (now {run.env.world_size})")
    if differ:
        raise ConfigError(f"{path} holds a run with {'; '.join(differ)}: resuming would mix two runs; use "
                          "the checkpoint's values, another out_dir, or resume=false to start afresh")
    check_length(path, state["step"], run.cfg, run.total_steps)
    try:
        restore(run, state)
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError) as e:  # weights of another model, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"{path} does not fit this run ({first}); move it away, or give resume=false to start "
                        "afresh (it is then overwritten)") from None
    return True


def make_out_dir(out: Path) -> None:
    """Create out_dir, or a one-line error saying why it can't be used."""
    make_folder(out, f"out_dir={str(out)!r}", "choose a folder you can write, e.g. out_dir=runs/<name>")


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
        self.fd = self._open()
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
        try:  # who holds it, for the message a second run gets; a full disk leaves it out
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, f"pid {os.getpid()} on {platform.node()}".encode(), 0)
        except OSError:
            pass
        return self

    def _open(self) -> int:
        """The lock file, opened without following a link: in a shared runs folder anyone may plant `.lock` as a
        link to a file of yours, which the lock's PID line would overwrite. A link is refused, never written."""
        fix = "remove it (the run makes its own .lock)"
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                         0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UserError(f"{self.path} is a symbolic link (to {os.readlink(self.path)}); {fix}") from None
            why = disk_problem(self.path.parent, e) or e.strerror
            raise UserError(f"out_dir={str(self.path.parent)!r} can't be used ({why}); choose a folder you can "
                            "write") from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            what = "a hard link (one name of a file that has others)" if stat.S_ISREG(info.st_mode) else "not a file"
            raise UserError(f"{self.path} is {what}; {fix}")
        return fd

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
