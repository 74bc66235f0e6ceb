"""THE training loop. Every way of running the workbook (notebook cell, CLI, torchrun, Slurm job) ends here.

Read `Run.fit` top to bottom: fetch a batch, copy it to the device, forward under autocast, backward,
optimizer step; around it a throughput meter, TensorBoard scalars, checkpoints and a profiler hook.
"""
from __future__ import annotations

import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import data, distributed, models, profiling
from .config import ConfigError, TrainConfig, UserError, usable_cpus
from .results import Result, load_result

EXIT_PREEMPTED = 3  # the CLI's exit code after SIGUSR1: checkpoint written, rerun to continue


class Preempted(Exception):
    """Raised after a SIGUSR1 (Slurm's warning before the time limit) once the checkpoint is written."""


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU ({cpu}, {torch.get_num_threads()} threads)"


# ---------------------------------------------------------------------- precision, in one place (notebook 04)
# fp32: every matmul and convolution in float32 (TF32 off: cuDNN convolutions use TF32 by default on Ampere
# and newer, so an honest fp32 baseline turns it off); tf32: the same code on tensor cores with a 10-bit
# mantissa; bf16 / fp16: autocast runs matmuls and convolutions in 16 bits, keeps reductions in float32;
# fp16's narrow range needs a GradScaler (scale the loss, step, update the scale), bf16's does not.
def set_precision_flags(cfg: TrainConfig) -> None:
    """TF32 on for precision=tf32, off otherwise (notebook 01 shows why, notebook 04 measures it)."""
    tf32 = cfg.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast(cfg: TrainConfig, device: torch.device):
    """The autocast context of the forward pass: bf16 or fp16 on the device, nothing for fp32/tf32."""
    if cfg.precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
        return torch.autocast(device.type, dtype=dtype)
    return nullcontext()


def grad_scaler(cfg: TrainConfig, device: torch.device) -> torch.amp.GradScaler:
    """fp16 only: scales the loss so small gradients don't underflow; a no-op object otherwise."""
    return torch.amp.GradScaler(device.type, enabled=cfg.precision == "fp16")


def set_cudnn_benchmark(cfg: TrainConfig) -> None:
    """cuDNN times its algorithms once per input shape: a win, except under DataParallel, whose replicas run in
    fresh threads each step and re-time every step (notebook 05 measures the trap)."""
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark and cfg.parallel != "dp"


