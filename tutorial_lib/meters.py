"""How the loop measures itself without stopping the GPU: the one step clock (CUDA events on a GPU, the host
clock on a CPU), the Result's timing figures computed from it, and the losses read back asynchronously.
The engine, the TensorBoard rate and every bench figure use these (notebooks 01 and 03 teach them)."""
from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager

import torch

from . import distributed, energy, stepgraph
from .config import ConfigError, TrainConfig

COMPILE_WARMUP = 3  # untimed steps at least, with compile=true: step 1 compiles, reduce-overhead records graphs in 2-3


def untimed_steps(cfg: TrainConfig, warmup: int) -> int:
    """The steps left out of the timing: `warmup`, and at least the steps that compile (compile=true) and
    record the graph (cuda_graph=true), whatever timing_warmup says."""
    warmup = max(0, warmup)
    if cfg.compile:
        warmup = max(warmup, COMPILE_WARMUP)
    if cfg.cuda_graph:
        warmup = max(warmup, stepgraph.WARMUP_STEPS + 1)
    return warmup


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def block_means(times: list[float], block: int = 10) -> list[float]:
    """The mean step (ms) of each whole block of `block` steps: the samples from which the uncertainty of the
    mean step is judged (lessons/noise.py), where single steps are too correlated to count one by one."""
    return [sum(times[i:i + block]) / block for i in range(0, len(times) - block + 1, block)]


def timing_fields(clock: "StepClock", batch_size: int, env: distributed.DistEnv) -> dict:
    """The Result's timing figures. Throughput is the timed images over the timed time (after the warm-up),
    of the slowest rank: a job moves at its slowest rank's pace. Mean-based on purpose: N DataLoader workers
    deliver N batches in a burst and then the loop waits, and a median step would hide exactly that stall;
    the median and p10/p90 step times stand beside it. Data wait: the mean per timed step, and the share of
    the timed time spent waiting."""
    clock.capture.stop()  # the timed window is over: Nsight Systems stops recording here
    times = clock.prior_ms + clock.step_times_ms()  # a resumed run: the steps timed before it stopped, too
    total = sum(clock.prior_ms) / 1000 + clock.total_seconds()
    totals = distributed.all_gather(total, env)
    slowest = max(range(len(totals)), key=totals.__getitem__)
    nan = float("nan")  # no timed step (only a resumed run can get here): written as null
    median = statistics.median(times) if times else nan
    waits = clock.prior_waits + clock.waits
    waited = sum(waits)
    return dict(
        throughput_img_s=batch_size * env.world_size * len(times) / totals[slowest] if times else nan,
        step_time_ms={"mean": 1000 * total / len(times) if times else nan, "median": median,
                      "p10": percentile(times, 0.1) if times else nan, "p90": percentile(times, 0.9) if times else nan,
                      "timed_steps": len(times), "block_ms": block_means(times), "slowest_rank": slowest,
                      "slowest_rank_median": max(distributed.all_gather(median, env)),
                      "slowest_rank_total_s": totals[slowest]},
        data_wait_ms=1000 * waited / len(waits) if waits else 0.0,
        data_wait_fraction=waited / total if total else nan,
        host_parts_ms=PARTS.per_step_ms(clock.timed_steps) if clock.parts and clock.timed_steps else None,
        **energy.fields(clock.energy, env, batch_size * env.world_size * len(clock.step_times_ms())))


