"""TrainConfig: every knob of a training run, validated, loadable from YAML, overridable with key=value.

This module never imports torch, so job rendering (`tutorial_lib.jobs`) can use it on a login node.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class UserError(ValueError):
    """A mistake in what the user asked for. The CLI prints its one-line message and exits non-zero."""


class ConfigError(UserError):
    """A bad configuration value; the message names the field, the value and what is allowed."""


DATASETS = ("shapes", "cifar10", "cifar100", "mnist", "imagefolder")
MODELS = ("resnet18", "resnet18_imagenet", "mnist_cnn")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PARALLEL = ("none", "dp", "ddp")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("constant", "cosine")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
LOADERS = ("dataloader", "prefetcher", "gpu_resident")


@dataclass
class TrainConfig:
    # what to train
    dataset: str = "shapes"
    data_dir: str = "data"
    model: str = "resnet18"
    train_size: int | None = None  # limit the training set to this many images (None: all)
    val_size: int | None = None  # limit the validation set
    augment: bool = True  # random crop with padding + horizontal flip
    # how long
    batch_size: int = 128  # per device; the global batch is batch_size x world size
    global_batch_size: int | None = None  # if set, batch_size = global_batch_size / world size
    steps: int | None = None  # optimizer steps; None: run `epochs` full epochs
    epochs: int = 1
    # optimizer
    optimizer: str = "adamw"  # adamw learns the shapes set in a CPU minute; sgd is the classic CIFAR recipe
    lr: float = 2e-3
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.05
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    # speed knobs
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    compile_mode: str = "default"
    parallel: str = "none"
    ddp_bucket_cap_mb: int = 25
    ddp_static_graph: bool = False
    ddp_gradient_as_bucket_view: bool = True
    cudnn_benchmark: bool = True
    # input pipeline
    loader: str = "dataloader"  # dataloader | prefetcher (copies on a side CUDA stream) | gpu_resident
    num_workers: int = 2
    pin_memory: bool = True
    persistent_workers: bool = False
    prefetch_factor: int = 2
    # where and how
    device: str = "auto"
    seed: int = 0
    out_dir: str = "runs/default"
    ckpt_every: int = 0  # steps between checkpoints (0: only at the end of the run)
    resume: bool = True  # continue from out_dir/checkpoint.pt when it exists
    timing_warmup: int = 5  # steps left out of the throughput figures
    log_every: int = 10
    eval: bool = True  # validation accuracy at the end
    tensorboard: bool = True
    progress: bool = True
    # profiling (see tutorial_lib.profiling)
    profile: bool = False
    profile_wait: int = 1
    profile_warmup: int = 2
    profile_active: int = 3
    profile_repeat: int = 1
    profile_memory: bool = True
    profile_with_stack: bool = False
    profile_record_shapes: bool = True
    nvtx: bool = False

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> "TrainConfig":
        """Check every field on its own; raises ConfigError with a one-line message."""
        _choice("dataset", self.dataset, DATASETS)
        _choice("model", self.model, MODELS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("parallel", self.parallel, PARALLEL)
        _choice("device", self.device, DEVICES)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("lr_schedule", self.lr_schedule, SCHEDULES)
        _choice("compile_mode", self.compile_mode, COMPILE_MODES)
        _choice("loader", self.loader, LOADERS)
        for name in ("batch_size", "epochs", "prefetch_factor", "log_every", "ddp_bucket_cap_mb",
                     "profile_active", "profile_repeat"):
            _positive(name, getattr(self, name))
        for name in ("steps", "global_batch_size", "train_size", "val_size"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        for name in ("num_workers", "ckpt_every", "warmup_steps", "timing_warmup", "profile_wait",
                     "profile_warmup"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr!r} must be > 0 (e.g. lr=0.1 for SGD, lr=1e-3 for AdamW)")
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
        if self.parallel == "ddp" and not launched:
            raise ConfigError("parallel='ddp' needs one process per device started by a launcher: "
                              "use tl.launch(cfg, nproc=N) from a notebook or "
                              "`torchrun --nproc_per_node=N -m tutorial_lib train ...` from a shell")
        if self.parallel != "ddp" and launched and world_size > 1:
            raise ConfigError(f"{world_size} processes were launched but parallel={self.parallel!r}; "
                              "add parallel=ddp so they train together")
        if self.global_batch_size is not None and self.global_batch_size % world_size:
            raise ConfigError(f"global_batch_size={self.global_batch_size} is not divisible by the world size "
                              f"{world_size}; choose a multiple of {world_size} (batch_size is per device)")
        if self.compile and self.parallel == "dp":
            raise ConfigError("compile=true with parallel='dp' is not supported; use parallel=ddp to compile")

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
        import yaml

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


def from_dict(values: dict[str, Any]) -> TrainConfig:
    known = {f.name: f for f in fields(TrainConfig)}
    unknown = [k for k in values if k not in known]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}{_suggest(unknown[0], known)}; "
                          f"valid keys are the fields of TrainConfig (see `python -m tutorial_lib train --help`)")
    typed = {k: _coerce(known[k], v) for k, v in values.items()}
    return TrainConfig(**typed)


def load(path: str | os.PathLike | None = None, overrides: list[str] | dict[str, Any] | None = None) -> TrainConfig:
    """Build a config from an optional YAML file and `key=value` overrides (strings or a dict)."""
    import yaml

    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist; check the path "
                              "(configs live in configs/ at the top of the workbook)")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of key: value, not {type(loaded).__name__}")
        values.update(loaded)
    if isinstance(overrides, dict):
        values.update(overrides)
    else:
        for item in overrides or []:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not key=value (e.g. batch_size=64)")
            key, raw = item.split("=", 1)
            values[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
    return from_dict(values)


# ---------------------------------------------------------------------- helpers
def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive integer")


def _suggest(word: str, known: dict) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_value(value: Any) -> str:
    """A value as it is written on a command line: null, true/false, or str()."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Turn YAML/CLI values into the field's type, with an error that names the field."""
    kind = str(f.type)
    if value is None:
        if "None" in kind:
            return None
        raise ConfigError(f"{f.name}=null is not allowed; give a value (default {f.default!r})")
    try:
        if kind.startswith("bool"):
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "1", "yes", "on"):
                return True
            if str(value).lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if kind.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind.startswith("float"):
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        expected = kind.split(" ")[0].replace("|", "").strip()
        raise ConfigError(f"{f.name}={value!r} is not a valid {expected}") from None
