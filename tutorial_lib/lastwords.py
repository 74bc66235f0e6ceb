"""Each rank's last words: <out_dir>/ranks/rank<R>.json says the last step this rank completed, the phase it is in
(a part of the step, "forward", "backward", ..., or a named collective) and since when. A thread of the rank
writes it whenever that changes (at most once a second; every HEARTBEAT_S seconds regardless), so the file of a
rank that hangs still says where it stopped: notebook 05's hang drill reads them (lessons/hang.py).

A rank whose collective timed out adds its error, and, with PyTorch's flight recorder on (TORCH_FR_BUFFER_SIZE,
TORCH_FR_DUMP_TEMP_FILE), a gloo run dumps every rank's record of its collectives: the failing rank asks for the
dumps with a file beside the last words, and each rank's thread answers it (NCCL dumps its own on a timeout,
with TORCH_NCCL_DUMP_ON_TIMEOUT=1)."""
from __future__ import annotations

import json
import os
import pickle
import socket
import threading
import time
from pathlib import Path

from .results import atomic_write_text, fresh_file
from .values import is_whole

WRITE_EVERY_S = 1.0  # at most one write a second per rank, also on a shared file system with many ranks
HEARTBEAT_S = 10.0  # written this often even when nothing changed: an old file means a stopped process
DUMP_ASKED = "flight-recorder-dump-asked"  # the file, beside the last words, that asks every rank for its dump


class _Now:
    """What this rank is doing now: its stack of phases [(name, since)], where an exception left one, and
    its failure. Set by the loop's thread only (phase() below), read by the writer's."""

    def __init__(self):
        self.stack: list[tuple[str, float]] = []
        self.raised_in: tuple[str, float] | None = None  # (phases, since) an exception left
        self.failure: dict | None = None


NOW = _Now()
_ACTIVE: list = []  # the Recorder of the run in progress in this process (none: phases are still tracked)


class phase:
    """`with phase("backward"):` this rank is in that phase (profiling.nvtx_range and the collectives of
    distributed.py say so): an append and a pop, nothing written here."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        NOW.stack.append((self.name, time.time()))

    def __exit__(self, kind, value, tb):
        if kind is not None and NOW.raised_in is None:
            NOW.raised_in = (where(), NOW.stack[-1][1] if NOW.stack else time.time())
        if NOW.stack:
            NOW.stack.pop()


def where() -> str:
    """The phases this rank is in, outermost first ("between phases" when none)."""
    return " > ".join(name for name, _ in NOW.stack) or "between phases"


def failed(what: str, error: BaseException | str, silent: list[int] | None = None) -> None:
    """A collective of this rank failed (distributed.collective): the file says so at once, with the phase the
    error came from; with the flight recorder on (gloo), this rank dumps its record and asks the others for
    theirs."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    NOW.failure = {"in": NOW.raised_in[0] if NOW.raised_in else where(), "collective": what, "error": first,
                   "silent_ranks": silent}
    for recorder in _ACTIVE:
        try:
            recorder.write("failed")
            recorder.dump(ask_others=True)
        except Exception:  # noqa: BLE001  the collective's own error matters more than its last words
            pass


