"""IO / SYNTHETIC / FULL: is a training run bound by its input pipeline or by its training step?

    python -m tutorial_lib bench model=resnet18 precision=bf16 channels_last=true num_workers=8
    python -m tutorial_lib bench loader=gpu_resident --steps 200 ...
    torchrun --nproc_per_node=4 -m tutorial_lib bench parallel=ddp ...     # every rank measures

IO         the input pipeline alone: every batch loaded, copied to the device and normalised, nothing else
SYNTHETIC  the training step alone, on a pool of distinct batches already on the device
FULL       the real training loop (`engine.Run.fit`), input and step together

Each figure is the median over timed windows of `window` steps after a warm-up, timed on the device (CUDA
events, read after a synchronize; the host clock on a CPU), on every rank. A job runs at the pace of its
slowest rank, so that rank's figure is the job's. A pool of distinct batches (not one batch reused, which
stays in cache and flatters SYNTHETIC) and per-rank timing (not rank 0 only) keep the figures honest.
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import data, distributed, engine
from .config import TrainConfig, UserError, usable_cpus
from .results import atomic_write_text

MEASURES = ("io", "synthetic", "full")
CLOSE = 0.10  # figures within 10% count as equal (≈): windows of one measure scatter by about that much
FULL_SIZES = {"shapes": 50_000, "shapes_hard": 50_000, "imagefolder": 50_000, "cifar10": 50_000, "cifar100": 50_000, "mnist": 60_000}


@dataclass
class Measurement:
    """One measure of the job: images/s of its slowest rank (times the world size) and that rank's spread."""
    measure: str
    img_s: float  # the job's figure: median window of the slowest rank x world size
    img_s_low: float  # that rank's slowest window (x world size)
    img_s_high: float  # its fastest window
    windows: int
    window_steps: int
    slowest_rank: int
    per_rank_img_s: list  # each rank's own median (img/s of that rank alone)

    def line(self, device: str, world_size: int) -> str:
        ranks = f"slowest of {world_size} ranks" if world_size > 1 else "1 rank"
        return (f"{self.measure.upper():9s} {self.img_s:>10,.0f} img/s  (windows {self.img_s_low:,.0f}-"
                f"{self.img_s_high:,.0f}, {self.windows} x {self.window_steps} steps, {ranks}) on {device}")


@dataclass
class BenchResult:
    config: dict
    device: str
    world_size: int
    global_batch: int
    figures: dict  # measure -> Measurement
    bound: str | None  # "input", "compute", "balanced" (None when IO or SYNTHETIC was not measured)
    verdict: str | None
    full_data_wait_ms: float | None = None  # median time per step FULL waited for its batch (engine's meter)

    def img_s(self, measure: str) -> float:
        return self.figures[measure].img_s

    def summary(self) -> str:
        lines = [f.line(self.device, self.world_size) for f in self.figures.values()]
        if self.full_data_wait_ms is not None:
            lines[-1] += f" | waited {self.full_data_wait_ms:.1f} ms/step for data"
        if self.verdict:
            lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"BenchResult(\n{self.summary()}\n)"

    def save(self, out_dir) -> Path:
        record = asdict(self)
        return atomic_write_text(Path(out_dir) / "bench.json", json.dumps(record, indent=1))


