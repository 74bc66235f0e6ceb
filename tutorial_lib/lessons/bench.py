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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import data, distributed, engine
from ..config import TrainConfig, UserError, usable_cpus
from ..meters import StepClock
from ..results import atomic_write_text

MEASURES = ("io", "synthetic", "full")
CLOSE = 0.10  # figures within 10% count as equal (≈): windows of one measure scatter by about that much
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
        return (f"{self.measure.upper():9s} {self.img_s:>10,.0f} img/s  (windows {self.img_s_low:,.0f}-"
                f"{self.img_s_high:,.0f}, {self.windows} x {self.window_steps} steps, {ranks}) on {device}")


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
    """The training step on distinct batches already on the device; the schedule is rewound afterwards,
    so FULL trains with the learning rates of a fresh run."""
    sched = run.sched.state_dict()
    clock.start()
    for i in range(steps):
        run.train_step(*pool[i % len(pool)])
        clock.tick()
    run.sched.load_state_dict(sched)
    for group, lr in zip(run.opt.param_groups, run.sched.get_last_lr()):
        if isinstance(group["lr"], torch.Tensor):  # cuda_graph=true: the recorded step reads this tensor
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def measure_full(run: engine.Run) -> engine.Result:
    """`Run.fit`, the loop every training run uses, timed by its own clock (`run.clock`)."""
    with contextlib.redirect_stdout(io.StringIO()):  # the run's own "step k/N loss" lines
        return run.fit()


# ---------------------------------------------------------------------------- bench
def bench(cfg: TrainConfig, steps: int | None = None, window: int | None = None, warmup: int | None = None,
          measures: tuple[str, ...] = MEASURES, pool: int = 8) -> BenchResult:
    """Measure IO, SYNTHETIC and FULL for `cfg` (in this process, or on every rank under torchrun) and
    say what bounds it. `steps` timed steps per measure (default cfg.steps or 100) in windows of `window`
    steps (default steps/10), after `warmup` steps (default cfg.timing_warmup) -- plus, for IO and FULL,
    the batches the DataLoader workers had loaded before the clock started (num_workers x prefetch_factor).
    Writes <out_dir>/bench.json; FULL also writes the run's result.json. (Notebook 03 teaches it.)"""
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
    with engine.prepared_run(run_cfg) as run:
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
def verdict(figures: dict, cfg: TrainConfig, device_type: str) -> tuple[str, str]:
    """What bounds the run and a sentence with the figures (each with its window spread) and the knob to turn
    next: "input" (IO below SYNTHETIC), "launch" (FULL well below SYNTHETIC while IO keeps up: the host
    thread that runs the loop, launching the input's and the step's kernels, is the limit), "compute"
    (SYNTHETIC below IO and FULL with it) or "balanced". Figures within CLOSE of each other count as equal."""
    io_, syn = figures["io"].img_s, figures["synthetic"].img_s
    full = figures["full"].img_s if "full" in figures else None
    f = {m: _figure(fig) for m, fig in figures.items()}
    if io_ < (1 - CLOSE) * syn:
        head = f"FULL {f['full']} {_relation(full, io_)} " if full else ""
        bound, text = "input", f"input-bound: {head}IO {f['io']} < SYNTHETIC {f['synthetic']} img/s — {input_knob(cfg, device_type)}"
    elif full is not None and full < (1 - 2 * CLOSE) * syn:
        return "launch", (f"host/launch-bound: FULL {f['full']} is {100 * (1 - full / syn):.0f}% below SYNTHETIC "
                          f"{f['synthetic']} img/s while IO {f['io']} keeps up: the CPU thread that runs the loop, "
                          f"queuing the input's and the step's work, is the limit — {launch_knob(cfg, device_type)}")
    elif syn < (1 - CLOSE) * io_:
        head = f"FULL {f['full']} {_relation(full, syn)} " if full else ""
        bound, text = "compute", (f"compute-bound: {head}SYNTHETIC {f['synthetic']} < IO {f['io']} img/s — "
                                  f"{compute_knob(cfg, device_type)}")
    else:
        tail = f", FULL {f['full']}" if full else ""
        bound, text = "balanced", (f"balanced: IO {f['io']} ≈ SYNTHETIC {f['synthetic']} img/s{tail} — speeding up "
                                   f"one side alone gains little: {input_knob(cfg, device_type)}; and "
                                   f"{compute_knob(cfg, device_type)}")
    if full is not None and full < (1 - 2 * CLOSE) * min(io_, syn):
        text += (f". FULL is {100 * (1 - full / min(io_, syn)):.0f}% below the slower side: loading and the step "
                 f"slow each other down ({_contention_hint(cfg, device_type)})")
    return bound, text


def _figure(m: Measurement) -> str:
    """A figure with its spread: half the range of its windows, in percent of the figure."""
    return f"{m.img_s:,.0f} (±{50 * (m.img_s_high - m.img_s_low) / m.img_s:.0f}%)"


def _relation(a: float, b: float) -> str:
    return "≈" if abs(a - b) <= CLOSE * max(a, b) else ("<" if a < b else ">")


def dataset_mb(cfg: TrainConfig) -> float:
    """Size of the training images as uint8 in memory (what loader=gpu_resident puts on the GPU).
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
        knobs.append(f"move loading and augmentation to the GPU (loader=gpu_resident: {dataset_mb(cfg):,.0f} MB "
                     "of images)")
    workers = cfg.workers()
    if workers < cpus - 1:
        knobs.append(f"raise num_workers (now {workers}; you have {cpus} CPUs per task)")
    else:
        knobs.append(f"ask for more CPUs per task: num_workers={workers} already uses your {cpus}")
    return " or ".join(knobs)


def compute_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the training step is the limit."""
    if device_type != "cuda":
        return "on a CPU the step is the limit; measure again on a GPU"
    if cfg.precision in ("fp32", "tf32"):
        return "compute in bf16: precision=bf16 channels_last=true (notebook 04)"
    if not cfg.channels_last:
        return "channels_last=true (notebook 04)"
    return _graphs_or_batch(cfg) + "; then more GPUs (notebooks 05 and 06)"


def launch_knob(cfg: TrainConfig, device_type: str) -> str:
    """What to change when the host thread that runs the loop is the limit."""
    cpus = usable_cpus()
    if cfg.loader != "gpu_resident" and cfg.workers() >= cpus - 1 > 0:
        return _contention_hint(cfg, device_type)
    if device_type != "cuda":
        return "on a CPU the loading and the step share the cores: measure again on a GPU"
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
    cpus = usable_cpus()
    if cfg.loader != "gpu_resident" and cfg.workers() >= cpus - 1:
        workers = f"{cfg.workers()} worker{'s' if cfg.workers() != 1 else ''}"
        return f"{workers} and the training loop share {cpus} CPUs: try fewer workers"
    if device_type == "cuda" and not cfg.pin_memory:
        return "pageable host-to-device copies block the loop: pin_memory=true"
    return "CPU time, memory bandwidth or host-device syncs shared by both"