@contextmanager
def backend_flags():
    """Restore the torch.backends flags a run changes, so a run in a notebook leaves the kernel as it was."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        yield
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = saved


def lr_lambda(cfg: TrainConfig, total_steps: int):
    """Linear warm-up over warmup_steps, then constant or cosine decay to zero."""
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return f


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def log(env: distributed.DistEnv, msg: str) -> None:
    if env.is_main:
        print(msg, flush=True)


class Run:
    """One training run: builds everything from the config, then `fit()`."""

    def __init__(self, cfg: TrainConfig, env: distributed.DistEnv):
        self.cfg, self.env, self.device = cfg, env, env.device
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.batch_size = cfg.per_device_batch(env.world_size)
        torch.manual_seed(cfg.seed)
        set_precision_flags(cfg)
        set_cudnn_benchmark(cfg)
        self.input = data.build_input(cfg, "train", env, self.batch_size)
        self.steps_per_epoch = self.input.steps_per_epoch
        self.total_steps = cfg.steps or max(1, cfg.epochs * self.steps_per_epoch // cfg.grad_accum_steps)
        self.images_per_step = self.batch_size * env.world_size * cfg.grad_accum_steps
        self.raw_model = models.build(cfg.model, data.num_classes(cfg.dataset)).to(self.device)
        if cfg.channels_last:
            self.raw_model = self.raw_model.to(memory_format=torch.channels_last)
        self.model = self.wrap(self.raw_model)
        self.opt = self.make_optimizer()
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg, self.total_steps))
        self.scaler = grad_scaler(cfg, self.device)
        self.step, self.resumed_from = 0, None
        self.loss_log = LossLog(self.device)
        self.stop_requested = False

    def wrap(self, net: nn.Module) -> nn.Module:
        """The model as the step calls it: DDP or DataParallel around `net`, compiled if asked (notebook 05).
        Under DDP, Dynamo's DDPOptimizer cuts the compiled graph at the gradient buckets so that each bucket's
        all-reduce overlaps the rest of the backward pass (ddp_compile=split: compile the DDP module; inner:
        compile the model, then wrap it -- DDP's forward tells Dynamo, which cuts all the same); whole: no
        cuts (torch._dynamo.config.optimize_ddp=False), one graph, the all-reduces after the backward pass."""
        cfg, env = self.cfg, self.env
        self.ddp = None
        self.flat_sync = cfg.parallel == "ddp" and cfg.flat_grad_sync()
        if cfg.parallel == "ddp":
            if cfg.sync_batchnorm:
                net = self.raw_model = nn.SyncBatchNorm.convert_sync_batchnorm(net)
            if cfg.compile:  # DDPOptimizer cuts the graph at the buckets, for hooks that overlap the backward pass
                torch._dynamo.config.optimize_ddp = cfg.ddp_compile != "whole" and not self.flat_sync
            if cfg.compile and cfg.ddp_compile == "inner":
                net = torch.compile(net, mode=cfg.compile_mode)
            off = {} if cfg.ddp_broadcast_buffers else {"broadcast_buffers": False}  # True: DDP's default
            self.ddp = nn.parallel.DistributedDataParallel(
                net, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=cfg.ddp_bucket_cap_mb, static_graph=cfg.ddp_static_graph,
                gradient_as_bucket_view=cfg.ddp_gradient_as_bucket_view, **off)
            if cfg.compile and cfg.ddp_compile != "inner":
                return torch.compile(self.ddp, mode=cfg.compile_mode)
            return self.ddp
        if cfg.parallel == "dp":
            n = torch.cuda.device_count() if self.device.type == "cuda" else 0
            if n < 2:
                log(env, f"note: parallel=dp with {n or 'no'} GPU{'s' if n != 1 else ''} visible: DataParallel has "
                         "nothing to split and runs the model once per step, as parallel=none would")
            return profiling.LabelledDataParallel(net, nvtx=cfg.nvtx)
        return torch.compile(net, mode=cfg.compile_mode) if cfg.compile else net

    def make_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.cfg
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(self.raw_model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                   weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0)
        return torch.optim.AdamW(self.raw_model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    # ------------------------------------------------------------------ one step
    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = data.normalize(x.to(self.device, non_blocking=True), self.cfg.dataset)
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y.to(self.device, non_blocking=True)

    def train_step(self, x, y) -> torch.Tensor:
        """One optimizer step on a batch, or on lists of grad_accum_steps micro-batches (gradients add up;
        under DDP only the last micro-batch's backward all-reduces, the others run inside no_sync())."""
        nvtx = self.cfg.nvtx
        micro = list(zip(x, y)) if isinstance(x, (list, tuple)) else [(x, y)]
        self.opt.zero_grad(set_to_none=True)
        for i, (x, y) in enumerate(micro):  # one micro-batch at a time
            hooks_sync = self.ddp is not None and i == len(micro) - 1 and not self.flat_sync
            with self.ddp.no_sync() if self.ddp is not None and not hooks_sync else nullcontext():
                with profiling.nvtx_range("forward", nvtx), autocast(self.cfg, self.device):
                    loss = F.cross_entropy(self.model(x), y)
                    if len(micro) > 1:
                        loss = loss / len(micro)
                with profiling.nvtx_range("backward", nvtx):
                    self.scaler.scale(loss).backward()
            total = loss.detach() if i == 0 else total + loss.detach()
        if self.flat_sync:
            self.sync_gradients()
        with profiling.nvtx_range("optimizer", nvtx):
            self.scaler.step(self.opt)
            self.scaler.update()
            self.sched.step()
        return total

    def sync_gradients(self) -> None:
        """ddp_sync=flat: the backward pass ran inside no_sync() (no DDP hooks); average the gradients now."""
        with profiling.nvtx_range("gradient all-reduce", self.cfg.nvtx):
            distributed.average_gradients([p for p in self.raw_model.parameters() if p.requires_grad], self.env)

    # ------------------------------------------------------------------ the loop
    def batches(self):
        """(x, y) on the device forever, epoch after epoch, starting where self.step says (resume)."""
        epoch, start = divmod(self.step * self.cfg.grad_accum_steps, self.steps_per_epoch)
        while True:
            for x, y in self.input.epoch(epoch, start):
                with profiling.nvtx_range("h2d copy", self.cfg.nvtx):
                    batch = self.prepare(x, y)
                yield batch  # outside the range: one left open across the yield would cover the whole step
            epoch, start = epoch + 1, 0

    def fit(self) -> Result:
        cfg, env = self.cfg, self.env
        t_start = time.perf_counter()
        self.maybe_resume()
        meter = StepMeter(self.device, skip=max(0, cfg.timing_warmup - self.step))
        writer = self.tensorboard_writer()
        progress = self.progress_bar()

        def report(wait: bool = False) -> None:
            self.report_losses(self.loss_log.ready(wait), writer, meter, progress)
        old_handler = self.catch_preemption()
        vote = distributed.StopVote(env)
        try:
            with profiling.profiler(cfg, env) as prof:
                batches = self.batches()
                meter.start()
                while self.step < self.total_steps:
                    with profiling.nvtx_range("data wait", cfg.nvtx):
                        t0 = time.perf_counter()
                        x, y = self.next_batch(batches)
                        meter.data_wait(time.perf_counter() - t0)
                    self.loss_log.add(self.train_step(x, y))
                    self.step += 1
                    meter.step_end()
                    prof.step()
                    progress.update(1)
                    if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                        self.loss_log.ship(self.step)
                        report()
                        if vote.poll(self.stop_requested):
                            raise Preempted
                    elif not env.distributed and self.stop_requested:
                        raise Preempted
                    if cfg.ckpt_every and self.step % cfg.ckpt_every == 0:
                        self.loss_log.ship(self.step)
                        report(wait=True)
                        self.save_checkpoint()
                self.loss_log.ship(self.step)
                report(wait=True)
        except Preempted:
            self.loss_log.ship(self.step)
            report(wait=True)
            self.save_checkpoint()
            if env.distributed:  # no rank may exit (and have the launcher stop the others) before rank 0 saved
                torch.distributed.barrier()
            log(env, f"preempted: checkpoint at step {self.step} in {self.out / 'checkpoint.pt'}; "
                     "run the same command again to continue")
            raise
        finally:
            progress.close()
            self.restore_signal(old_handler)
            if writer:
                writer.close()
        if cfg.ckpt_every:
            self.save_checkpoint()
        return self.finish(meter, time.perf_counter() - t_start)

    def next_batch(self, batches):
        """The next step's input: one batch, or lists of grad_accum_steps micro-batches."""
        if self.cfg.grad_accum_steps == 1:
            return next(batches)
        xs, ys = zip(*(next(batches) for _ in range(self.cfg.grad_accum_steps)))
        return list(xs), list(ys)

    @property
    def losses(self) -> list[float]:
        return self.loss_log.values

    def report_losses(self, intervals, writer, meter, progress) -> None:
        """Progress, log lines and TensorBoard scalars for the log intervals whose losses have arrived."""
        for step, values in intervals:
            progress.set_postfix(loss=f"{values[-1]:.3f}", refresh=False)
            if progress.disable:  # batch logs and pipes get a line per log interval instead of a bar
                log(self.env, f"step {step}/{self.total_steps} loss {values[-1]:.4f}")
            if writer:
                writer.add_scalar("train/loss", sum(values) / len(values), step)
                writer.add_scalar("train/lr", self.sched.get_last_lr()[0], step)
                rate = meter.recent_rate(len(values))
                if rate:
                    writer.add_scalar("perf/img_per_s", rate * self.images_per_step, step)
                if self.device.type == "cuda":
                    writer.add_scalar("perf/memory_mb", torch.cuda.max_memory_allocated(self.device) / 2**20, step)

    def finish(self, meter: "StepMeter", wall: float) -> Result:
        cfg, env = self.cfg, self.env
        times = meter.step_times_ms()
        median = statistics.median(times) if times else float("nan")
        slowest = max(distributed.all_gather(median, env))  # the job runs at the pace of its slowest rank
        accuracy = self.evaluate() if cfg.eval else None
        checksums = distributed.all_gather(models.param_checksum(self.raw_model), env)
        peak = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else None
        result = Result(
            config=cfg.to_dict(), device=device_name(self.device), world_size=env.world_size, steps=self.step,
            global_batch=self.images_per_step,
            throughput_img_s=self.images_per_step / (slowest / 1000) if times else 0.0,
            step_time_ms={"median": median, "p10": percentile(times, 0.1) if times else median,
                          "p90": percentile(times, 0.9) if times else median, "timed_steps": len(times),
                          "slowest_rank_median": slowest},
            data_wait_ms=statistics.median(meter.waits) * 1000 if meter.waits else 0.0,
            loss=self.losses, final_loss=self.losses[-1] if self.losses else float("nan"),
            val_accuracy=accuracy, peak_memory_mb=peak, param_checksums=checksums,
            resumed_from_step=self.resumed_from, wall_time_s=wall, torch_version=torch.__version__)
        if env.is_main:
            result.save(self.out)
        return result

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        loader = data.build_input(self.cfg, "val", self.env, self.batch_size)
        correct = torch.zeros(2, device=self.device)
        for x, y in loader.epoch(0, 0):
            x, y = self.prepare(x, y)
            with autocast(self.cfg, self.device):
                pred = self.model(x).argmax(1)
            correct += torch.stack([(pred == y).sum(), torch.tensor(len(y), device=self.device)]).float()
        if self.env.distributed:
            torch.distributed.all_reduce(correct)
        self.model.train()
        return (correct[0] / correct[1]).item()

    # ------------------------------------------------------------------ around the loop
    def tensorboard_writer(self):
        if not (self.cfg.tensorboard and self.env.is_main):
            return None
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.out / "tb"), purge_step=self.step if self.resumed_from else None)

    def progress_bar(self):
        from tqdm import tqdm

        interactive = sys.stdout.isatty() or "ipykernel" in sys.modules  # a bar in a Slurm log is noise
        return tqdm(total=self.total_steps, initial=self.step, unit="step", desc=f"train {self.cfg.model}",
                    disable=not (self.cfg.progress and interactive and self.env.is_main), mininterval=1.0,
                    file=sys.stdout, dynamic_ncols=True)

    def catch_preemption(self):
        def handler(signum, frame):
            self.stop_requested = True
        try:
            return signal.signal(signal.SIGUSR1, handler)
        except ValueError:  # not the main thread: signals can't be caught here
            return None

    @staticmethod
    def restore_signal(old) -> None:
        if old is not None:
            signal.signal(signal.SIGUSR1, old)

    def save_checkpoint(self) -> None:
        if not self.env.is_main:
            return
        self.loss_log.ship(self.step)
        self.loss_log.ready(wait=True)  # the checkpoint holds every loss so far (fit() has reported them)
        state = {"step": self.step, "model": self.raw_model.state_dict(), "optimizer": self.opt.state_dict(),
                 "scheduler": self.sched.state_dict(), "scaler": self.scaler.state_dict(),
                 "losses": self.losses, "rng_cpu": torch.get_rng_state(), "config": self.cfg.to_dict(),
                 "world_size": self.env.world_size}
        if self.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        path = self.out / "checkpoint.pt"
        tmp = path.with_name("checkpoint.pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)  # a crash mid-write never leaves a half-written checkpoint

    def maybe_resume(self) -> None:
        path = self.out / "checkpoint.pt"
        if not (self.cfg.resume and path.is_file()):
            return
        state = torch.load(path, map_location=self.device, weights_only=False)
        for key in ("model", "dataset", "optimizer", "batch_size", "global_batch_size", "precision"):
            if state["config"].get(key) != getattr(self.cfg, key):
                raise ConfigError(f"{path} holds a run with {key}={state['config'].get(key)!r}, not "
                                  f"{getattr(self.cfg, key)!r}; use another out_dir, or resume=false to start afresh")
        self.raw_model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng_cpu"])
        if "rng_cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng_cuda"], self.device)
        self.step, self.resumed_from = state["step"], state["step"]
        self.loss_log.values = list(state["losses"])
        log(self.env, f"resuming from step {self.step} of {path} (resume=false starts afresh)")


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


