"""TrainConfig: every knob of a training run, validated, loadable from YAML, overridable with key=value.

Also the few facts every layer needs once: the workbook's root folder, the CPUs this process may use and
the one rule for DataLoader workers, the multiprocessing start method. How one value is read (text, YAML) lives
in values.py, the error classes in errors.py; both are re-exported here (`config.UserError`, `config.format_value`).
This module never imports torch, so job rendering (`tutorial_lib.jobs`) can use it on a login node.
"""
from __future__ import annotations

import dataclasses
import inspect
import multiprocessing as mp
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, DataNotFound, UserError  # noqa: F401  (config.UserError, ...: their old home)
from .values import (check_choice, check_one_line, check_positive, coerce, format_value,  # noqa: F401
                     is_whole, read_yaml, suggest)

ROOT = Path(__file__).resolve().parents[1]  # the workbook checkout: notebooks/, jobs/, data/, configs/ live here
CONFIGS_DIR = ROOT / "configs"


def usable_cpus() -> int:
    """CPUs this process may use: the Slurm allocation (SLURM_CPUS_PER_TASK) inside a job, else the CPUs it
    is pinned to (the affinity mask; os.cpu_count() where there is none, as on macOS). Not os.cpu_count():
    on a shared node that counts CPUs that belong to other jobs. The processes one torchrun starts share
    those CPUs: each gets its share (LOCAL_WORLD_SIZE of them on this node). (Notebook 03 teaches it.)"""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if is_whole(slurm) and int(slurm) > 0:
        cpus = int(slurm)
    elif hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(0))
    else:
        cpus = os.cpu_count() or 1
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if "TORCHELASTIC_RUN_ID" in os.environ and is_whole(local) and int(local) > 1:  # started by torchrun
        cpus = max(1, cpus // int(local))
    return cpus


def given_gpus(environ=os.environ) -> list[str]:
    """The GPUs this process was given, as CUDA_VISIBLE_DEVICES names them (Slurm and torchrun set it; nvidia-smi
    indexes or UUIDs), in order; [] when it is unset or empty: then every GPU of the node is visible."""
    return [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def default_workers(cpus: int | None = None) -> int:
    """The workbook's one rule for DataLoader workers: the process's CPUs minus one for the training loop,
    at most 8 (more rarely helps one GPU and multiplies memory). (Notebook 03 teaches it.)"""
    cpus = usable_cpus() if cpus is None else cpus
    return max(0, min(8, cpus - 1))


def mp_context():
    """The start method for worker processes: fork (fast, works from notebooks), spawn where fork is missing."""
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def check_world(parallel: str, world_size: int) -> None:
    """The one rule tying parallel= to the number of processes, for a run (engine) and a job (jobs)."""
    if world_size > 1 and parallel not in ("ddp", "fsdp"):
        raise ConfigError(f"{world_size} processes were started but parallel={parallel!r}; add parallel=ddp (or "
                          "fsdp: the model sharded) so that they train together, or start one process")
    if world_size == 1 and parallel == "ddp":
        raise ConfigError("parallel='ddp' needs several processes but one was started; start N with "
                          "tl.launch(cfg, nproc=N), `torchrun --nproc_per_node=N` or a job with gpus_per_node=N, "
                          "or use parallel=none")


DATASETS = ("shapes", "cifar10", "cifar100", "mnist", "imagefolder", "shapes_hard", "shapes_faint")
MODELS = ("resnet18", "resnet18_imagenet", "mnist_cnn")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PARALLEL = ("none", "dp", "ddp", "fsdp")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adamw")
OPTIMIZER_IMPLS = ("auto", "fused", "foreach", "for-loop")
SCHEDULES = ("constant", "cosine")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
LOADERS = ("dataloader", "prefetcher", "gpu_resident")
DDP_COMPILE = ("split", "whole", "inner")
DDP_SYNC = ("auto", "hooks", "flat", "buckets")
GRAD_DTYPES = ("fp32", "bf16")
ACTIVATION_CHECKPOINTING = ("none", "blocks")
CHOICES = {"dataset": DATASETS, "model": MODELS, "precision": PRECISIONS, "parallel": PARALLEL, "device": DEVICES,
           "optimizer": OPTIMIZERS, "lr_schedule": SCHEDULES, "compile_mode": COMPILE_MODES, "loader": LOADERS,
           "optimizer_impl": OPTIMIZER_IMPLS, "ddp_compile": DDP_COMPILE, "ddp_sync": DDP_SYNC,
           "ddp_grad_dtype": GRAD_DTYPES, "activation_checkpointing": ACTIVATION_CHECKPOINTING}


@dataclass
class TrainConfig:
    # what to train
    dataset: str = "shapes"  # shapes(_hard) are generated in memory; the others are staged by `make data`
    data_dir: str = "data"  # where staged datasets live (a shared read-only copy works)
    model: str = "resnet18"  # resnet18: CIFAR stem (32x32 stays 32x32); resnet18_imagenet: 7x7 stem, ~16x less work
    train_size: int | None = None  # limit the training set to this many images (null: all)
    val_size: int | None = None  # limit the validation set (null: all)
    augment: bool = True  # random crop with padding + horizontal flip
    # how long
    batch_size: int = 128  # per device; the global batch is batch_size x world size
    global_batch_size: int | None = None  # if set, batch_size = global_batch_size / world size
    steps: int | None = None  # optimizer steps; null: run `epochs` full epochs
    epochs: int = 1  # full passes over the training set when steps is null
    # optimizer
    optimizer: str = "adamw"  # adamw learns the shapes set in a CPU minute; sgd is the classic CIFAR recipe
    lr: float = 2e-3  # peak learning rate (after warm-up)
    momentum: float = 0.9  # sgd only
    optimizer_impl: str = "auto"  # fused: one kernel for all parameters; foreach: one per op; for-loop: per tensor
    weight_decay: float = 0.05  # decoupled for adamw, L2 for sgd
    lr_schedule: str = "cosine"  # after warm-up: constant, or cosine decay to zero at the last step
    warmup_steps: int = 0  # steps of linear learning-rate warm-up from 0
    # speed knobs
    precision: str = "fp32"  # fp32 (TF32 off), tf32, bf16 or fp16 autocast (fp16 adds a GradScaler)
    channels_last: bool = False  # NHWC memory layout: what tensor cores want for convolutions
    compile: bool = False  # torch.compile the model
    compile_mode: str = "default"  # reduce-overhead records CUDA graphs (removes kernel-launch cost)
    cuda_graph: bool = False  # record the whole step (forward, backward, all-reduce, optimizer) as one CUDA graph
    parallel: str = "none"  # none, dp (DataParallel, one process), ddp (one process per device), fsdp (ddp, sharded)
    activation_checkpointing: str = "none"  # blocks: recompute each block's activations in the backward pass (less memory)
    dist_timeout_s: int = 300  # seconds a rank waits in a collective for the others before the run fails
    ddp_bucket_cap_mb: int = 25  # size of DDP's gradient buckets, each all-reduced as one message
    ddp_static_graph: bool = False  # tell DDP the graph never changes (skips per-step bookkeeping)
    ddp_gradient_as_bucket_view: bool = True  # gradients live in DDP's buckets (no extra copy)
    grad_sync: bool = True  # false: ranks train apart, no gradient all-reduce (the gap to true is communication)
    ddp_broadcast_buffers: bool = True  # copy rank 0's buffers (BatchNorm running stats) to every rank each forward
    ddp_compile: str = "split"  # compile=true with DDP: split (graph cut at buckets), whole (one graph), inner (compile, then wrap; cut)
    ddp_sync: str = "auto"  # gradient all-reduce: hooks (DDP's buckets, during backward), flat (one, after it),
    # buckets (cuda_graph=true's own buckets, during backward: tutorial_lib.buckets), auto (flat with CUDA graphs)
    ddp_grad_dtype: str = "fp32"  # dtype the gradients are all-reduced in: fp32, or bf16 (half the bytes, rounded)
    sync_batchnorm: bool = False  # DDP: BatchNorm statistics over the global batch (SyncBatchNorm; GPUs only)
    grad_accum_steps: int = 1  # micro-batches per optimizer step (DDP all-reduces only on the last: no_sync)
    cudnn_benchmark: bool | str = True  # cuDNN autotuning per input shape (off under DataParallel); force: on there too
    # input pipeline
    loader: str = "dataloader"  # dataloader | prefetcher (copies on a side CUDA stream) | gpu_resident
    num_workers: int | str = "auto"  # DataLoader worker processes (0: in the training process); auto: CPUs - 1, at most 8
    pin_memory: bool = True  # page-locked host batches: asynchronous copies to the GPU
    persistent_workers: bool = False  # keep workers alive between epochs
    prefetch_factor: int = 2  # batches each worker loads ahead
    # where and how
    device: str = "auto"  # auto: a GPU when one is visible, else the CPU
    seed: int = 0  # model initialisation, data order, augmentation
    out_dir: str = "runs/default"  # result.json, checkpoint.pt, TensorBoard logs (tb/) and traces go here
    ckpt_every: int = 0  # steps between checkpoints, and one at the end (0: none, except on a stop signal)
    resume: bool = True  # continue from out_dir/checkpoint.pt when it exists
    timing_warmup: int = 5  # first steps left out of the throughput figures (steps must be more)
    log_every: int = 10  # steps between loss lines, TensorBoard points and stop checks
    eval: bool = True  # validation accuracy at the end
    eval_every: int = 0  # steps between validation passes recorded in val_history (0: none during training)
    target_accuracy: float | None = None  # stop once validation accuracy reaches this (needs eval_every)
    patience: int = 0  # stop after this many validation passes without a better validation accuracy (0: never)
    tensorboard: bool = True  # write TensorBoard scalars to out_dir/tb
    progress: bool = True  # a progress bar in a terminal or notebook (log lines in batch logs)
    # profiling (see tutorial_lib.profiling, notebook 02)
    profile: bool = False  # record torch.profiler traces to out_dir/tb/profile
    profile_wait: int = 1  # steps skipped before the profiler starts
    profile_warmup: int = 2  # steps recorded and thrown away (the profiler's own start-up)
    profile_active: int = 3  # steps recorded into each trace
    profile_repeat: int = 1  # how many traces (cycles of wait + warmup + active)
    profile_memory: bool = True  # record allocations (memory view)
    profile_with_stack: bool = False  # record Python stacks (large traces)
    profile_record_shapes: bool = True  # record operator input shapes
    profile_ranks: str = "all"  # ranks that record traces: all, or a comma list such as 0 or 0,3
    nvtx: bool = False  # NVTX ranges for Nsight Systems (forward, backward, optimizer, ...)
    time_parts: bool = False  # host time of each of those phases per timed step, in result.json (no profiler)

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "TrainConfig":
        """Coerce every field to its type the way the command line does (eval="false" is False, lr="1e-3" is
        0.001), then check it; raises ConfigError with a one-line message."""
        for f in fields(self):
            setattr(self, f.name, coerce(f, getattr(self, f.name)))
        for name, allowed in CHOICES.items():
            check_choice(name, getattr(self, name), allowed)
        for name in ("batch_size", "epochs", "prefetch_factor", "log_every", "ddp_bucket_cap_mb", "dist_timeout_s",
                     "grad_accum_steps", "profile_active", "profile_repeat"):
            check_positive(name, getattr(self, name))
        for name in ("steps", "global_batch_size", "train_size", "val_size"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.cudnn_benchmark not in (True, False, "force"):
            raise ConfigError(f"cudnn_benchmark={self.cudnn_benchmark!r} must be true, false or force (on even under "
                              "DataParallel, whose fresh threads re-time every step: notebook 05's trap)")
        if self.num_workers != "auto" and (not isinstance(self.num_workers, int) or isinstance(self.num_workers, bool)
                                           or self.num_workers < 0):
            raise ConfigError(f"num_workers={self.num_workers!r} must be auto or an integer >= 0")
        for name in ("ckpt_every", "warmup_steps", "timing_warmup", "profile_wait",
                     "profile_warmup", "eval_every", "patience"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        if self.target_accuracy is not None and not (0 < self.target_accuracy <= 1 and self.eval_every):
            raise ConfigError(f"target_accuracy={self.target_accuracy!r} needs a fraction in (0, 1] and "
                              f"eval_every > 0 (now {self.eval_every}), e.g. target_accuracy=0.9 eval_every=50")
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr!r} must be > 0 (e.g. lr=0.1 for SGD, lr=1e-3 for AdamW)")
        if not self.weight_decay >= 0:
            raise ConfigError(f"weight_decay={self.weight_decay!r} must be >= 0 (e.g. 0.05; 0 turns it off)")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"momentum={self.momentum!r} must be in [0, 1) (e.g. 0.9; 0 turns it off)")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed={self.seed!r} must be in [0, 2**63) (e.g. seed=0)")
        self.profile_rank_set()
        if self.cuda_graph:
            self.check_cuda_graph()
        self.check_buckets()
        self.check_fsdp()
        if self.model == "mnist_cnn" and self.dataset not in ("mnist",):
            raise ConfigError(f"model='mnist_cnn' expects 1x28x28 images but dataset={self.dataset!r}; "
                              "use dataset=mnist, or model=resnet18 for 3x32x32 data")
        if self.dataset == "mnist" and self.model != "mnist_cnn":
            raise ConfigError(f"dataset='mnist' has 1x28x28 images; use model=mnist_cnn, not {self.model!r}")
        return self

    def check_runtime(self, device_type: str, world_size: int, launched: bool) -> None:
        """Checks that need to know where the run happens (device, launcher, number of processes)."""
        if self.precision == "fp16" and device_type != "cuda":
            raise ConfigError(f"precision='fp16' needs a CUDA GPU but this run is on {device_type}; "
                              "use precision=bf16 (or fp32) on CPU")
        if self.precision == "tf32" and device_type != "cuda":
            raise ConfigError("precision='tf32' is a CUDA matmul mode; on CPU use precision=fp32 or bf16")
        if self.parallel in ("ddp", "fsdp") and not launched:
            raise ConfigError(f"parallel={self.parallel!r} needs one process per device started by a launcher: "
                              "use tl.launch(cfg, nproc=N) from a notebook or "
                              "`torchrun --nproc_per_node=N -m tutorial_lib train ...` from a shell")
        if launched and world_size > 1:
            check_world(self.parallel, world_size)
        if self.global_batch_size is not None and self.global_batch_size % world_size:
            raise ConfigError(f"global_batch_size={self.global_batch_size} is not divisible by the world size "
                              f"{world_size}; choose a multiple of {world_size} (batch_size is per device)")
        if self.sync_batchnorm and (self.parallel != "ddp" or device_type != "cuda"):
            raise ConfigError(f"sync_batchnorm=true needs parallel=ddp on CUDA GPUs (this run: parallel="
                              f"{self.parallel!r} on {device_type}); SyncBatchNorm has no CPU kernel: use "
                              "sync_batchnorm=false")
        if self.compile and self.parallel == "dp":
            raise ConfigError("compile=true with parallel='dp' is not supported; use parallel=ddp to compile")

    def check_cuda_graph(self) -> None:
        """What a whole-step CUDA graph can't hold (tutorial_lib.stepgraph says why)."""
        clash = [(self.precision == "fp16", "precision=fp16 (the GradScaler reads the device every step)",
                  "precision=bf16"),
                 (self.compile and self.compile_mode != "default", f"compile_mode={self.compile_mode} (it records "
                  "its own CUDA graphs)", "compile_mode=default"),
                 (self.parallel == "dp", "parallel=dp", "parallel=ddp"),
                 (self.grad_accum_steps > 1, f"grad_accum_steps={self.grad_accum_steps}", "grad_accum_steps=1"),
                 (self.optimizer_impl not in ("auto", "fused"), f"optimizer_impl={self.optimizer_impl} (it reads "
                  "the learning rate as a number)", "optimizer_impl=fused"),
                 (self.sync_batchnorm, "sync_batchnorm=true", "sync_batchnorm=false"),
                 (self.ddp_sync == "hooks", "ddp_sync=hooks (the graph all-reduces the gradients in one piece)",
                  "ddp_sync=auto")]
        for bad, what, fix in clash:
            if bad:
                raise ConfigError(f"cuda_graph=true does not work with {what}; use {fix}, or cuda_graph=false")

    def check_buckets(self) -> None:
        if self.ddp_sync == "buckets" and not self.cuda_graph:
            raise ConfigError("ddp_sync=buckets is the whole-step CUDA graph's own bucketed all-reduce and needs "
                              "cuda_graph=true; without it use ddp_sync=hooks (DDP's buckets do the same)")

    def check_fsdp(self) -> None:
        """What parallel=fsdp does not do (tutorial_lib.sharding); each clash names the value and the way out."""
        clash = [(self.precision == "fp16", "precision=fp16 (no GradScaler for sharded gradients here)",
                  "precision=bf16"),
                 (self.compile, "compile=true", "compile=false"),
                 (self.cuda_graph, "cuda_graph=true", "cuda_graph=false"),
                 (self.channels_last, "channels_last=true (FSDP2 shards contiguous parameters only)",
                  "channels_last=false"),
                 (not self.grad_sync, "grad_sync=false (the shards are the gradients' only copy)", "grad_sync=true")]
        for bad, what, fix in clash:
            if bad and self.parallel == "fsdp":
                raise ConfigError(f"parallel=fsdp does not work with {what}; use {fix}, or parallel=ddp")
        if self.activation_checkpointing != "none" and self.parallel == "dp":  # its replicas would run the original
            raise ConfigError(f"activation_checkpointing={self.activation_checkpointing} does not work with "
                              "parallel=dp (DataParallel's copies of a block would run the original's forward); use "
                              "parallel=ddp, or activation_checkpointing=none")

    def workers(self) -> int:
        """DataLoader workers of this process: num_workers, or for auto the workbook's rule on its CPUs."""
        return default_workers(usable_cpus()) if self.num_workers == "auto" else self.num_workers

    def profile_rank_set(self) -> set[int] | None:
        """The ranks that record traces (None: all of them)."""
        if self.profile_ranks.strip() == "all":
            return None
        try:
            ranks = {int(r) for r in self.profile_ranks.split(",")}
        except ValueError:
            ranks = {-1}
        if min(ranks) < 0:
            raise ConfigError(f"profile_ranks={self.profile_ranks!r} is not 'all' or a comma list of ranks such as "
                              "0 or 0,3")
        return ranks

    def sync_mode(self) -> str:
        """How this run averages its gradients, decided here once: none (one process, DataParallel, grad_sync=false),
        hooks (DDP's bucket hooks, during the backward pass), flat (one all-reduce of one flat buffer after it) or
        buckets (the whole-step graph's own, during it). auto: flat when the step runs as CUDA graphs, where DDP's
        per-parameter hooks cost more host time than the step; hooks otherwise (notebook 05 measures both)."""
        if self.parallel != "ddp" or not self.grad_sync:
            return "none"
        if self.ddp_sync == "auto":
            return "flat" if self.cuda_graph or (self.compile and self.compile_mode == "reduce-overhead") else "hooks"
        return self.ddp_sync

    def per_device_batch(self, world_size: int) -> int:
        if self.global_batch_size is None:
            return self.batch_size
        return self.global_batch_size // world_size

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "TrainConfig":
        return from_dict({**self.to_dict(), **changes})

    def to_overrides(self, only_changed: bool = True) -> list[str]:
        """`key=value` strings that rebuild this config on a command line (used by jobs and tl.launch)."""
        default = TrainConfig()
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if only_changed and value == getattr(default, f.name):
                continue
            out.append(f"{f.name}={format_value(value)}")
        return out

    def save_yaml(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


# Fields a resumed run may change: how long it runs (to extend it), what it reports and how it feeds the
# same data. Every other field changes what is trained, so resume compares it with the checkpoint's.
RESUME_MAY_CHANGE = ("steps", "epochs", "data_dir", "out_dir", "resume", "ckpt_every", "timing_warmup", "log_every",
                     "eval", "val_size", "tensorboard", "progress", "num_workers", "pin_memory", "persistent_workers",
                     "prefetch_factor", "device", "dist_timeout_s", "cudnn_benchmark", "compile", "compile_mode",
                     "ddp_bucket_cap_mb", "ddp_static_graph", "ddp_gradient_as_bucket_view", "profile",
                     "profile_wait", "profile_warmup", "profile_active", "profile_repeat", "profile_memory",
                     "profile_with_stack", "profile_record_shapes", "nvtx", "time_parts", "activation_checkpointing")


def resume_differences(saved: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """`key=saved (now new)` for every field that changes the run and differs from the checkpoint's config."""
    return [f"{f.name}={format_value(saved[f.name])} (now {format_value(getattr(cfg, f.name))})"
            for f in fields(cfg) if f.name not in RESUME_MAY_CHANGE and f.name in saved
            and saved[f.name] != getattr(cfg, f.name)]


def key_help() -> dict[str, tuple[str, str, str]]:
    """name -> (default, allowed values, meaning) for every TrainConfig field; the meaning is the comment on
    the field's line in this file (so `train --help` can't drift from the code)."""
    comments = {}
    for line in inspect.getsource(TrainConfig).splitlines():
        m = re.match(r"\s+(\w+): [^=]+=[^#]*#\s*(.+)", line)
        if m:
            comments[m.group(1)] = m.group(2).strip()
    return {f.name: (format_value(f.default), ", ".join(CHOICES.get(f.name, ())), comments.get(f.name, ""))
            for f in fields(TrainConfig)}


def from_dict(values: dict[str, Any]) -> TrainConfig:
    known = {f.name: f for f in fields(TrainConfig)}
    unknown = [k for k in values if k not in known]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}{suggest(unknown[0], known)}; "
                          f"valid keys are the fields of TrainConfig (see `python -m tutorial_lib train --help`)")
    return TrainConfig(**values)  # __post_init__ coerces and checks every value


def load(path: str | os.PathLike | None = None, overrides: list[str] | dict[str, Any] | None = None) -> TrainConfig:
    """Build a config from an optional YAML file and `key=value` overrides (strings or a dict)."""
    values: dict[str, Any] = {}
    if path is not None:
        values.update(read_yaml(Path(path), CONFIGS_DIR))
    if isinstance(overrides, dict):
        values.update(overrides)
    else:
        for item in overrides or []:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not key=value (e.g. batch_size=64)")
            key, text = item.split("=", 1)
            if not text.strip():
                raise ConfigError(f"{key.strip()}= is empty (an unset shell variable?); give a value, or leave "
                                  f"{key.strip()} out for its default ({format_value(_default(key.strip()))})")
            values[key.strip()] = text  # the text as typed: each field's type decides how to read it (values.coerce)
    return from_dict(values)


def _default(key: str) -> Any:
    return next((f.default for f in fields(TrainConfig) if f.name == key), "VALUE")
