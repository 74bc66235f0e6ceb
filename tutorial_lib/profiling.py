"""Profiling a training run: torch.profiler traces, phase labels (NVTX for Nsight Systems), line_profiler
reports that print into the cell, and (in trace_summary) an offline summary of a trace.

    cfg = tl.TrainConfig(..., profile=True)           # the engine records <out_dir>/tb/profile/rank<N>.*.json.gz
    tl.trace_summary.summarize(cfg.out_dir)                # where each step's time goes, as tables; .plot() draws it
    tl.profiling.line_profile(tl.engine.Run.train_step, tl.train, cfg)   # time per line of Python
"""
from __future__ import annotations

import io
import json
import linecache
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from line_profiler import LineProfiler

from . import lastwords, tensorboard
from .config import ConfigError, UserError
from .meters import PARTS


class _NoProfiler:
    def step(self) -> None:
        pass

    def traces_written(self) -> int:
        return 0


def trace_dir(out_dir: str | os.PathLike) -> Path:
    """Where traces go: inside the run's TensorBoard folder, so the PyTorch Profiler tab finds them.
    (Notebook 02 teaches it.)"""
    return Path(out_dir) / "tb" / "profile"


def activities(device: torch.device | str) -> list:
    """What torch.profiler records on `device`: host operators always, GPU kernels and copies on CUDA.
    (Notebook 02 teaches it.)"""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


@contextmanager
def profiler(cfg, env):
    """A torch.profiler.profile configured from cfg (profile=true), one gzipped trace per rank (or only on the
    ranks in profile_ranks: one rank's trace is usually enough, and the others then run unslowed);
    otherwise an object whose step() does nothing.

    The schedule skips `profile_wait` steps, warms up for `profile_warmup` (recorded, then thrown away: the
    first recorded steps carry the profiler's own start-up cost), records `profile_active`, and does that
    `profile_repeat` times; each cycle writes one file, rank<N>.<timestamp>.pt.trace.json.gz.
    (Notebook 02 teaches it.)
    """
    ranks = cfg.profile_rank_set()
    if not cfg.profile or (ranks is not None and env.rank not in ranks):
        yield _NoProfiler()
        return
    needed = cfg.profile_wait + cfg.profile_warmup + cfg.profile_active
    if cfg.steps is not None and cfg.steps < needed:
        raise ConfigError(f"profile=true records steps {needed - cfg.profile_active + 1}-{needed} (profile_wait="
                          f"{cfg.profile_wait} + profile_warmup={cfg.profile_warmup} + profile_active="
                          f"{cfg.profile_active}) but steps={cfg.steps}; use steps={needed} or more, or fewer "
                          "profile_wait/profile_active steps")
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # keep the profiler's C++ log lines out of the cells
    schedule = torch.profiler.schedule(wait=cfg.profile_wait, warmup=cfg.profile_warmup,
                                       active=cfg.profile_active, repeat=cfg.profile_repeat)
    write = torch.profiler.tensorboard_trace_handler(
        str(trace_dir(cfg.out_dir)), worker_name=f"rank{env.rank}", use_gzip=True)
    written = []  # prof.traces_written(): the loop leaves the seconds a trace file takes out of the step times

    def handler(p):
        write(p)
        written.append(p.step_num)
    # acc_events=True: without it torch 2.10-2.13 warn "Profiler clears events at the end of each cycle" at
    # every cycle's start, even the first (torch PR 180387), and later versions from the second cycle on. Each
    # trace file still holds only its own cycle (the chrome trace comes from that cycle's Kineto results);
    # what accumulates is the events of prof.key_averages(), over profile_repeat cycles (bounded: >= 1).
    with torch.profiler.profile(activities=activities(env.device), schedule=schedule, on_trace_ready=handler,
                                record_shapes=cfg.profile_record_shapes, profile_memory=cfg.profile_memory,
                                with_stack=cfg.profile_with_stack, acc_events=True) as prof:
        prof.traces_written = lambda: len(written)
        yield prof


def start_tensorboard(logdir: str | os.PathLike = "runs"):
    """tl.tensorboard.start(logdir), restarted if it already runs: the PyTorch Profiler plugin reads a run once,
    when it first sees it, so a TensorBoard started before a trace was (re)written shows the old trace or none.
    (Notebook 02 teaches it.)"""
    for tb in tensorboard.running():
        if Path(tb.logdir).resolve() == Path(logdir).resolve():
            tensorboard.stop(tb)
    return tensorboard.start(logdir)


