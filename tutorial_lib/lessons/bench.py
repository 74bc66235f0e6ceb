"""IO / SYNTHETIC / FULL: is a training run bound by its input pipeline or by its training step?

    python -m tutorial_lib bench model=resnet18 precision=bf16 channels_last=true num_workers=8
    python -m tutorial_lib bench loader=gpu_resident --steps 200 ...
    torchrun --nproc_per_node=4 -m tutorial_lib bench parallel=ddp ...     # every rank measures

IO         the input pipeline alone: every batch loaded, copied to the device and normalised, nothing else
SYNTHETIC  the training step alone, on a pool of distinct batches already on the device
FULL       the real training loop (`engine.Run.fit`), input and step together

Each figure is defined as the training's throughput_img_s is: the images of the timed steps (after a
warm-up) over their time, on the engine's clock (StepClock: CUDA events on a GPU, the host clock on a
CPU), on every rank; beside it the slowest and fastest window of `window` steps, so that an effect can be
told from noise. A job runs at the pace of its slowest rank, so that rank's figure is the job's. A pool of distinct batches (not one batch reused, which
stays in cache and flatters SYNTHETIC) and per-rank timing (not rank 0 only) keep the figures honest.
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from . import noise
from .. import data, distributed, engine
from ..config import TrainConfig, UserError, usable_cpus
from ..meters import StepClock
from ..results import atomic_write_text
from ..values import count

MEASURES = ("io", "synthetic", "full")
CLOSE = 0.10  # IO and SYNTHETIC this close on average are balanced; FULL against them: noise.relation
CPU_LIMIT = "on a CPU the step is the limit; measure again on a GPU"  # the knob of every verdict on a CPU but input
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

    def line(self, device: str, world_size: int) -> str:
        ranks = f"slowest of {world_size} ranks" if world_size > 1 else "1 rank"
        n = spec(self.img_s)
        return (f"{self.measure.upper():9s} {self.img_s:>10{n}} img/s  (windows {self.img_s_low:{n}}-"
                f"{self.img_s_high:{n}}, {self.windows} x {self.window_steps} steps, {ranks}) on {device}")


@dataclass
class BenchResult:
    config: dict
    device: str
    world_size: int
    global_batch: int
    figures: dict  # measure -> Measurement
    bound: str | None  # "input", "compute", "launch", "balanced" (None when IO or SYNTHETIC was not measured)
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
                       [r for r, _ in every])


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
        bound, text = verdict(figures, run.cfg, env.device.type)
    device = engine.device_name(env.device)
    return BenchResult(run.cfg.to_dict(), device, env.world_size, run.batch_size * env.world_size, figures, bound, text,
                       full.data_wait_ms if full else None, full.data_wait_fraction if full else None)


# ---------------------------------------------------------------------------- verdict
def figure(m: Measurement) -> noise.Figure:
    """A measure as a figure with its band: the slowest to the fastest window (noise.FLOOR at least)."""
    return noise.Figure.of(m.img_s, m.img_s_low, m.img_s_high)


def from_reference(figures: dict, key: str) -> dict:
    """The Measurements of one row of a reference file that stores `<key>_<measure>`, `_low` and `_high`
    (notebook 03's 03_loader_ladder), to judge them again with today's rule."""
    return {m: Measurement(m, figures[f"{key}_{m}"], figures[f"{key}_{m}_low"], figures[f"{key}_{m}_high"], 0, 0, 0, [])
            for m in MEASURES if f"{key}_{m}" in figures}


def bound(figures: dict) -> str | None:
    """What bounds the run. IO against SYNTHETIC on average (within CLOSE: balanced), FULL against SYNTHETIC
    window by window (noise.relation: overlapping bands are equal): "input" when IO is below SYNTHETIC, or when
    FULL is below SYNTHETIC while IO's slowest window is too (the loader delivers in bursts and the step waits
    in the slow ones; there FULL's mean below SYNTHETIC's band is enough, since the waits are what widen FULL's
    band); "launch" when FULL is below SYNTHETIC although IO keeps up in every window; "compute"
    when SYNTHETIC is below IO and FULL reaches it; else "balanced"."""
    if "io" not in figures or "synthetic" not in figures:
        return None
    io_, syn = figures["io"].img_s, figure(figures["synthetic"])
    full = figure(figures["full"]) if "full" in figures else None
    if io_ < (1 - CLOSE) * syn.value:
        return "input"
    io_dips = figures["io"].img_s_low < syn.low
    if full is not None and io_dips and full.value < syn.low:  # stalls widen FULL's band: its mean decides here
        return "input"
    if full is not None and noise.relation(full, syn) == "<":
        return "input" if io_dips else "launch"
    if syn.value < (1 - CLOSE) * io_:
        return "compute"
    return "balanced"


def in_bursts(figures: dict, kind: str | None = None) -> bool:
    """Input-bound although IO keeps up on average: its slow windows stall the step (`bound`'s second case)."""
    kind = bound(figures) if kind is None else kind
    return kind == "input" and figures["io"].img_s >= (1 - CLOSE) * figures["synthetic"].img_s


def bound_label(figures: dict) -> str | None:
    """`bound` for a table's bound column: 'input (in bursts)' where the loader keeps up on average but not in
    every window, so that the column agrees with the verdict beside it. (Notebook 03 uses it.)"""
    kind = bound(figures)
    return "input (in bursts)" if kind and in_bursts(figures, kind) else kind


def verdict(figures: dict, cfg: TrainConfig, device_type: str) -> tuple[str, str]:
    """What bounds the run (`bound`) and a sentence with the figures (each with its window spread) and the
    knob to turn next. A FULL above the slower side by more than the spread is flagged: in a steady state the
    loop can't outrun its input or its step, so one of the three was measured in unusual conditions."""
    kind = bound(figures)
    io_, syn = figure(figures["io"]), figure(figures["synthetic"])
    full = figure(figures["full"]) if "full" in figures else None
    f = {m: _figure(fig) for m, fig in figures.items()}
    slow = f"{figures['io'].img_s_low:{spec(syn.value)}}"  # IO's slowest window
    bursts = in_bursts(figures, kind)
    if bursts:
        text = (f"input-bound in bursts: FULL {f['full']} < SYNTHETIC {f['synthetic']} img/s; IO averages "
                f"{f['io']} but its slowest window delivers {slow}, below SYNTHETIC: the step "
                f"waits for batches in the slow windows — {burst_knob(cfg, device_type)}")
    elif kind == "input":
        head = f"FULL {f['full']} {_relation(full, io_)} " if full else ""
        text = f"input-bound: {head}IO {f['io']} < SYNTHETIC {f['synthetic']} img/s — {input_knob(cfg, device_type)}"
    elif kind == "launch":
        why = ("the CPU thread that runs the loop, queuing the input's and the step's work, is the limit — "
               if device_type == "cuda" else "the loading shares the cores that run the step — ")
        return "launch", (f"host/launch-bound: FULL {f['full']} is {100 * (1 - full.value / syn.value):.0f}% below "
                          f"SYNTHETIC {f['synthetic']} img/s while IO {f['io']} keeps up in every window: {why}"
                          f"{launch_knob(cfg, device_type)}")
    elif kind == "compute":
        head = f"FULL {f['full']} {_relation(full, syn)} " if full else ""
        text = (f"compute-bound: {head}SYNTHETIC {f['synthetic']} < IO {f['io']} img/s — "
                f"{compute_knob(cfg, device_type)}")
        if full is not None and figures["io"].img_s_low < syn.low:
            text += (f". IO's slowest window ({slow}) is below SYNTHETIC: the batches the "
                     "loader had queued bridged it this time; a longer slow spell would stall the step")
    else:
        tail = f", FULL {f['full']}" if full else ""
        text = (f"balanced: IO {f['io']} ≈ SYNTHETIC {f['synthetic']} img/s{tail} — speeding up one side alone "
                f"gains little: {input_knob(cfg, device_type)}; and {compute_knob(cfg, device_type)}")
    if full is not None:
        slower = min((io_, syn), key=lambda x: x.value)
        rel = noise.relation(full, slower)
        if rel == ">":
            text += (". FULL is above the slower side by more than the windows' spread, which a steady loop can't "
                     "be: one of the measures ran in unusual conditions (other work on the machine?); measure again")
        elif rel == "<" and not bursts and full.value < (1 - 2 * CLOSE) * slower.value:
            text += (f". FULL is {100 * (1 - full.value / slower.value):.0f}% below the slower side: loading and the "
                     f"step slow each other down ({_contention_hint(cfg, device_type)})")
    return kind, text


def _figure(m: Measurement) -> str:
    """A figure with its band as the verdicts judge it (`figure`: the windows, noise.FLOOR at least), e.g.
    '9,300 (±5%)'; windows that differ by more than the figure itself: their range."""
    return noise.shown(figure(m), "windows", spec(m.img_s))


def spec(img_s: float) -> str:
    """How the bench prints a rate: whole images per second, one decimal below 100 (a large model on a CPU)."""
    return ",.1f" if img_s < 100 else ",.0f"


def _relation(a: noise.Figure, b: noise.Figure) -> str:
    return noise.relation(a, b)


def dataset_mb(cfg: TrainConfig) -> float:
    """Size in MiB (2**20 bytes) of the training images as uint8 in memory (what loader=gpu_resident puts on
    the GPU).
    (Notebook 03 teaches it.)"""
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
        knobs.append(f"move loading and augmentation to the GPU (loader=gpu_resident: {dataset_mb(cfg):,.0f} MiB "
                     "of images)")
    workers, in_job = cfg.workers(), bool(os.environ.get("SLURM_CPUS_PER_TASK"))
    if workers < cpus - 1:
        knobs.append(f"raise num_workers (now {workers}; you have {count(cpus, 'CPU')} "
                     + ("per task)" if in_job else "for this process)"))
    elif in_job:
        knobs.append(f"ask for more CPUs per task: num_workers={workers} already uses your {cpus}")
    else:
        knobs.append(f"more CPUs (in a Slurm job: --cpus-per-task): num_workers={workers} already uses the {cpus} "
                     "this process may use")
    return " or ".join(knobs)


def burst_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the loader delivers in bursts: first what steadies the delivery and the config does not
    have yet (workers started anew every epoch, pageable copies that block the loop), then `input_knob`. On one
    H200, 8 workers delivered in bursts (FULL 12,179 img/s, waiting 5.7 ms a step); the same 8 workers pinned and
    persistent did not (FULL 17,441, 1.0 ms), where 4 -> 8 workers had raised FULL by 3%."""
    steady = []
    if cfg.loader != "gpu_resident" and cfg.workers() > 0 and not cfg.persistent_workers:
        steady.append("persistent_workers=true (without it the workers start anew every epoch)")
    if cfg.loader != "gpu_resident" and device_type == "cuda" and not cfg.pin_memory:
        steady.append("pin_memory=true (pageable host-to-device copies block the loop)")
    if not steady:
        return input_knob(cfg, device_type)
    return f"first steady the delivery: {' and '.join(steady)}; then {input_knob(cfg, device_type)}"


def compute_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the training step is the limit."""
    if device_type != "cuda":
        return CPU_LIMIT
    if cfg.precision in ("fp32", "tf32"):
        return "compute in bf16: precision=bf16 channels_last=true (notebook 04)"
    if not cfg.channels_last:
        return "channels_last=true (notebook 04)"
    return _graphs_or_batch(cfg) + "; then more GPUs (notebooks 05 and 06)"


def launch_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the host thread that runs the loop is the limit. On a CPU the step itself runs on the
    cores the loading shares: the step is the limit there, whatever the workers (fewer than one is none)."""
    if device_type != "cuda":
        return CPU_LIMIT
    cpus = usable_cpus()
    if cfg.loader != "gpu_resident" and cfg.workers() >= cpus - 1 > 0:
        return _contention_hint(cfg, device_type)
    return _graphs_or_batch(cfg)


def _graphs_or_batch(cfg: TrainConfig) -> str:
    """A small step on a fast GPU waits for the CPU to launch its kernels. What removes that limit: CUDA
    graphs (cuda_graph=true: the whole step is one launch; compile_mode=reduce-overhead: the compiled forward
    and backward pieces) or a larger batch (fewer, larger kernels). Not plain compile=true: its default mode
    still launches every kernel, and on an H200 at batch 256 it made the bf16 step slower than eager."""
    if cfg.cuda_graph or (cfg.compile and cfg.compile_mode == "reduce-overhead"):
        return f"a larger batch_size (now {cfg.batch_size}: fewer, larger kernels per image) (notebook 04)"
    return ("replay the whole step as one CUDA graph: cuda_graph=true (with compile=true for fused kernels), or "
            f"a larger batch_size (now {cfg.batch_size}: fewer, larger kernels per image); measure both (notebook 04)")


def _contention_hint(cfg: TrainConfig, device_type: str) -> str:
    if device_type != "cuda":
        return "on a CPU the loading and the step share the cores"
    cpus = usable_cpus()
    if cfg.loader != "gpu_resident" and cfg.workers() >= cpus - 1:
        workers = count(cfg.workers(), "worker")
        return f"{workers} and the training loop share {cpus} CPUs: try fewer workers"
    if device_type == "cuda" and not cfg.pin_memory:
        return "pageable host-to-device copies block the loop: pin_memory=true"
    return "CPU time, memory bandwidth or host-device syncs shared by both"
