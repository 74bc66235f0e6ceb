"""IO / SYNTHETIC / FULL: is a training run bound by its input pipeline or by its training step?

    python -m tutorial_lib bench model=resnet18 precision=bf16 channels_last=true num_workers=8
    python -m tutorial_lib bench loader=gpu_resident --steps 200 ...
    torchrun --nproc_per_node=4 -m tutorial_lib bench parallel=ddp ...     # every rank measures

IO         the input pipeline alone: every batch loaded, copied to the device and normalised, nothing else
SYNTHETIC  the training step alone, on a pool of distinct batches already on the device
FULL       the real training loop (`engine.Run.fit`), input and step together

Each figure is defined as the training's throughput_img_s is: the images of the timed steps (after a
warm-up) over their time, on the engine's clock (StepClock: CUDA events on a GPU, the host clock on a
CPU), on every rank; beside it the rate of each window of `window` steps, the samples from which the interval
of the mean is judged (lessons/noise.py). A job runs at the pace of its slowest rank, so that rank's figure is the job's. A pool of distinct batches (not one batch reused, which
stays in cache and flatters SYNTHETIC) and per-rank timing (not rank 0 only) keep the figures honest.
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import noise
from .. import data, distributed, engine
from ..config import TrainConfig, UserError, usable_cpus
from ..meters import StepClock
from ..results import atomic_write_text
from ..values import count

MEASURES = ("io", "synthetic", "full")
WAITED = 0.2  # FULL waited for data this share of its time or more: the input is a limit, whatever else is
CPU_LIMIT = "on a CPU the step is the limit; measure again on a GPU"  # the knob of every verdict on a CPU but input
LABELS = {"input": "input-bound", "bursts": "input-bound in bursts", "step": "step-bound", "launch": "launch-bound",
          "compute": "compute-bound", "contended": "contended", "balanced": "balanced", "disagrees":
          "measurement disagrees", "not settled": "not settled"}
FULL_SIZES = {"shapes": 50_000, "shapes_hard": 50_000, "imagefolder": 50_000, "cifar10": 50_000, "cifar100": 50_000, "mnist": 60_000}


@dataclass
class Measurement:
    """One measure of the job: images/s of its slowest rank (times the world size) and that rank's spread."""
    measure: str
    img_s: float  # the job's figure: timed images / timed time of the slowest rank x world size
    img_s_low: float  # that rank's slowest window (x world size)
    img_s_high: float  # its fastest window
    windows: int
    window_steps: int
    slowest_rank: int
    per_rank_img_s: list  # each rank's own figure (img/s of that rank alone)
    window_img_s: list = field(default_factory=list)  # that rank's windows (x world size): the samples of the mean

    def line(self, device: str, world_size: int) -> str:
        ranks = f"slowest of {world_size} ranks" if world_size > 1 else "1 rank"
        n = spec(self.img_s)
        mean = noise.shown(figure(self), n).split(" ", 1)  # the figure and the interval of its mean
        sure = f" {mean[1]}" if len(mean) > 1 else ""
        return (f"{self.measure.upper():9s} {self.img_s:>10{n}} img/s{sure:6s} (windows {self.img_s_low:{n}}-"
                f"{self.img_s_high:{n}}, {self.windows} x {self.window_steps} steps, {ranks}) on {device}")