class LossLog:
    """Losses come back from the GPU without stopping it. Reading a loss (`.item()`, `.tolist()`) waits for
    the GPU to finish everything queued, after which it idles while Python queues the next step: on a fast
    GPU that costs several percent. So each log interval's losses are copied to pinned host memory
    asynchronously and read once the copy has finished, usually at the next interval."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.values: list[float] = []
        self.pending: list[torch.Tensor] = []
        self.inflight: list[tuple] = []  # (step, host tensor, event or None)

    def add(self, loss: torch.Tensor) -> None:
        self.pending.append(loss)

    def ship(self, step: int) -> None:
        if not self.pending:
            return
        t = torch.stack(self.pending).float()
        self.pending.clear()
        if self.cuda:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self.inflight.append((step, host, done))
        else:
            self.inflight.append((step, t, None))

    def ready(self, wait: bool = False) -> list[tuple[int, list[float]]]:
        """(step, losses) of every shipped interval that has arrived, in order; with wait=True, all of them."""
        out = []
        while self.inflight and (wait or self.inflight[0][2] is None or self.inflight[0][2].query()):
            step, host, done = self.inflight.pop(0)
            if done is not None:
                done.synchronize()
            values = host.tolist()
            self.values.extend(values)
            out.append((step, values))
        return out


class HostParts:
    """The host time of each labelled phase of the step ("forward", "dp scatter", ...: profiling.nvtx_range),
    each without the phases inside it, summed from the first timed step on (time_parts=true). A step cut into
    parts without a profiler, whose own work inflates a DataParallel step by a fifth (notebook 05). Only the
    loop's thread is timed (DataParallel's replica threads and autograd's are inside its phases)."""

    def __init__(self):
        self.enabled = False
        self.reset()

    def reset(self) -> None:
        self.totals: dict[str, float] = {}
        self.open: list[float] = []  # per open phase: the time of the phases inside it
        self.t0 = self.t_last = time.perf_counter()  # the first timed step's start; the last one's end
        self.paused = 0.0  # host time between steps that is no step (StepClock.pause_ended)

    def tick(self, pause: bool = False) -> None:
        now = time.perf_counter()
        if pause:
            self.paused += now - self.t_last
        self.t_last = now

    @contextmanager
    def part(self, name: str):
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        t, depth = time.perf_counter(), len(self.open)
        self.open.append(0.0)
        try:
            yield
        finally:
            spent = time.perf_counter() - t
            inner = self.open.pop() if len(self.open) > depth else 0.0  # a reset() inside: nothing to take off
            self.totals[name] = self.totals.get(name, 0.0) + spent - inner
            if self.open:
                self.open[-1] += spent

    def per_step_ms(self, steps: int) -> dict:
        """ms per timed step: each phase, and the host time of the timed steps, pauses left out (`step`)."""
        out = {k: round(1000 * v / steps, 3) for k, v in sorted(self.totals.items(), key=lambda kv: -kv[1])}
        return {**out, "step": round(1000 * (self.t_last - self.t0 - self.paused) / steps, 3)}


PARTS = HostParts()  # the one the loop's phases report to (profiling.nvtx_range)


def device_idle() -> bool:
    """Whether the current CUDA stream has finished all the work queued on it (cudaStreamQuery: no sync)."""
    return torch.cuda.current_stream().query()


class CaptureRange:
    """torch.cuda.profiler.start() and stop() around the timed window, once each: with `nsys profile
    --capture-range=cudaProfilerApi` (notebook 02's job) the report holds the timed steps only, not the start-up,
    the warm-up or the evaluation. Nothing without a GPU or when not enabled (nvtx=false)."""

    def __init__(self, enabled: bool):
        self.enabled, self.started, self.stopped = enabled, False, False

    def start(self) -> None:
        if self.enabled and not self.started:
            torch.cuda.profiler.start()
            self.started = True

    def stop(self) -> None:
        if self.started and not self.stopped:
            torch.cuda.synchronize()  # the window's last kernels inside the capture
            torch.cuda.profiler.stop()
            self.stopped = True


