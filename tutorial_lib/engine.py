"""THE training loop. Every way of running the workbook (notebook cell, CLI, torchrun, Slurm job) ends here.

Read `Run.fit` top to bottom: fetch a batch, copy it to the device, forward under autocast, backward,
optimizer step; around it the step clock (meters.py), TensorBoard scalars, checkpoints and a profiler hook.
Precision set-up lives in precision.py, the optimizer and its schedule in optimizer.py, checkpoint files, stop
signals and what a checkpoint holds of a Run in checkpoint.py, the validation passes and the loss check in watch.py."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from tqdm import tqdm

from . import buckets, compilecache, data, distributed, lastwords, models, oom, peaks, profiling, stepgraph, tensorboard
from .meters import COMPILE_WARMUP, LossLog, StepClock, check_timed, timing_fields, untimed_steps  # noqa: F401
from .precision import (SkippedSteps, autocast, backend_flags, grad_scaler, set_cudnn_benchmark,  # noqa: F401
                        set_precision_flags)  # tl.engine.set_precision_flags: notebook 01
from .checkpoint import OutDirLock, StopSignals, make_out_dir
from .sharding import checkpoint_path, prepare, resume, save  # checkpoints, also of a sharded model; the model
from .config import ConfigError, TrainConfig, UserError  # noqa: F401  (tl.engine.ConfigError)
from .distributed import device_name  # tl.engine.device_name: notebooks 01-04
from .history import History, check_eval_every, kept_result
from .launcher import launch, torchrun_command  # noqa: F401  (tl.launch, notebook 05; lessons/cases)
from .optimizer import OPTIMIZER_IMPLS, lr_lambda, make_optimizer  # noqa: F401  (engine.OPTIMIZER_IMPLS: 04)
from .results import Result
from .values import count
from .watch import NonFiniteLoss, check_finite, periodic_eval, redo  # noqa: F401  (engine.NonFiniteLoss)

# The CLI's exit code after SIGUSR1 (Slurm's warning before the time limit) or SIGTERM (scancel, a time limit
# without --signal): the checkpoint is written; run the same command again to continue.
EXIT_PREEMPTED = 3


class Preempted(Exception):
    """Raised after a stop signal (SIGUSR1 or SIGTERM) once the checkpoint is written."""


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
        self.input = self.build_input()
        self.steps_per_epoch = self.input.steps_per_epoch
        # every input the run needs is opened before its first step: a missing val/ split fails now, not after training
        self.val_input = data.build_input(cfg, "val", env, self.batch_size) if cfg.eval else None
        self.total_steps = cfg.steps or max(1, cfg.epochs * self.steps_per_epoch // cfg.grad_accum_steps)
        self.images_per_step = self.batch_size * env.world_size * cfg.grad_accum_steps
        check_timed(cfg, self.total_steps, self.steps_per_epoch)
        check_eval_every(cfg, self.total_steps)
        self.raw_model = self.build_model().to(self.device)
        if cfg.channels_last:
            self.raw_model = self.raw_model.to(memory_format=torch.channels_last)
        self.model = self.wrap(self.raw_model)
        self.opt = make_optimizer(cfg, self.raw_model.parameters(), self.device)
        self.restart_schedule()
        self.graphed = stepgraph.GraphedStep(self.graph_body, self.opt, self.device) if cfg.cuda_graph else None
        self.scaler = grad_scaler(cfg, self.device)
        self.skipped = SkippedSteps()
        self.step, self.resumed_from = 0, None
        self.loss_log = LossLog(self.device)
        self.stop_requested = False
        self.clock: StepClock | None = None
        self.prior_timing = {"times": [], "waits": []}  # step times (ms) and data waits (s) before a resume
        self.stop_signal: str | None = None
        self.history = History(cfg)  # val_history, the early stop, their clock (carried in the checkpoint)
        self.t_start = self.saved_step = None  # when this process's fit() began; the step of its last checkpoint

    # The seams a model of the user's comes through (ownmodel.UserRun, tl.card): model, batches, loss, FLOPs.
    def build_model(self) -> nn.Module:
        return models.build(self.cfg.model, data.num_classes(self.cfg.dataset))

    def build_input(self):
        return data.build_input(self.cfg, "train", self.env, self.batch_size)

    def criterion(self, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, y)

    def flops_per_image(self) -> float | None:
        channels, size, *_ = data.SPECS[self.cfg.dataset]
        return models.flops_per_image(self.cfg.model, data.num_classes(self.cfg.dataset), (channels, size, size))

    def wrap(self, net: nn.Module) -> nn.Module:
        """The model as the step calls it: DDP or DataParallel around `net`, compiled if asked (notebook 05).
        Under DDP, Dynamo's DDPOptimizer cuts the compiled graph at the gradient buckets so that each bucket's
        all-reduce overlaps the rest of the backward pass (ddp_compile=split: compile the DDP module; inner:
        compile the model, then wrap it -- DDP's forward tells Dynamo, which cuts all the same); whole: no
        cuts (torch._dynamo.config.optimize_ddp=False), one graph, the all-reduces after the backward pass.
        cuda_graph=true: no DDP module; the recorded step broadcasts the buffers and all-reduces the gradients."""
        cfg, env = self.cfg, self.env
        net = prepare(net, cfg, env)  # activation_checkpointing; parallel=fsdp: sharded, and no wrapper
        self.ddp = None
        self.sync = cfg.sync_mode()  # none, hooks, flat or buckets: decided once, in the config
        self.buckets = None
        if cfg.cuda_graph and env.distributed:  # DDP by hand: the graph holds the gradient all-reduce itself
            distributed.broadcast_(list(net.parameters()) + list(net.buffers()), env)  # rank 0's start, as DDP's
            if self.sync == "buckets":  # all-reduces that overlap the backward pass
                self.buckets = buckets.GradBuckets(net, env, cfg.ddp_bucket_cap_mb, self.grad_dtype())
                if cfg.compile:  # one compiled model would hand back every gradient at its very end
                    buckets.compile_parts(net, cfg.compile_mode)
                    return net
        elif self.sync in ("hooks", "flat"):  # grad_sync=false: no DDP, ranks train apart (notebook 06)
            if cfg.sync_batchnorm:
                net = self.raw_model = nn.SyncBatchNorm.convert_sync_batchnorm(net)
            if cfg.compile:  # DDPOptimizer cuts the graph at the buckets, for hooks that overlap the backward pass
                torch._dynamo.config.optimize_ddp = cfg.ddp_compile != "whole" and self.sync == "hooks"
                torch._dynamo.config.capture_profiler_record_function = True  # DDP.forward's range: kept, no warning
            if cfg.compile and cfg.ddp_compile == "inner":
                net = torch.compile(net, mode=cfg.compile_mode)
            off = {} if cfg.ddp_broadcast_buffers else {"broadcast_buffers": False}  # True: DDP's default
            self.ddp = nn.parallel.DistributedDataParallel(
                net, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                bucket_cap_mb=cfg.ddp_bucket_cap_mb, static_graph=cfg.ddp_static_graph,
                gradient_as_bucket_view=cfg.ddp_gradient_as_bucket_view, **off)
            if cfg.ddp_grad_dtype == "bf16":  # the buckets travel in bf16 (the flat all-reduce does the same)
                self.ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
            if cfg.compile and cfg.ddp_compile != "inner":
                return torch.compile(self.ddp, mode=cfg.compile_mode)
            return self.ddp
        if cfg.parallel == "dp":
            n = torch.cuda.device_count() if self.device.type == "cuda" else 0
            if n < 2:
                log(env, f"note: parallel=dp with {count(n or 'no', 'GPU')} visible: DataParallel has "
                         "nothing to split and runs the model once per step, as parallel=none would")
            return profiling.LabelledDataParallel(net, nvtx=cfg.nvtx)
        return torch.compile(net, mode=cfg.compile_mode) if cfg.compile else net

    def restart_schedule(self) -> None:  # from step 1: into the optimizer, or the tensor a CUDA graph reads
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(self.cfg, self.total_steps))

    # ------------------------------------------------------------------ one step
    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = data.normalize(x.to(self.device, non_blocking=True), self.cfg.dataset)
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y.to(self.device, non_blocking=True)

    def train_step(self, x, y) -> torch.Tensor:
        """One optimizer step on a batch, or on lists of grad_accum_steps micro-batches (gradients add up;
        under DDP only the last micro-batch's backward all-reduces, the others run inside no_sync())."""
        if self.graphed is not None:  # cuda_graph=true: forward, backward, all-reduce and update in one replay
            loss = self.graphed(x, y)
            self.sched.step()  # writes the next step's learning rate into the tensor the graph reads
            return loss
        nvtx = self.cfg.nvtx
        micro = list(zip(x, y)) if isinstance(x, (list, tuple)) else [(x, y)]
        self.opt.zero_grad(set_to_none=True)
        total = None
        for i, (x, y) in enumerate(micro):  # one micro-batch at a time
            hooks_sync = self.sync == "hooks" and i == len(micro) - 1
            with self.ddp.no_sync() if self.ddp is not None and not hooks_sync else nullcontext():
                with profiling.nvtx_range("forward", nvtx), autocast(self.cfg, self.device):
                    loss = self.criterion(self.model(x), y)
                    if len(micro) > 1:
                        loss = loss / len(micro)
                with profiling.nvtx_range("backward", nvtx):
                    self.scaler.scale(loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.sync == "flat":
            self.sync_gradients()
        with profiling.nvtx_range("optimizer", nvtx):
            scale = self.skipped.scale_before(self.scaler)
            self.scaler.step(self.opt)  # fp16: skipped when a gradient overflowed (inf/NaN), else opt.step()
            self.scaler.update()  # fp16: halve the scale after an overflow, grow it after 2000 clean steps
            self.skipped.after_update(self.scaler, scale)
            self.sched.step()
        return total

    def graph_body(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step cuda_graph=true records (stepgraph.py): what DDP would do (buffers from rank 0 before the
        forward pass, gradients averaged after the backward pass), with no host work that a replay would skip."""
        if self.env.distributed and self.cfg.grad_sync and self.cfg.ddp_broadcast_buffers:
            distributed.broadcast_(list(self.raw_model.buffers()), self.env)
        with autocast(self.cfg, self.device):
            loss = self.criterion(self.model(x), y)
        if self.sync == "buckets":
            self.buckets.start()
        loss.backward()
        if self.sync == "flat":
            self.sync_gradients()
        elif self.sync == "buckets":  # the buckets started during the backward pass; wait for them
            self.buckets.finish()
        self.opt.step()
        return loss.detach()

    def grad_dtype(self) -> torch.dtype | None:  # ddp_grad_dtype: what the gradients travel in
        return torch.bfloat16 if self.cfg.ddp_grad_dtype == "bf16" else None

    def sync_gradients(self) -> None:
        """ddp_sync=flat: the backward pass ran inside no_sync() (no DDP hooks); average the gradients now."""
        with profiling.nvtx_range("gradient all-reduce", self.cfg.nvtx):
            distributed.average_gradients([p for p in self.raw_model.parameters() if p.requires_grad], self.env,
                                          self.grad_dtype())

    # ------------------------------------------------------------------ the loop
    def batches(self):
        """(x, y) on the device forever, epoch after epoch, starting where self.step says (resume)."""
        epoch, start = divmod(self.step * self.cfg.grad_accum_steps, self.steps_per_epoch)
        while True:
            batches = self.input.epoch(epoch, start)
            try:
                for x, y in batches:
                    with profiling.nvtx_range("h2d copy", self.cfg.nvtx):
                        batch = self.prepare(x, y)
                    yield batch  # outside the range: one left open across the yield would cover the whole step
            finally:  # the run ended mid-epoch (its last step, an error, a stop): the loader's workers end now
                batches.close()
            epoch, start = epoch + 1, 0

    def fit(self) -> Result:
        """Train to total_steps, evaluate, write result.json. A stop signal (SIGUSR1, SIGTERM) at any point of
        it ends the run with a checkpoint and Preempted; a run already finished returns its saved result."""
        cfg, env = self.cfg, self.env
        t_start = self.t_start = time.perf_counter()
        try:
            with StopSignals(self), OutDirLock(self.out, env.is_main):
                self.maybe_resume()
                if self.history.finished(self.step, self.total_steps):
                    kept, said = kept_result(self.out, self.step, self.history.stopped_by)
                    log(env, said)
                    if kept is not None:  # else written again from the checkpoint, no step trained again
                        return kept
                self.clock = StepClock(self.device, warmup=untimed_steps(cfg, cfg.timing_warmup - self.step),
                                       time_first=cfg.compile, prior=self.prior_timing, parts=cfg.time_parts,
                                       capture=cfg.nvtx)  # nvtx=true: the nsys job records the window only
                self.loop(self.clock)
                self.check_stop()  # a signal during the last steps
                if cfg.ckpt_every or self.resumed_from is not None:  # a checkpoint that exists shows the end
                    self.save_checkpoint()
                    self.check_stop()
                return self.finish(self.clock, time.perf_counter() - t_start)
        except Preempted:
            self.save_checkpoint()
            distributed.barrier(env, "barrier after the checkpoint")  # no rank exits before rank 0 has saved
            log(env, f"stopped by {self.stop_signal or 'a stop request'}: checkpoint at step {self.step} in "
                     f"{checkpoint_path(self)}; run the same command again to continue")
            raise

    def loop(self, clock: StepClock) -> None:
        """The step loop: a batch, a step, and every log_every steps the losses, the stop check, a checkpoint."""
        cfg, env = self.cfg, self.env
        writer = self.tensorboard_writer()
        progress = self.progress_bar()
        first_step = self.step

        def report(wait: bool = False) -> None:
            self.report_losses(self.loss_log.ready(wait), writer, first_step, progress)
        vote = distributed.StopVote(env, cfg.log_every, self.total_steps)  # cast a step before a log step: no sync
        batches = None
        try:
            self.check_stop()  # a signal during set-up
            redo(self, log)  # the validation pass a stop cut short (resumed)
            with profiling.profiler(cfg, env) as prof, oom.one_line(self.device, self.batch_size, cfg.precision):
                batches = self.batches()
                clock.start()
                while self.step < self.total_steps and not self.history.stopped_by:  # finished early (resumed)
                    with profiling.nvtx_range("data wait", cfg.nvtx):
                        t0 = time.perf_counter()
                        x, y = self.next_batch(batches)
                        clock.data_wait(time.perf_counter() - t0)
                    self.loss_log.add(self.train_step(x, y))
                    self.step += 1
                    clock.tick()
                    if cfg.eval_every and self.history.t_loop is None:  # val_history's clock starts after the first
                        self.history.t_loop = self.synced_time()  # step, whose one-off costs are not training
                    traces = prof.traces_written()
                    prof.step()
                    if prof.traces_written() != traces:  # writing a trace file (seconds) is not a training step
                        clock.pause_ended()
                    progress.update(1)
                    if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                        self.loss_log.ship(self.step)
                        report()
                    if vote.stop_now(self.step, self.stop_requested):  # DDP: at log steps, where ranks agree
                        raise Preempted
                    if cfg.ckpt_every and self.step % cfg.ckpt_every == 0:
                        self.loss_log.ship(self.step)
                        report(wait=True)
                        self.save_checkpoint()
                    if cfg.eval_every and self.step % cfg.eval_every == 0 and periodic_eval(self, log):
                        break  # target_accuracy or patience (the same accuracy on every rank: all-reduced)
            vote.settle()
            self.loss_log.ship(self.step)
            report(wait=True)
        except Preempted:
            vote.settle()
            self.loss_log.ship(self.step)
            report(wait=True)
            raise
        except RuntimeError as e:
            with distributed.collective(f"step {self.step + 1}", env):
                raise e
        finally:
            if batches is not None:
                batches.close()  # ends the DataLoader's workers now, not when the garbage is collected
            progress.close()
            if writer:
                writer.close()

    def check_stop(self) -> None:
        """Raise Preempted on every rank when a stop signal reached any of them (one small collective)."""
        if distributed.any_rank(self.stop_requested, self.env):
            raise Preempted

    def next_batch(self, batches):
        """The next step's input: one batch, or lists of grad_accum_steps micro-batches."""
        if self.cfg.grad_accum_steps == 1:
            return next(batches)
        xs, ys = zip(*(next(batches) for _ in range(self.cfg.grad_accum_steps)))
        return list(xs), list(ys)

    @property
    def losses(self) -> list[float]:
        return self.loss_log.values

    def report_losses(self, intervals, writer, first_step: int, progress) -> None:
        """Progress, log lines and TensorBoard scalars for the log intervals whose losses have arrived. Their
        steps have completed on the device, so perf/img_per_s is the device's rate over them (the clock's
        marks), not the pace at which the host queued them."""
        for step, values in intervals:
            check_finite(self, step, values)
            progress.set_postfix(loss=f"{values[-1]:.3f}", refresh=False)
            if progress.disable:  # batch logs and pipes get a line per log interval instead of a bar
                log(self.env, f"step {step}/{self.total_steps} loss {values[-1]:.4f}")
            if writer:
                writer.add_scalar("train/loss", sum(values) / len(values), step)
                writer.add_scalar("train/lr", self.sched.get_last_lr()[0], step)
                rate = self.clock.rate(step - first_step, len(values))
                if rate:
                    writer.add_scalar("perf/img_per_s", rate * self.images_per_step, step)
                if self.device.type == "cuda":
                    writer.add_scalar("perf/memory_mb", torch.cuda.max_memory_allocated(self.device) / 2**20, step)

    def finish(self, clock: StepClock, wall: float) -> Result:
        cfg, env = self.cfg, self.env
        timing = timing_fields(clock, self.batch_size * cfg.grad_accum_steps, env)  # images per rank and step
        last = self.history.points[-1] if self.history.points else None
        accuracy = last[2] if last and last[0] == self.step else self.evaluate() if cfg.eval else None
        self.check_stop()  # a signal during the evaluation: the checkpoint holds the last step
        flops = self.flops_per_image()
        result = Result(
            config=cfg.to_dict(), device=device_name(self.device), world_size=env.world_size, steps=self.step,
            global_batch=self.images_per_step, **timing,
            loss=self.losses, final_loss=self.losses[-1] if self.losses else float("nan"), val_accuracy=accuracy,
            peak_memory_mb=torch.cuda.max_memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else None,
            param_checksums=distributed.all_gather(models.param_checksum(self.raw_model), env),
            resumed_from_step=self.resumed_from, wall_time_s=self.history.wall_before + wall,
            torch_version=torch.__version__,
            compile_time_s=clock.first_step_s, flops_per_image=flops,
            mfu=peaks.mfu(timing["throughput_img_s"], flops, device_name(self.device), cfg.precision, env.world_size),
            fp16_skipped_steps=self.skipped.total(), num_workers_used=self.input.workers,
            val_history=self.history.points, stopped_by=self.history.stopped_by or "steps")
        if env.is_main:
            self.save_result(result)
        return result

    def save_result(self, result: Result) -> None:
        """result.json; when it can't be written (a full disk, a quota), the trained run goes into a checkpoint
        (unless one holds this step already) and a one-line error says how to get the result from it."""
        try:
            result.save(self.out)
        except UserError as e:
            log(self.env, f"the run's result, not saved: {result.summary()}")
            try:
                if self.saved_step != self.step:
                    self.save_checkpoint()
            except UserError:
                raise UserError(f"{e}. The checkpoint could not be saved either: the trained weights are lost; "
                                "free space, then train again") from None
            raise UserError(f"{e}. The trained run is kept in its checkpoint at step {self.step} "
                            f"({checkpoint_path(self)}): once there is space, run the same command again: it "
                            "writes result.json, training nothing") from None

    def synced_time(self) -> float:
        """The host clock once the device has run everything queued."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        if self.val_input is None:  # built once: a gpu_resident set is copied to the device once
            self.val_input = data.build_input(self.cfg, "val", self.env, self.batch_size)
        loader = self.val_input
        correct = torch.zeros(2, device=self.device)
        for x, y in loader.epoch(0, 0):
            if self.stop_requested and not self.env.distributed:
                raise Preempted
            x, y = self.prepare(x, y)
            with autocast(self.cfg, self.device):
                pred = self.model(x).argmax(1)
            correct += torch.stack([(pred == y).sum(), torch.tensor(len(y), device=self.device)]).float()
        if self.env.distributed:
            distributed.all_reduce(correct, self.env, "all_reduce (validation accuracy)")
        self.model.train()
        return (correct[0] / correct[1]).item()

    # ------------------------------------------------------------------ around the loop
    def tensorboard_writer(self):
        if not (self.cfg.tensorboard and self.env.is_main):
            return None
        return tensorboard.event_writer(self.out / "tb", purge_step=self.step if self.resumed_from else None)

    def progress_bar(self):
        interactive = sys.stdout.isatty() or "ipykernel" in sys.modules  # a bar in a Slurm log is noise
        return tqdm(total=self.total_steps, initial=self.step, unit="step", desc=f"train {self.cfg.model}",
                    disable=not (self.cfg.progress and interactive and self.env.is_main), mininterval=1.0,
                    file=sys.stdout, dynamic_ncols=True)

    def save_checkpoint(self) -> None:
        """Everything this run needs to continue: rank 0's checkpoint.pt, or every rank's shards (sharding.save)."""
        save(self)

    def maybe_resume(self) -> None:
        """Continue from out_dir's checkpoint when resume=true and it exists (sharding.resume: if it fits)."""
        if resume(self):
            log(self.env, f"resuming from step {self.step} of {checkpoint_path(self)} "
                          "(resume=false starts afresh)")


@contextmanager
def prepared_run(cfg: TrainConfig, make_run=Run):
    """The prologue every way of running shares (tl.train, the bench, tl.card): join the process group if
    launched, check the config against where it runs, build the Run (`make_run(cfg, env)`: ownmodel.UserRun for
    a model of the user's); afterwards leave the process group and restore the backend flags the run changed."""
    cfg.validate()
    with StopSignals() as early:  # a signal during set-up reaches the Run, whose fit() then checkpoints
        env = distributed.setup(cfg.parallel, cfg.device, cfg.dist_timeout_s)
        try:
            with backend_flags():
                distributed.check_launch(cfg.parallel, env)
                cfg.check_runtime(env.device.type, env.world_size, env.launched)
                if cfg.compile and (said := compilecache.use()):  # the shared cache, before anything compiles
                    log(env, said)
                run = make_run(cfg, env)
                early.hand_over(run)
                try:
                    with lastwords.Recorder(run.out / "ranks", env, run):  # each rank's step and phase, for a hang
                        yield run
                        distributed.barrier(env, "the end of the run")  # no rank tears down while another talks
                finally:  # a live graph holding NCCL calls makes destroy_process_group hang (pytorch#115388)
                    if run.graphed is not None:
                        run.graphed.release()
        finally:
            distributed.teardown(env)


def train(cfg: TrainConfig) -> Result:
    """Train `cfg` in this process (single device, DataParallel, or one DDP rank under a launcher).
    Notebook 01 introduces it; every notebook, the CLI, torchrun and the Slurm jobs end here."""
    with prepared_run(cfg) as run:
        return run.fit()