class Recorder:
    """The thread that writes this rank's last words into `folder` while a run lasts (see the module's text).
    `run`: anything with `.step` (steps completed) and `.total_steps`; `env`: a distributed.DistEnv."""

    def __init__(self, folder: Path, env, run):
        self.folder, self.env, self.run = Path(folder), env, run
        self.path = self.folder / f"rank{env.rank}.json"
        self.stop, self.lock, self.dumped = threading.Event(), threading.Lock(), False
        self.written_at, self.written = 0.0, None
        self.folder.mkdir(parents=True, exist_ok=True)
        if env.rank == 0:  # a request left by an earlier run in this out_dir
            (self.folder / DUMP_ASKED).unlink(missing_ok=True)
        self.thread = threading.Thread(target=self._watch, name="last words", daemon=True)

    def words(self, state: str) -> dict:
        stack = list(NOW.stack)
        phase, since = (" > ".join(n for n, _ in stack), stack[-1][1]) if stack else ("between phases", None)
        if not stack and state != "running" and NOW.raised_in:  # where the error came from
            phase, since = NOW.raised_in
        return {"rank": self.env.rank, "world_size": self.env.world_size, "host": socket.gethostname(),
                "pid": os.getpid(), "backend": self.env.backend, "state": state,
                "step_completed": int(getattr(self.run, "step", 0)),
                "total_steps": getattr(self.run, "total_steps", None),
                "phase": phase, "phase_since": since, "written": time.time(), "failure": NOW.failure}

    def write(self, state: str = "running") -> None:
        with self.lock:
            words = self.words(state)
            atomic_write_text(self.path, json.dumps(words, indent=1))
            self.written_at, self.written = time.monotonic(), (words["step_completed"], words["phase"], state)

    def _watch(self) -> None:
        while not self.stop.wait(0.25):
            now, words = time.monotonic(), self.words("running")
            changed = (words["step_completed"], words["phase"], "running") != self.written
            if (changed and now - self.written_at >= WRITE_EVERY_S) or now - self.written_at >= HEARTBEAT_S:
                try:
                    self.write()
                except Exception:  # noqa: BLE001  a full disk must not end the run: the next write may pass
                    pass
            if not self.dumped and (self.folder / DUMP_ASKED).exists():
                self.dump()

    def dump(self, ask_others: bool = False) -> Path | None:
        """gloo with the flight recorder on: this rank's record of its collectives, where the reader
        (torchfrtrace) finds it (TORCH_FR_DUMP_TEMP_FILE + rank); once. `ask_others`: and ask every rank."""
        prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        if self.dumped or self.env.backend != "gloo" or not prefix or not _buffer_size():
            return None
        self.dumped = True
        if ask_others:
            atomic_write_text(self.folder / DUMP_ASKED, f"rank {self.env.rank}\n")
        return write_flight_record(Path(f"{prefix}{self.env.rank}"), self.env.world_size)

    def __enter__(self) -> "Recorder":
        NOW.stack.clear()
        NOW.raised_in = NOW.failure = None
        try:
            self.write("starting")
        except Exception:  # noqa: BLE001  a full disk: no last words, and the run's own error says why
            self.folder.rmdir() if not any(self.folder.iterdir()) else None
            return self
        _ACTIVE.append(self)
        self.thread.start()
        return self

    def __exit__(self, kind, value, tb) -> None:
        if self not in _ACTIVE:
            return
        self.stop.set()
        self.thread.join()
        _ACTIVE.remove(self)
        if kind is not None and NOW.failure is None:
            NOW.failure = {"in": NOW.raised_in[0] if NOW.raised_in else where(), "collective": None,
                           "error": f"{kind.__name__}: {str(value).strip()[:300]}", "silent_ranks": None}
        state = "finished" if kind is None else "stopped" if kind.__name__ == "Preempted" else "failed"
        try:
            self.write(state)
        except Exception:  # noqa: BLE001  the run's own error (or result) matters more than its last words
            pass


def _buffer_size() -> int:
    text = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    return int(text) if is_whole(text) else 0


def write_flight_record(path: Path, world_size: int) -> Path | None:
    """This process's flight record (its last collectives, gloo) as the reader expects it. torch 2.14's gloo
    record leaves its process groups out (pg_config holds one nameless group): they are filled in from the
    entries, every rank of the run in each (the workbook's runs have one group), so that the reader can match
    the ranks' collectives."""
    import torch

    try:
        record = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    except (AttributeError, RuntimeError):  # an older torch without gloo's recorder
        return None
    if set(record.get("pg_config") or {}) <= {""}:
        ranks = str(list(range(world_size)))
        groups = {tuple(e["process_group"]) for e in record.get("entries", []) if e.get("process_group")}
        record["pg_config"] = {name: {"name": name, "desc": desc, "ranks": ranks} for name, desc in groups}
    path.parent.mkdir(parents=True, exist_ok=True)
    f, tmp = fresh_file(path)
    with f:
        f.write(pickle.dumps(record))
    os.replace(tmp, path)
    return path