class StepClock:
    """The one clock of the workbook (the training loop, the TensorBoard rate, every bench figure): a mark at
    the end of each step once `warmup` steps are done (warm-up: cuDNN autotuning, compilation, allocator
    growth), CUDA events on a GPU (recorded in the stream, never waited for in the loop), the host clock on a
    CPU (where every op has finished when the step returns). Step times, windows and the total are all
    differences of these marks. Also the host time each timed step waited for its batch."""

    def __init__(self, device: torch.device, warmup: int, time_first: bool = False, prior: dict | None = None,
                 parts: bool = False, capture: bool = False):
        self.cuda = device.type == "cuda"
        self.capture = CaptureRange(self.cuda and capture)  # nsys --capture-range=cudaProfilerApi: the window
        PARTS.enabled = self.parts = parts  # time_parts: the host time of the step's phases (HostParts)
        self.warmup, self.steps = warmup, 0
        self.marks: list = []  # the end of each timed step (and of each pause)
        self.pauses: set[int] = set()  # i: marks[i] -> marks[i + 1] is a pause (a validation pass), not a step
        self.tick_marks: list[int] = []  # index in marks of the end of timed tick k
        self.waits: list[float] = []  # seconds each timed step waited for its batch
        # with time_first, the first step is also timed on its own (one sync): where torch.compile compiles
        self.time_first, self.first_step_s, self._t0, self._first_wait = time_first, None, 0.0, 0.0
        prior = prior or {}  # what a run timed before it was stopped and resumed (its checkpoint keeps it)
        self.prior_ms: list[float] = list(prior.get("times", []))
        self.prior_waits: list[float] = list(prior.get("waits", []))
        self.energy = energy.EnergyMeter(device)  # the GPUs' energy counters at the start, the window, the end

    def carried(self) -> dict:
        """Every step time (ms) and data wait (s) so far, the prior ones included: what a checkpoint keeps."""
        return {"times": self.prior_ms + self.step_times_ms(), "waits": self.prior_waits + self.waits}

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        """Before the first step: with no warm-up the first timed step starts here."""
        self._t0 = time.perf_counter()
        self.energy.mark("loop")
        if self.warmup == 0:
            self.marks.append(self._mark())
            self.tick_marks.append(0)
            PARTS.reset()
            self.energy.mark("window")
            self.capture.start()

    def data_wait(self, seconds: float) -> None:
        """The step about to run waited `seconds` for its batch (counted once the warm-up is over). On a GPU the
        wait counts only when the GPU had run out of queued work by the time the batch came (device_idle): while
        it still works through earlier steps, a host blocked in next() costs the GPU nothing. That block is often
        not even the data: a host far ahead of the GPU (a CUDA-graph step) blocks in the first launch it makes
        once CUDA's launch queue is full, and with loader=gpu_resident that launch is the batch's gather."""
        if self.steps == 0:
            self._first_wait = seconds
        if self.steps >= self.warmup:
            self.waits.append(seconds if not self.cuda or device_idle() else 0.0)

    def tick(self) -> None:
        """The end of a step."""
        self.steps += 1
        if self.steps >= self.warmup:
            self.marks.append(self._mark())
            self.tick_marks.append(len(self.marks) - 1)
            if self.steps == self.warmup:
                PARTS.reset()  # time_parts: the phases are summed from the first timed step on
                self.energy.mark("window")
                self.capture.start()
            else:
                PARTS.tick()
        if self.time_first and self.steps == 1:
            if self.cuda:
                torch.cuda.synchronize()
            self.first_step_s = time.perf_counter() - self._t0 - self._first_wait  # its data wait left out

    def _seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1000 if self.cuda else b - a

    def _read(self) -> None:
        if self.cuda and self.marks:
            self.marks[-1].synchronize()

    def pause_ended(self) -> None:
        """The loop did something that is not a step since the last mark (a validation pass): leave it out."""
        if self.marks:
            self.pauses.add(len(self.marks) - 1)
            self.marks.append(self._mark())
            PARTS.tick(pause=True)

    def _steps(self, first: int = 0, last: int | None = None) -> list:
        """(start, end) marks of the timed steps between marks[first] and marks[last], pauses left out."""
        last = len(self.marks) - 1 if last is None else last
        return [(self.marks[i], self.marks[i + 1]) for i in range(first, last) if i not in self.pauses]

    @property
    def timed_steps(self) -> int:
        return len(self._steps())

    def total_seconds(self) -> float:
        """Time of the timed steps, from the end of the warm-up to the last step, pauses left out."""
        self._read()
        return sum(self._seconds(a, b) for a, b in self._steps())

    def step_times_ms(self) -> list[float]:
        self._read()
        return [1000 * self._seconds(a, b) for a, b in self._steps()]

    def window_seconds(self, window: int) -> list[float]:
        """The time of each full window of `window` timed steps (for the spread of a figure)."""
        self._read()
        ends = self.marks[::window]
        return [self._seconds(a, b) for a, b in zip(ends, ends[1:])]

    def rate(self, step: int, n: int) -> float | None:
        """Steps per second on the device over the n steps ending at the `step`-th tick (of this clock), from
        their marks; None where they were not timed (warm-up). Call it only once that step has completed on
        the device (its loss has arrived): then reading the events does not wait."""
        last = step - self.warmup
        first = max(0, last - n)
        if last <= first or last >= len(self.tick_marks):
            return None
        steps = self._steps(self.tick_marks[first], self.tick_marks[last])
        return len(steps) / sum(self._seconds(a, b) for a, b in steps)


def check_timed(cfg: TrainConfig, total_steps: int, per_epoch: int) -> None:
    """A run must time at least one step after its warm-up, or it has no throughput to report."""
    if total_steps > cfg.timing_warmup:
        return
    steps = f"steps={total_steps}" if cfg.steps else f"epochs={cfg.epochs} x {per_epoch} steps per epoch"
    raise ConfigError(f"{steps} is not above timing_warmup={cfg.timing_warmup}: no step would be timed and the "
                      f"run would have no throughput; use steps={cfg.timing_warmup + 10} or more, or a smaller "
                      "timing_warmup (0 times every step)")