@dataclass
class BenchResult:
    config: dict
    device: str
    world_size: int
    global_batch: int
    figures: dict  # measure -> Measurement
    bound: str | None  # a key of LABELS (None when IO or SYNTHETIC was not measured)
    verdict: str | None
    full_data_wait_ms: float | None = None  # mean time per step FULL waited for its batch (the engine's clock)
    full_data_wait_fraction: float | None = None  # share of FULL's timed time spent waiting for batches

    def img_s(self, measure: str) -> float:
        return self.figures[measure].img_s

    def summary(self) -> str:
        lines = [f.line(self.device, self.world_size) for f in self.figures.values()]
        if self.full_data_wait_ms is not None:
            share = f" ({100 * self.full_data_wait_fraction:.0f}% of the time)" if self.full_data_wait_fraction else ""
            lines[-1] += f" | waited {self.full_data_wait_ms:.1f} ms/step for data{share}"
        if self.verdict:
            lines.append(f"verdict: {self.verdict}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"BenchResult(\n{self.summary()}\n)"

    def save(self, out_dir) -> Path:
        record = asdict(self)
        return atomic_write_text(Path(out_dir) / "bench.json", json.dumps(record, indent=1))


# ---------------------------------------------------------------------------- timing
def clock(run: engine.Run, warmup: int) -> StepClock:
    """The engine's clock (StepClock), which FULL gets from `Run.fit` itself."""
    return StepClock(run.device, warmup)


def measurement(measure: str, clock: StepClock, window: int, batch: int, env) -> Measurement:
    """The job's figure, defined as the training's throughput_img_s is (meters.timing_fields): timed images over
    timed time, of the rank that took longest; the spread: that rank's slowest and fastest window."""
    seconds = clock.total_seconds()
    if not clock.timed_steps or not seconds:
        raise UserError(f"{measure}: no timed window; raise --steps (it is split into windows of --window steps)")
    rates = [window * batch / s for s in clock.window_seconds(window)]
    every = distributed.all_gather((clock.timed_steps * batch / seconds, rates), env)
    slow = min(range(len(every)), key=lambda r: every[r][0])
    w = env.world_size
    own, windows = every[slow]
    return Measurement(measure, own * w, min(windows) * w, max(windows) * w, len(rates), window, slow,
                       [r for r, _ in every], [r * w for r in windows])


# ---------------------------------------------------------------------------- the three measures
def measure_io(run: engine.Run, clock: StepClock, steps: int, pool_size: int) -> list:
    """Iterate the run's input (load, copy to the device, normalise) and nothing else; keep the last
    `pool_size` batches for SYNTHETIC."""
    pool = collections.deque(maxlen=pool_size)
    batches = run.batches()
    clock.start()
    for _ in range(steps):
        pool.append(next(batches))
        clock.tick()
    batches.close()  # ends the epoch's iterator, so its DataLoader workers exit now
    return list(pool)


def measure_synthetic(run: engine.Run, clock: StepClock, steps: int, pool: list) -> None:
    """The training step on distinct batches already on the device; the schedule restarts afterwards
    (`Run.restart_schedule`), so FULL trains with the learning rates of a fresh run."""
    clock.start()
    for i in range(steps):
        run.train_step(*pool[i % len(pool)])
        clock.tick()
    run.restart_schedule()


def measure_full(run: engine.Run) -> engine.Result:
    """`Run.fit`, the loop every training run uses, timed by its own clock (`run.clock`)."""
    with contextlib.redirect_stdout(io.StringIO()):  # the run's own "step k/N loss" lines
        return run.fit()


# ---------------------------------------------------------------------------- bench
def bench(cfg: TrainConfig, steps: int | None = None, window: int | None = None, warmup: int | None = None,
          measures: tuple[str, ...] = MEASURES, pool: int = 8, make_run=engine.Run) -> BenchResult:
    """Measure IO, SYNTHETIC and FULL for `cfg` (in this process, or on every rank under torchrun) and
    say what bounds it. `steps` timed steps per measure (default cfg.steps or 100) in windows of `window`
    steps (default steps/10), after `warmup` steps (default cfg.timing_warmup) -- plus, for IO and FULL,
    the batches the DataLoader workers had loaded before the clock started (num_workers x prefetch_factor).
    Writes <out_dir>/bench.json; FULL also writes the run's result.json. `make_run`: the Run to build
    (ownmodel.UserRun: a model and batches of the user's, tl.card). (Notebook 03 teaches it.)"""
    unknown = [m for m in measures if m not in MEASURES]
    if unknown or not measures:
        raise UserError(f"measures={list(measures)!r}: choose from {', '.join(MEASURES)}")
    steps = steps or cfg.steps or 100
    window = window or max(1, steps // 10)
    warmup = cfg.timing_warmup if warmup is None else warmup
    if steps < window:
        raise UserError(f"steps={steps} is shorter than one window of {window} steps; raise steps or lower window")
    n_windows = steps // window
    prefetched = cfg.workers() * cfg.prefetch_factor if cfg.loader != "gpu_resident" else 0
    run_cfg = cfg.replace(steps=warmup + prefetched + n_windows * window, timing_warmup=warmup + prefetched,
                          resume=False, eval=False, ckpt_every=0, profile=False, progress=False)
    with engine.prepared_run(run_cfg, make_run) as run:
        result = _measure(run, run.env, measures, n_windows, window, warmup, prefetched, pool)
        if run.env.is_main:
            result.save(cfg.out_dir)
        return result


def _measure(run, env, measures, n_windows, window, warmup, prefetched, pool_size) -> BenchResult:
    timed = n_windows * window
    figures, full, pool = {}, None, []
    if "io" in measures:
        c = clock(run, warmup + prefetched)
        pool = measure_io(run, c, warmup + prefetched + timed, pool_size)
        figures["io"] = measurement("io", c, window, run.batch_size, env)
    elif "synthetic" in measures:
        pool = measure_io(run, clock(run, pool_size), pool_size, pool_size)  # untimed
    if "synthetic" in measures:
        c = clock(run, warmup)
        measure_synthetic(run, c, warmup + timed, pool)
        figures["synthetic"] = measurement("synthetic", c, window, run.batch_size, env)
    del pool
    if "full" in measures:
        full = measure_full(run)  # its config times the steps after warmup + prefetched
        figures["full"] = measurement("full", run.clock, window, run.batch_size, env)
    bound, text = None, None
    if "io" in figures and "synthetic" in figures:
        bound, text = verdict(figures, run.cfg, env.device.type, full.data_wait_fraction if full else None)
    device = engine.device_name(env.device)
    return BenchResult(run.cfg.to_dict(), device, env.world_size, run.batch_size * env.world_size, figures, bound, text,
                       full.data_wait_ms if full else None, full.data_wait_fraction if full else None)


# ---------------------------------------------------------------------------- verdict
def figure(m: Measurement) -> noise.Figure:
    """A measure as an estimate of its mean rate: from its windows (noise.of_windows), or from the slowest and
    fastest of them where a record kept only those (noise.of_range)."""
    if len(m.window_img_s or []) > 1:
        return noise.of_windows(m.window_img_s, m.img_s)
    return noise.of_range(m.img_s, m.img_s_low, m.img_s_high, m.windows)


def from_reference(figures: dict, key: str, windows: int = 10) -> dict:
    """The Measurements of one row of a reference file that stores `<key>_<measure>`, `_low` and `_high`
    (notebook 03's 03_loader_ladder), to judge them again with today's rule; `<key>_windows` where stored, else
    `windows` (the bench's default: steps // 10 steps per window)."""
    n = figures.get(f"{key}_windows", windows)
    return {m: Measurement(m, figures[f"{key}_{m}"], figures[f"{key}_{m}_low"], figures[f"{key}_{m}_high"], n, 0, 0, [])
            for m in MEASURES if f"{key}_{m}" in figures}


def _cmp(a: Measurement, b: Measurement) -> noise.Ratio:
    """The rule on two measures. They run one after the other, each its own loop with its own warm-up: as two
    runs, so the floor applies (FULL's loop does a little more than the step alone, always)."""
    return noise.compare(figure(a), figure(b))


def bound(figures: dict, device_type: str = "cuda", waited: float | None = None, idle: float | None = None) -> str | None:
    """What bounds the run, by the rule (noise.compare of the measures' means, `_cmp`):
    "disagrees" when FULL is faster than IO or SYNTHETIC (a loop can't outrun its parts);
    "input" when IO is slower than SYNTHETIC, or FULL waited for data `waited` >= WAITED of its time;
    "bursts" (input-bound in bursts) when IO keeps up on average but its slowest window, as a single figure, is
    slower than SYNTHETIC, and FULL is slower than SYNTHETIC; "contended" when FULL is slower than SYNTHETIC although IO keeps up in every
    window; "balanced" when FULL reaches SYNTHETIC and IO is within noise of it; "step" when FULL reaches
    SYNTHETIC otherwise (IO faster, or too bursty to settle on average: FULL's pace says the step is the limit). That is all the bench can tell; "launch" or "compute" only
    with evidence of a GPU's trace: `idle`, the share of the step the GPU sat idle (>= 0.3: launch, else
    compute); a CPU launches no kernels. "not settled" where a comparison that decides is not settled."""
    if "io" not in figures or "synthetic" not in figures:
        return None
    io_, syn, full = figures["io"], figures["synthetic"], figures.get("full")
    if full is not None and "higher" in (_cmp(full, io_).verdict, _cmp(full, syn).verdict):
        return "disagrees"
    io_vs = _cmp(io_, syn).verdict
    if io_vs == "lower" or (waited or 0) >= WAITED:
        return "input"
    if full is None:
        return {"higher": "step", "equal": "balanced"}.get(io_vs, "not settled")
    full_vs = _cmp(full, syn).verdict
    if full_vs == "lower":  # IO keeps up on average; its slowest window, judged as one figure, may not
        dips = noise.compare(noise.Figure.of(io_.img_s_low), figure(syn)).verdict == "lower"
        return "bursts" if dips else "contended"
    if full_vs == "not settled":
        return "not settled"
    if io_vs == "equal":
        return "balanced"  # FULL reaches SYNTHETIC, and IO delivers no more: both sides are the limit
    if device_type == "cuda" and idle is not None:
        return "launch" if idle >= 0.3 else "compute"
    return "step"


def in_bursts(figures: dict, kind: str | None = None) -> bool:
    """Input-bound although IO keeps up on average: its slow windows stall the step (`bound`'s "bursts")."""
    return (bound(figures) if kind is None else kind) == "bursts"


def bound_label(figures: dict, device_type: str = "cuda") -> str | None:
    """`bound` for a table's bound column, in the words of the verdict: 'input-bound in bursts', 'step-bound'.
    (Notebook 03 uses it.)"""
    kind = bound(figures, device_type)
    return LABELS[kind] if kind else None


def _pair(figures: dict, kind: str) -> tuple[str, str]:
    """The two measures whose ratio decides `kind`."""
    if kind == "disagrees":
        return max((("full", "io"), ("full", "synthetic")), key=lambda p: _cmp(figures[p[0]], figures[p[1]]).value)
    if kind == "not settled":
        pairs = [p for p in (("full", "synthetic"), ("io", "synthetic")) if p[0] in figures]
        return next((p for p in pairs if _cmp(figures[p[0]], figures[p[1]]).verdict == "not settled"), pairs[0])
    pair = {"input": ("io", "synthetic"), "step": ("synthetic", "io"), "compute": ("synthetic", "io"),
            "launch": ("synthetic", "io"), "balanced": ("io", "synthetic")}.get(kind, ("full", "synthetic"))
    return pair if pair[0] in figures else ("io", "synthetic")


def behind(figures: dict, kind: str) -> str:
    """The one ratio behind a bound, with its interval: 'IO/SYNTHETIC x0.34 (0.31-0.37)'."""
    a, b = _pair(figures, kind)
    return f"{a.upper()}/{b.upper()} {_cmp(figures[a], figures[b])}"


def verdict(figures: dict, cfg: TrainConfig, device_type: str, waited: float | None = None,
            idle: float | None = None) -> tuple[str, str]:
    """What bounds the run (`bound`) in two lines at most: the bound and the one ratio behind it with its
    interval; then the knob to turn next. The figures and their windows are in the bench's record."""
    kind = bound(figures, device_type, waited, idle)
    head = f"{LABELS[kind]}: {behind(figures, kind)}"
    if kind == "input" and _cmp(figures["io"], figures["synthetic"]).verdict != "lower":  # decided by the wait
        ratio = f", {behind(figures, 'bursts')}" if "full" in figures else ""
        head = f"{LABELS[kind]}: waited for data {100 * waited:.0f}% of the time{ratio}"
    knob = {"input": input_knob, "bursts": burst_knob, "step": compute_knob, "compute": compute_knob,
            "launch": launch_knob, "contended": _contention_hint, "balanced": input_knob}.get(kind)
    if kind == "disagrees":
        tail = "rerun: a loop can't outrun its parts (other work on the machine?)"
    elif kind == "not settled":
        a, b = _pair(figures, kind)
        more = _cmp(figures[a], figures[b]).more
        tail = f"measure longer: {more} more windows would decide" if more else "measure longer (raise --steps)"
    else:
        tail = knob(cfg, device_type)
    return kind, f"{head}\nnext: {tail}"


def _figure(m: Measurement) -> str:
    """A figure with the interval of its mean, as the verdicts judge it (`figure`): '9,300 ±2%'."""
    return noise.shown(figure(m), spec(m.img_s))


def spec(img_s: float) -> str:
    """How the bench prints a rate: whole images per second, one decimal below 100 (a large model on a CPU)."""
    return ",.1f" if img_s < 100 else ",.0f"


def dataset_mb(cfg: TrainConfig) -> float:
    """Size in MiB (2**20 bytes) of the training images as uint8 in memory (what loader=gpu_resident puts on
    the GPU).
    (Notebook 03 teaches it.)"""
    channels, size, *_ = data.SPECS[cfg.dataset]
    n = cfg.train_size or FULL_SIZES[cfg.dataset]
    return n * channels * size * size / 2**20


def input_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the input pipeline is the limit (one line of a verdict)."""
    cpus = usable_cpus()
    if cfg.loader == "gpu_resident":
        return "raise batch_size (fewer augmentation launches), or time it with augment=false"
    knobs = []
    if device_type == "cuda":
        knobs.append(f"loader=gpu_resident ({dataset_mb(cfg):,.0f} MiB of images)")
    workers, in_job = cfg.workers(), bool(os.environ.get("SLURM_CPUS_PER_TASK"))
    if workers < cpus - 1:
        knobs.append(f"num_workers above {workers} ({count(cpus, 'CPU')}" + (" per task)" if in_job and not knobs else ")"))
    elif in_job or knobs:
        knobs.append(f"more CPUs ({count(workers, 'worker')} on {cpus})")
    else:
        knobs.append(f"more CPUs (Slurm: --cpus-per-task; {count(workers, 'worker')} on {cpus})")
    return " or ".join(knobs)


def burst_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the loader delivers in bursts: first what steadies the delivery and the config does not
    have yet (workers started anew every epoch, pageable copies that block the loop), else `input_knob`. On one
    H200, 8 workers delivered in bursts (FULL 12,179 img/s, waiting 5.7 ms a step); the same 8 workers pinned and
    persistent did not (FULL 17,441, 1.0 ms), where 4 -> 8 workers had raised FULL by 3%."""
    steady = []
    if cfg.loader != "gpu_resident" and cfg.workers() > 0 and not cfg.persistent_workers:
        steady.append("persistent_workers=true")
    if cfg.loader != "gpu_resident" and device_type == "cuda" and not cfg.pin_memory:
        steady.append("pin_memory=true")
    if not steady:
        return input_knob(cfg, device_type)
    return f"steady the delivery first: {' '.join(steady)}"


def compute_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the training step is the limit."""
    if device_type != "cuda":
        return CPU_LIMIT
    if cfg.precision in ("fp32", "tf32"):
        return "compute in bf16: precision=bf16 channels_last=true (notebook 04)"
    if not cfg.channels_last:
        return "channels_last=true (notebook 04)"
    return _graphs_or_batch(cfg)


def launch_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the host thread that launches the GPU's kernels is the limit (a trace's idle share
    says so); a CPU launches no kernels, its step is the limit."""
    if device_type != "cuda":
        return CPU_LIMIT
    return _graphs_or_batch(cfg)


def _graphs_or_batch(cfg: TrainConfig) -> str:
    """A small step on a fast GPU waits for the CPU to launch its kernels. What removes that limit: CUDA
    graphs (cuda_graph=true: the whole step is one launch; compile_mode=reduce-overhead: the compiled forward
    and backward pieces) or a larger batch (fewer, larger kernels). Not plain compile=true: its default mode
    still launches every kernel, and on an H200 at batch 256 it made the bf16 step slower than eager."""
    if cfg.cuda_graph or (cfg.compile and cfg.compile_mode == "reduce-overhead"):
        return f"a larger batch_size (now {cfg.batch_size}), then more GPUs (notebooks 05, 06)"
    return f"cuda_graph=true (one launch a step) or a larger batch_size (now {cfg.batch_size})"


def _contention_hint(cfg: TrainConfig, device_type: str) -> str:
    """What to change when FULL is below both of its parts: the input and the step slow each other."""
    if device_type != "cuda":
        return CPU_LIMIT  # the loading shares the step's cores; fewer than one worker is none
    if cfg.loader == "gpu_resident":
        return _graphs_or_batch(cfg)  # no loader: the host thread that runs the loop launches the input's work too
    cpus = usable_cpus()
    if cfg.loader != "gpu_resident" and cfg.workers() >= cpus - 1:
        return f"fewer workers: {count(cfg.workers(), 'worker')} and the loop share {cpus} CPUs"
    if not cfg.pin_memory:
        return "pin_memory=true (pageable host-to-device copies block the loop)"
    return "look for host-device syncs in the step (a trace, notebook 02)"