# ---------------------------------------------------------------------------- timing
class WindowClock:
    """A mark after the warm-up and then every `window` steps: CUDA events on a GPU (the loop is never
    synchronised; the events are read at the end), the host clock on a CPU (where every op is synchronous)."""

    def __init__(self, device: torch.device, warmup: int, window: int, windows: int):
        self.cuda = device.type == "cuda"
        self.warmup, self.window, self.windows = warmup, window, windows
        self.total_steps = warmup + window * windows
        self.steps, self.marks = 0, []

    def tick(self) -> None:
        self.steps += 1
        timed = self.steps - self.warmup
        if timed >= 0 and timed % self.window == 0:
            if self.cuda:
                self.marks.append(torch.cuda.Event(enable_timing=True))
                self.marks[-1].record()
            else:
                self.marks.append(time.perf_counter())

    def window_seconds(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def measurement(measure: str, clock: WindowClock, batch: int, env) -> Measurement:
    """The job's figure from every rank's windows (gathered): the slowest rank's median, with its spread."""
    rates = [clock.window * batch / s for s in clock.window_seconds()]
    if not rates:
        raise UserError(f"{measure}: no timed window; raise --steps (it is split into windows of --window steps)")
    every = distributed.all_gather(rates, env)
    medians = [statistics.median(r) for r in every]
    slow = min(range(len(medians)), key=medians.__getitem__)
    w = env.world_size
    return Measurement(measure, medians[slow] * w, min(every[slow]) * w, max(every[slow]) * w, len(rates), clock.window,
                  slow, medians)


# ---------------------------------------------------------------------------- the three measures
def measure_io(run: engine.Run, clock: WindowClock, pool_size: int) -> list:
    """Iterate the run's input (load, copy to the device, normalise) and nothing else; keep the last
    `pool_size` batches for SYNTHETIC."""
    pool = collections.deque(maxlen=pool_size)
    batches = run.batches()
    for _ in range(clock.total_steps):
        pool.append(next(batches))
        clock.tick()
    batches.close()  # ends the epoch's iterator, so its DataLoader workers exit now
    return list(pool)


def measure_synthetic(run: engine.Run, clock: WindowClock, pool: list) -> None:
    """The training step on distinct batches already on the device; the schedule is rewound afterwards,
    so FULL trains with the learning rates of a fresh run."""
    sched = run.sched.state_dict()
    for i in range(clock.total_steps):
        run.train_step(*pool[i % len(pool)])
        clock.tick()
    run.sched.load_state_dict(sched)
    for group, lr in zip(run.opt.param_groups, run.sched.get_last_lr()):
        group["lr"] = lr


def measure_full(run: engine.Run, clock: WindowClock) -> engine.Result:
    """`Run.fit`, the loop every training run uses, with a clock tick after each step."""
    step = run.train_step

    def timed_step(x, y):
        loss = step(x, y)
        clock.tick()
        return loss

    run.train_step = timed_step
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the run's own "step k/N loss" lines
            return run.fit()
    finally:
        del run.train_step  # the closure refers to run: no reference cycle keeps its GPU memory alive


# ---------------------------------------------------------------------------- bench
def bench(cfg: TrainConfig, steps: int | None = None, window: int | None = None, warmup: int | None = None,
          measures: tuple[str, ...] = MEASURES, pool: int = 8) -> BenchResult:
    """Measure IO, SYNTHETIC and FULL for `cfg` (in this process, or on every rank under torchrun) and
    say what bounds it. `steps` timed steps per measure (default cfg.steps or 100) in windows of `window`
    steps (default steps/10), after `warmup` steps (default cfg.timing_warmup) -- plus, for IO and FULL,
    the batches the DataLoader workers had loaded before the clock started (num_workers x prefetch_factor).
    Writes <out_dir>/bench.json; FULL also writes the run's result.json."""
    unknown = [m for m in measures if m not in MEASURES]
    if unknown or not measures:
        raise UserError(f"measures={list(measures)!r}: choose from {', '.join(MEASURES)}")
    steps = steps or cfg.steps or 100
    window = window or max(1, steps // 10)
    warmup = cfg.timing_warmup if warmup is None else warmup
    if steps < window:
        raise UserError(f"steps={steps} is shorter than one window of {window} steps; raise steps or lower window")
    n_windows = steps // window
    prefetched = cfg.num_workers * cfg.prefetch_factor if cfg.loader != "gpu_resident" else 0
    run_cfg = cfg.replace(steps=warmup + prefetched + n_windows * window, timing_warmup=warmup + prefetched,
                          resume=False, eval=False, ckpt_every=0, profile=False, progress=False)
    with engine.prepared_run(run_cfg) as run:
        result = _measure(run, run.env, measures, n_windows, window, warmup, prefetched, pool)
        if run.env.is_main:
            result.save(cfg.out_dir)
        return result


def _measure(run, env, measures, n_windows, window, warmup, prefetched, pool_size) -> BenchResult:
    def clock(extra_warmup):
        return WindowClock(env.device, warmup + extra_warmup, window, n_windows)

    figures, full, pool = {}, None, []
    if "io" in measures:
        io_clock = clock(prefetched)
        pool = measure_io(run, io_clock, pool_size)
        figures["io"] = measurement("io", io_clock, run.batch_size, env)
    elif "synthetic" in measures:
        pool = measure_io(run, WindowClock(env.device, pool_size, 1, 0), pool_size)  # untimed
    if "synthetic" in measures:
        c = clock(0)
        measure_synthetic(run, c, pool)
        figures["synthetic"] = measurement("synthetic", c, run.batch_size, env)
    del pool
    if "full" in measures:
        c = clock(prefetched)
        full = measure_full(run, c)
        figures["full"] = measurement("full", c, run.batch_size, env)
    bound, text = None, None
    if "io" in figures and "synthetic" in figures:
        bound, text = verdict(figures, run.cfg, env.device.type)
    device = engine.device_name(env.device)
    return BenchResult(run.cfg.to_dict(), device, env.world_size, run.batch_size * env.world_size, figures, bound, text,
                       full.data_wait_ms if full else None)


# ---------------------------------------------------------------------------- verdict
def verdict(figures: dict, cfg: TrainConfig, device_type: str) -> tuple[str, str]:
    """What bounds the run ("input", "compute" or "balanced") and a sentence with the figures and the knob
    to turn next. IO and SYNTHETIC within CLOSE of each other count as balanced."""
    io_, syn = figures["io"].img_s, figures["synthetic"].img_s
    full = figures["full"].img_s if "full" in figures else None
    f = lambda v: f"{v:,.0f}"  # noqa: E731
    if io_ < (1 - CLOSE) * syn:
        bound = "input"
        head = f"FULL {f(full)} {_relation(full, io_)} " if full else ""
        text = f"input-bound: {head}IO {f(io_)} < SYNTHETIC {f(syn)} img/s — {input_knob(cfg, device_type)}"
    elif syn < (1 - CLOSE) * io_:
        bound = "compute"
        head = f"FULL {f(full)} {_relation(full, syn)} " if full else ""
        text = f"compute-bound: {head}SYNTHETIC {f(syn)} < IO {f(io_)} img/s — {compute_knob(cfg, device_type)}"
    else:
        bound = "balanced"
        tail = f", FULL {f(full)}" if full else ""
        text = (f"balanced: IO {f(io_)} ≈ SYNTHETIC {f(syn)} img/s{tail} — speeding up one side alone gains "
                f"little: {input_knob(cfg, device_type)}; and {compute_knob(cfg, device_type)}")
    if full is not None and full < (1 - 2 * CLOSE) * min(io_, syn):
        text += (f". FULL is {100 * (1 - full / min(io_, syn)):.0f}% below the slower side: loading and the step "
                 f"slow each other down ({_contention_hint(cfg, device_type)})")
    return bound, text


def _relation(a: float, b: float) -> str:
    return "≈" if abs(a - b) <= CLOSE * max(a, b) else ("<" if a < b else ">")


def dataset_mb(cfg: TrainConfig) -> float:
    """Size of the training images as uint8 in memory (what loader=gpu_resident puts on the GPU)."""
    channels, size, *_ = data.SPECS[cfg.dataset]
    n = cfg.train_size or FULL_SIZES[cfg.dataset]
    return n * channels * size * size / 2**20


def input_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the input pipeline is the limit."""
    cpus = usable_cpus()
    if cfg.loader == "gpu_resident":
        return ("the input already runs on the device: raise batch_size (fewer, larger augmentation launches), "
                "or time it with augment=false")
    knobs = []
    if device_type == "cuda":
        knobs.append(f"move loading and augmentation to the GPU (loader=gpu_resident: {dataset_mb(cfg):,.0f} MB "
                     "of images)")
    if cfg.num_workers < cpus - 1:
        knobs.append(f"raise num_workers (now {cfg.num_workers}; you have {cpus} CPUs per task)")
    else:
        knobs.append(f"ask for more CPUs per task: num_workers={cfg.num_workers} already uses your {cpus}")
    return " or ".join(knobs)


def compute_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the training step is the limit."""
    if device_type != "cuda":
        return "on a CPU the step is the limit; measure again on a GPU"
    if cfg.precision in ("fp32", "tf32"):
        return "compute in bf16: precision=bf16 channels_last=true (notebook 04)"
    if not cfg.channels_last:
        return "channels_last=true (notebook 04)"
    if not cfg.compile:
        return "compile=true: fewer, fused kernels (notebook 04)"
    return "a larger batch_size, or more GPUs (notebooks 05 and 06)"


def _contention_hint(cfg: TrainConfig, device_type: str) -> str:
    cpus = usable_cpus()
    if cfg.loader != "gpu_resident" and cfg.num_workers >= cpus - 1:
        workers = f"{cfg.num_workers} worker{'s' if cfg.num_workers != 1 else ''}"
        return f"{workers} and the training loop share {cpus} CPUs: try fewer workers"
    if device_type == "cuda" and not cfg.pin_memory:
        return "pageable host-to-device copies block the loop: pin_memory=true"
    return "CPU time, memory bandwidth or host-device syncs shared by both"