def profiler_runs(board, wait_for: str | None = None, timeout: float = 60) -> dict[str, list[str]]:
    """The runs TensorBoard's PyTorch Profiler plugin lists, each with its views ("Overview", "Trace", ...).

    `board` is a tl.tensorboard handle. The plugin scans for traces every 10 s and reads them in the
    background: this waits until it is done loading and, if given, lists the run `wait_for` (at most `timeout` s).
    (Notebook 02 teaches it.)
    """
    def get(path):
        try:
            with urllib.request.urlopen(board.local_url + "data/plugin/pytorch_profiler/" + path, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
            raise UserError(f"TensorBoard at {board.local_url} has no PyTorch Profiler plugin; install it with "
                            "`pip install torch-tb-profiler` and restart TensorBoard") from None

    deadline = time.time() + timeout
    listing = get("runs")
    while (listing["loading"] or not listing["runs"] or (wait_for and wait_for not in listing["runs"])) \
            and time.time() < deadline:
        time.sleep(1)
        listing = get("runs")
    return {run: get("views?" + urllib.parse.urlencode({"run": run})) for run in listing["runs"]}


def _profiler_recording() -> bool:
    return bool(getattr(torch.autograd, "_profiler_enabled", lambda: False)())


def nvtx_range(name: str, enabled: bool):
    """Label a phase of the step ("data wait", "forward", ...).

    An NVTX range (seen by `nsys profile --trace=cuda,nvtx`) when `enabled` and CUDA is present; while
    torch.profiler records, a record_function range of the same name, which summarize() uses to split the
    step; with time_parts=true, its host time (meters.HostParts). Each costs nothing when off. Always: the
    phase this rank is in, for its last words (lastwords.py).
    """
    stack = ExitStack()
    stack.enter_context(lastwords.phase(name))  # the rank's last words say which phase it is in (a hang)
    if PARTS.enabled:  # time_parts=true: its host time
        stack.enter_context(PARTS.part(name))
    if enabled and torch.cuda.is_available():
        stack.enter_context(torch.cuda.nvtx.range(name))
    if _profiler_recording():
        stack.enter_context(torch.profiler.record_function(name))
    return stack


class LabelledDataParallel(torch.nn.DataParallel):
    """nn.DataParallel with the parts of its forward labelled for the profiler and Nsight: every step it
    splits the batch over the GPUs (scatter), copies the model to each of them (replicate), runs the copies in
    one thread each (parallel_apply) and collects their outputs on GPU 0 (gather). Notebook 05 times them."""

    def __init__(self, module: torch.nn.Module, nvtx: bool = False):
        super().__init__(module)
        self.nvtx = nvtx

    def scatter(self, inputs, kwargs, device_ids):
        with nvtx_range("dp scatter", self.nvtx):
            return super().scatter(inputs, kwargs, device_ids)

    def replicate(self, module, device_ids):
        with nvtx_range("dp replicate", self.nvtx):
            return super().replicate(module, device_ids)

    def parallel_apply(self, replicas, inputs, kwargs):
        with nvtx_range("dp parallel forward", self.nvtx):
            return super().parallel_apply(replicas, inputs, kwargs)

    def gather(self, outputs, output_device):
        with nvtx_range("dp gather", self.nvtx):
            return super().gather(outputs, output_device)


# ---------------------------------------------------------------------- line_profiler, into the cell
@dataclass
class LineReport:
    """line_profiler's per-line report. Shown as text when it is the last value of a cell (plain `%lprun`
    sends it to a pager, where nothing is kept)."""
    text: str
    timings: dict  # (file, first line, function name) -> [(line number, hits, time in s)]
    result: object = None  # what the profiled call returned

    def hits(self, source_fragment: str) -> int:
        """How often the profiled line containing `source_fragment` ran (0 if no such line ran)."""
        return self._line(source_fragment)[0]

    def seconds(self, source_fragment: str) -> float:
        """The total time (host clock, s) of the profiled line containing `source_fragment` (0 if none ran)."""
        return self._line(source_fragment)[1]

    def _line(self, source_fragment: str) -> tuple[int, float]:
        for (filename, _, _), lines in self.timings.items():
            source = _source_lines(filename)
            for lineno, nhits, seconds in lines:
                if 0 < lineno <= len(source) and source_fragment in source[lineno - 1]:
                    return nhits, seconds
        return 0, 0.0

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.text)


def _source_lines(filename: str) -> list[str]:
    return linecache.getlines(filename)


def line_profile(functions, call, *args, **kwargs) -> LineReport:
    """Time every line of `functions` (one or a list; plain functions or methods such as
    tl.engine.Run.train_step) while `call(*args, **kwargs)` runs; returns the report, which prints in the cell.

    On a GPU the lines that launch kernels return before the kernels finish, so a line's time is its launch
    cost; the GPU's work shows up on the first line that waits for it (`.item()`, `.tolist()`, a copy to the host).
    (Notebook 02 teaches it.)
    """
    lp = LineProfiler()
    for f in functions if isinstance(functions, (list, tuple)) else [functions]:
        lp.add_function(getattr(f, "__func__", f))
    result = lp.runcall(call, *args, **kwargs)
    stats = lp.get_stats()
    buf = io.StringIO()
    lp.print_stats(stream=buf, output_unit=1e-3, stripzeros=True)
    text = buf.getvalue().replace("Timer unit: 0.001 s", "Time and Per Hit in ms (host clock)")
    text = text.replace(f"File: {os.getcwd()}{os.sep}", "File: ")  # paths relative to the workbook
    timings = {k: [(line, hits, t * stats.unit) for line, hits, t in v] for k, v in stats.timings.items()}
    return LineReport(text.strip() + "\n", timings, result)