class StepMeter:
    """Per-step times without a device sync per step: CUDA events on the GPU, the host clock on CPU.
    The first `skip` steps (warm-up: cuDNN autotuning, compilation, allocator growth) are left out."""

    def __init__(self, device: torch.device, skip: int):
        self.cuda = device.type == "cuda"
        self.skip, self.marks, self.waits, self._recent = skip, [], [], []

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        self.marks = [self._mark()]
        self._recent = [time.perf_counter()]

    def step_end(self) -> None:
        self.marks.append(self._mark())
        self._recent.append(time.perf_counter())

    def data_wait(self, seconds: float) -> None:
        if len(self.marks) > self.skip:
            self.waits.append(seconds)

    def recent_rate(self, n: int) -> float | None:
        """Steps per second over the last n steps (host clock; called right after a device sync)."""
        if len(self._recent) <= n:
            return None
        return n / (self._recent[-1] - self._recent[-1 - n])

    def step_times_ms(self) -> list[float]:
        marks = self.marks[self.skip:]
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        return [(b - a) * 1000 for a, b in zip(marks, marks[1:])]


@contextmanager
def prepared_run(cfg: TrainConfig):
    """The prologue every way of running shares (tl.train, the bench): join the process group if launched,
    check the config against where it runs, build the Run; afterwards leave the process group and restore
    the backend flags the run changed."""
    cfg.validate()
    env = distributed.setup(cfg.parallel, cfg.device)
    try:
        with backend_flags():
            cfg.check_runtime(env.device.type, env.world_size, env.launched)
            yield Run(cfg, env)
    finally:
        distributed.teardown(env)


