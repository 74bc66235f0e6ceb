"""THE training loop. Every way of running the workbook (notebook cell, CLI, torchrun, Slurm job) ends here.

Read `Run.fit` top to bottom: fetch a batch, copy it to the device, forward under autocast, backward,
optimizer step; around it a throughput meter, TensorBoard scalars, checkpoints and a profiler hook.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import data, distributed, models, peaks, profiling
from .checkpoint import OutDirLock, StopSignals, make_out_dir, read_checkpoint, write_checkpoint
from .config import ConfigError, TrainConfig, UserError, resume_differences, usable_cpus
from .results import Result, load_result

# The CLI's exit code after SIGUSR1 (Slurm's warning before the time limit) or SIGTERM (scancel, a time limit
# without --signal): the checkpoint is written; run the same command again to continue.
EXIT_PREEMPTED = 3
COMPILE_WARMUP = 3  # untimed steps at least, with compile=true: step 1 compiles, reduce-overhead records graphs in 2-3
OPTIMIZER_IMPLS = {"auto": {}, "fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}


class Preempted(Exception):
    """Raised after a stop signal (SIGUSR1 or SIGTERM) once the checkpoint is written."""


class NonFiniteLoss(UserError):
    """The loss became NaN or infinite: training can't recover, so the run stops (without a checkpoint)."""


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model and threads: every printed figure names it (notebook 01 teaches it)."""
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


class SkippedSteps:
    """fp16: the optimizer steps the GradScaler skipped. `scaler.step` skips the update when a gradient is
    inf/NaN, and `scaler.update()` then halves the scale; it never lowers the scale otherwise. So a step after
    which the scale went down was skipped. Counted on the device: nothing waits for the GPU."""

    def __init__(self):
        self.count = None  # a device tensor once a step with an enabled scaler was taken

    @staticmethod
    def scale_before(scaler):
        return scaler._scale.clone() if scaler.is_enabled() else None  # the scaler's scale lives in `_scale`

    def after_update(self, scaler, before) -> None:
        if before is not None:
            skipped = (scaler._scale < before).int()
            self.count = skipped if self.count is None else self.count + skipped

    def total(self) -> int | None:
        return None if self.count is None else int(self.count)


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
        make_out_dir(self.out)
        self.batch_size = cfg.per_device_batch(env.world_size)
        torch.manual_seed(cfg.seed)
        if self.device.type == "cuda":  # peak_memory_mb is this run's, not the notebook kernel's so far
            torch.cuda.reset_peak_memory_stats(self.device)
        set_precision_flags(cfg)
        set_cudnn_benchmark(cfg)
        self.input = data.build_input(cfg, "train", env, self.batch_size)
        self.steps_per_epoch = self.input.steps_per_epoch
        # every input the run needs is opened before its first step: a missing val/ split fails now, not after training
        self.val_input = data.build_input(cfg, "val", env, self.batch_size) if cfg.eval else None
        self.total_steps = cfg.steps or cfg.epochs * self.steps_per_epoch
        self.raw_model = models.build(cfg.model, data.num_classes(cfg.dataset)).to(self.device)
        if cfg.channels_last:
            self.raw_model = self.raw_model.to(memory_format=torch.channels_last)
        self.model = self.wrap(self.raw_model)
        self.opt = self.make_optimizer()
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg, self.total_steps))
        self.scaler = grad_scaler(cfg, self.device)
        self.skipped = SkippedSteps()
        self.step, self.resumed_from = 0, None
        self.loss_log = LossLog(self.device)
        self.stop_requested = False
        self.meter: StepMeter | None = None
        self.prior_timing = {"times": [], "waits": []}  # step times (ms) and data waits (s) before a resume
        self.stop_signal: str | None = None

    def wrap(self, net: nn.Module) -> nn.Module:
        cfg, env = self.cfg, self.env
        model = net
        if cfg.parallel == "ddp":
            model = nn.parallel.DistributedDataParallel(
                net, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=cfg.ddp_bucket_cap_mb, static_graph=cfg.ddp_static_graph,
                gradient_as_bucket_view=cfg.ddp_gradient_as_bucket_view)
        elif cfg.parallel == "dp":
            n = torch.cuda.device_count() if self.device.type == "cuda" else 0
            if n < 2:
                log(env, f"note: parallel=dp with {n or 'no'} GPU{'s' if n != 1 else ''} visible: DataParallel has "
                         "nothing to split and runs the model once per step, as parallel=none would")
            model = nn.DataParallel(net)
        if cfg.compile:
            model = torch.compile(model, mode=cfg.compile_mode)
        return model

    def make_optimizer(self) -> torch.optim.Optimizer:
        """optimizer_impl picks torch.optim's implementation: fused (one kernel updates every parameter),
        foreach (one kernel per operation over all of them), for-loop (kernels per parameter), auto (torch's
        choice: foreach on a GPU). Notebook 04 measures the difference."""
        cfg = self.cfg
        impl = OPTIMIZER_IMPLS[cfg.optimizer_impl]
        try:
            if cfg.optimizer == "sgd":
                return torch.optim.SGD(self.raw_model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                       weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0, **impl)
            return torch.optim.AdamW(self.raw_model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
        except (RuntimeError, TypeError) as e:  # e.g. fused=True where this torch has no fused kernel
            raise ConfigError(f"optimizer_impl={cfg.optimizer_impl!r} does not work for optimizer={cfg.optimizer!r} "
                              f"on {self.device.type} with torch {torch.__version__} ({e}); use "
                              "optimizer_impl=auto") from None

    # ------------------------------------------------------------------ one step
    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = data.normalize(x.to(self.device, non_blocking=True), self.cfg.dataset)
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y.to(self.device, non_blocking=True)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nvtx = self.cfg.nvtx
        with profiling.nvtx_range("forward", nvtx), autocast(self.cfg, self.device):
            loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        with profiling.nvtx_range("backward", nvtx):
            self.scaler.scale(loss).backward()
        with profiling.nvtx_range("optimizer", nvtx):
            scale = self.skipped.scale_before(self.scaler)
            self.scaler.step(self.opt)  # fp16: skipped when a gradient overflowed (inf/NaN), else opt.step()
            self.scaler.update()  # fp16: halve the scale after an overflow, grow it after 2000 clean steps
            self.skipped.after_update(self.scaler, scale)
            self.sched.step()
        return loss.detach()

    # ------------------------------------------------------------------ the loop
    def batches(self):
        """(x, y) on the device forever, epoch after epoch, starting where self.step says (resume)."""
        epoch, start = divmod(self.step, self.steps_per_epoch)
        while True:
            for x, y in self.input.epoch(epoch, start):
                with profiling.nvtx_range("h2d copy", self.cfg.nvtx):
                    batch = self.prepare(x, y)
                yield batch  # outside the range: one left open across the yield would cover the whole step
            epoch, start = epoch + 1, 0

    def fit(self) -> Result:
        """Train to total_steps, evaluate, write result.json. A stop signal (SIGUSR1, SIGTERM) at any point of
        it ends the run with a checkpoint and Preempted; a run already finished returns its saved result."""
        cfg, env = self.cfg, self.env
        t_start = time.perf_counter()
        try:
            with StopSignals(self), OutDirLock(self.out, env.is_main):
                self.maybe_resume()
                if self.step >= self.total_steps and (self.out / "result.json").is_file():
                    log(env, f"{self.out} holds a finished run ({self.step} steps; result.json kept); "
                             "resume=false trains it again from step 0, a larger steps= continues it")
                    return load_result(self.out)
                skip = max(0, cfg.timing_warmup - self.step)
                self.meter = meter = StepMeter(self.device, skip=max(skip, COMPILE_WARMUP) if cfg.compile else skip,
                                               time_first=cfg.compile)
                self.loop(meter)
                self.check_stop()  # a signal during the last steps
                if cfg.ckpt_every or self.resumed_from is not None:  # a checkpoint that exists shows the end
                    self.save_checkpoint()
                    self.check_stop()
                return self.finish(meter, time.perf_counter() - t_start)
        except Preempted:
            self.save_checkpoint()
            distributed.barrier(env, "barrier after the checkpoint")  # no rank exits before rank 0 has saved
            log(env, f"stopped by {self.stop_signal or 'a stop request'}: checkpoint at step {self.step} in "
                     f"{self.out / 'checkpoint.pt'}; run the same command again to continue")
            raise

    def loop(self, meter: "StepMeter") -> None:
        """The step loop: a batch, a step, and every log_every steps the losses, the stop check, a checkpoint."""
        cfg, env = self.cfg, self.env
        writer = self.tensorboard_writer()
        progress = self.progress_bar()

        def report(wait: bool = False) -> None:
            self.report_losses(self.loss_log.ready(wait), writer, meter, progress)
        try:
            self.check_stop()  # a signal during set-up
            with profiling.profiler(cfg, env) as prof:
                batches = self.batches()
                meter.start()
                while self.step < self.total_steps:
                    with profiling.nvtx_range("data wait", cfg.nvtx):
                        t0 = time.perf_counter()
                        x, y = next(batches)
                        meter.data_wait(time.perf_counter() - t0)
                    self.loss_log.add(self.train_step(x, y))
                    self.step += 1
                    meter.step_end()
                    prof.step()
                    progress.update(1)
                    if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                        self.loss_log.ship(self.step)
                        report()
                        self.check_stop()
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
            raise
        except RuntimeError as e:
            with distributed.collective(f"step {self.step + 1}", env):
                raise e
        finally:
            progress.close()
            if writer:
                writer.close()

    def check_stop(self) -> None:
        """Raise Preempted on every rank when a stop signal reached any of them (one small collective)."""
        if distributed.any_rank(self.stop_requested, self.env):
            raise Preempted

    @property
    def losses(self) -> list[float]:
        return self.loss_log.values

    def report_losses(self, intervals, writer, meter, progress) -> None:
        """Progress, log lines and TensorBoard scalars for the log intervals whose losses have arrived."""
        for step, values in intervals:
            self.check_finite(step, values)
            progress.set_postfix(loss=f"{values[-1]:.3f}", refresh=False)
            if progress.disable:  # batch logs and pipes get a line per log interval instead of a bar
                log(self.env, f"step {step}/{self.total_steps} loss {values[-1]:.4f}")
            if writer:
                writer.add_scalar("train/loss", sum(values) / len(values), step)
                writer.add_scalar("train/lr", self.sched.get_last_lr()[0], step)
                rate = meter.recent_rate(len(values))
                if rate:
                    writer.add_scalar("perf/img_per_s", rate * self.batch_size * self.env.world_size, step)
                if self.device.type == "cuda":
                    writer.add_scalar("perf/memory_mb", torch.cuda.max_memory_allocated(self.device) / 2**20, step)

    def check_finite(self, step: int, values: list[float]) -> None:
        """Stop at the first NaN or infinite loss (read where the losses arrive anyway: no extra device sync)."""
        bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
        if bad is None:
            return
        cfg = self.cfg
        cause = (" or an fp16 overflow (try precision=bf16)" if cfg.precision == "fp16" else "")
        raise NonFiniteLoss(
            f"the loss became {values[bad]} at step {step - len(values) + bad + 1}: the learning rate lr={cfg.lr:g} "
            f"is likely too high for batch size {self.batch_size * self.env.world_size} at precision={cfg.precision}"
            f"{cause}; lower lr or add warmup_steps (no checkpoint written for this step)")

    def finish(self, meter: "StepMeter", wall: float) -> Result:
        cfg, env = self.cfg, self.env
        times = self.prior_timing["times"] + meter.step_times_ms()
        median = statistics.median(times) if times else float("nan")
        slowest = max(distributed.all_gather(median, env))  # the job runs at the pace of its slowest rank
        waits = self.prior_timing["waits"] + meter.waits
        accuracy = self.evaluate() if cfg.eval else None
        self.check_stop()  # a signal during the evaluation: the checkpoint holds the last step
        checksums = distributed.all_gather(models.param_checksum(self.raw_model), env)
        peak = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else None
        channels, size, *_ = data.SPECS[cfg.dataset]
        flops = models.flops_per_image(cfg.model, data.num_classes(cfg.dataset), (channels, size, size))
        throughput = self.batch_size * env.world_size / (slowest / 1000) if times else 0.0
        result = Result(
            config=cfg.to_dict(), device=device_name(self.device), world_size=env.world_size, steps=self.step,
            global_batch=self.batch_size * env.world_size,
            throughput_img_s=throughput,
            step_time_ms={"median": median, "p10": percentile(times, 0.1) if times else median,
                          "p90": percentile(times, 0.9) if times else median, "timed_steps": len(times),
                          "mean": statistics.fmean(times) if times else median,
                          "slowest_rank_median": slowest},
            data_wait_ms=statistics.median(waits) * 1000 if waits else 0.0,
            loss=self.losses, final_loss=self.losses[-1] if self.losses else float("nan"),
            val_accuracy=accuracy, peak_memory_mb=peak, param_checksums=checksums,
            resumed_from_step=self.resumed_from, wall_time_s=wall, torch_version=torch.__version__,
            compile_time_s=meter.first_step_s, flops_per_image=flops,
            mfu=peaks.mfu(throughput, flops, device_name(self.device), cfg.precision, env.world_size),
            fp16_skipped_steps=self.skipped.total())
        if env.is_main:
            result.save(self.out)
        return result

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        loader = self.val_input or data.build_input(self.cfg, "val", self.env, self.batch_size)
        correct = torch.zeros(2, device=self.device)
        for x, y in loader.epoch(0, 0):
            if self.stop_requested and not self.env.distributed:
                raise Preempted
            x, y = self.prepare(x, y)
            with autocast(self.cfg, self.device):
                pred = self.model(x).argmax(1)
            correct += torch.stack([(pred == y).sum(), torch.tensor(len(y), device=self.device)]).float()
        if self.env.distributed:
            with distributed.collective("all_reduce (validation accuracy)", self.env):
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

    def save_checkpoint(self) -> None:
        if not self.env.is_main:
            return
        self.loss_log.ship(self.step)
        self.loss_log.ready(wait=True)  # the checkpoint holds every loss so far (fit() has reported them)
        timing = self.prior_timing
        if self.meter is not None:
            timing = {"times": timing["times"] + self.meter.step_times_ms(), "waits": timing["waits"] + self.meter.waits}
        # only tensors, numbers, strings, lists and dicts: it loads with torch.load(weights_only=True)
        state = {"step": self.step, "model": self.raw_model.state_dict(), "optimizer": self.opt.state_dict(),
                 "scheduler": self.sched.state_dict(), "scaler": self.scaler.state_dict(),
                 "losses": self.losses, "rng_cpu": torch.get_rng_state(), "config": self.cfg.to_dict(),
                 "world_size": self.env.world_size, "timing": timing}
        if self.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.device)
        write_checkpoint(state, self.out / "checkpoint.pt")

    def maybe_resume(self) -> None:
        path = self.out / "checkpoint.pt"
        if not (self.cfg.resume and path.is_file()):
            return
        state = read_checkpoint(path, self.device)
        differ = resume_differences(state["config"], self.cfg)
        if state["world_size"] != self.env.world_size:
            differ.append(f"world size {state['world_size']} (now {self.env.world_size})")
        if differ:
            raise ConfigError(f"{path} holds a run with {'; '.join(differ)}: resuming would mix two runs; use "
                              "the checkpoint's values, another out_dir, or resume=false to start afresh")
        self.raw_model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng_cpu"])
        if "rng_cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng_cuda"], self.device)
        self.step, self.resumed_from = state["step"], state["step"]
        self.loss_log.values = list(state["losses"])
        self.prior_timing = state.get("timing") or self.prior_timing
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
    The first `skip` steps (warm-up: cuDNN autotuning, compilation, allocator growth) are left out.
    With `time_first`, the first step is also timed on its own (one sync): where torch.compile compiles."""

    def __init__(self, device: torch.device, skip: int, time_first: bool = False):
        self.cuda = device.type == "cuda"
        self.skip, self.marks, self.waits, self._recent = skip, [], [], []
        self.time_first, self.first_step_s, self.first_wait = time_first, None, 0.0

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
        if self.time_first and len(self.marks) == 2:
            if self.cuda:
                torch.cuda.synchronize()
            self.first_step_s = time.perf_counter() - self._recent[0] - self.first_wait  # its data wait left out

    def data_wait(self, seconds: float) -> None:
        if len(self.marks) == 1:
            self.first_wait = seconds
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
    with StopSignals() as early:  # a signal during set-up reaches the Run, whose fit() then checkpoints
        env = distributed.setup(cfg.parallel, cfg.device, cfg.dist_timeout_s)
        try:
            with backend_flags():
                cfg.check_runtime(env.device.type, env.world_size, env.launched)
                run = Run(cfg, env)
                early.hand_over(run)
                yield run
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