def train(cfg: TrainConfig) -> Result:
    """Train `cfg` in this process (single device, DataParallel, or one DDP rank under a launcher).
    Notebook 01 introduces it; every notebook, the CLI, torchrun and the Slurm jobs end here."""
    with prepared_run(cfg) as run:
        return run.fit()


def launch(cfg: TrainConfig, nproc: int, extra_env: dict | None = None, timeout: float | None = None) -> Result:
    """Run `cfg` as DDP with `nproc` processes through torchrun, streaming their output into the cell
    (notebook 05). Returns the run's result (rank 0's result.json).

    Functions defined in a notebook can't be spawned, so the processes run the package's CLI
    (`-m tutorial_lib train`) with the config as key=value overrides."""
    cfg = cfg.replace(parallel="ddp", progress=False)  # a progress bar can't stream through a pipe
    words = ["--standalone", f"--nproc_per_node={nproc}", "-m", "tutorial_lib", "train", *cfg.to_overrides()]
    print("$ torchrun " + " ".join(words), flush=True)
    threads = max(1, usable_cpus() // nproc)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), **(extra_env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *words], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        print(line, end="", flush=True)
    if proc.wait(timeout) != 0:
        tail = "".join(lines[-5:]).strip()
        raise UserError(f"torchrun exited with code {proc.returncode}; its last lines:\n{tail}")
    return load_result(cfg.out_dir)
