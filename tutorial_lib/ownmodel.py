"""The loop on a model of yours: the engine's Run (engine.py) with your model factory, your batches and your loss,
through the seams it has for them (`Run.build_model`, `build_input`, `criterion`, `prepare`). tl.card measures
with it; nothing here is a second loop.

    parts = Parts(factory=lambda: MyNet(), source=my_batches, loss=None)
    with engine.prepared_run(cfg, parts.make_run) as run: ...

The rules a batch and a model follow (each broken rule ends in a one-line UserError that names the fix):
- a batch is `(input, target)`: one input tensor (floats, or integers such as tokens: never normalised or cast)
  and one target tensor, every batch of the same shapes (compile and CUDA graphs record one shape);
- the source is a function returning such a batch (called once per step: it is your input pipeline), a
  Dataset of (input, target) samples, a DataLoader of such batches, or one batch itself (reused every step);
- without a loss of yours: integer targets of the output's shape minus its last dimension -> cross-entropy over
  that last dimension (classes, or a vocabulary per position); float targets of the output's shape -> mean
  squared error; a model that returns a dict or a tuple needs your loss, `loss(output, target) -> scalar`.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from . import engine
from .config import UserError

FOREVER = 10**9  # steps per "epoch" of a function or a single batch: they have no end


# ---------------------------------------------------------------------------------------- MODULE:FUNCTION
def resolve(spec: str, what: str = "model") -> Any:
    """The object `spec` names: 'MODULE:NAME' where MODULE is a file (models.py, ./nets/gpt.py) or an importable
    module (torchvision.models); NAME may be dotted (Class.method)."""
    module_name, sep, name = str(spec).rpartition(":")
    if not sep or not module_name or not name:
        raise UserError(f"{what} {spec!r} is not MODULE:FUNCTION; e.g. my_models.py:make_model or "
                        "torchvision.models:resnet50")
    module = _import(module_name, what)
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))[:12]
            raise UserError(f"{what} {spec!r}: {module_name} has no {name!r}; it has {', '.join(found) or 'nothing callable'}")
        obj = getattr(obj, part)
    return obj


def _import(module_name: str, what: str):
    path = Path(module_name)
    if module_name.endswith(".py") or path.is_file():
        if not path.is_file():
            raise UserError(f"{what}: no file {module_name!r} (from {Path.cwd()}); give a path to your .py file")
        key = f"_card_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
        if key not in sys.modules:
            spec = importlib.util.spec_from_file_location(key, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module  # DataLoader workers and pickling find it
            try:
                spec.loader.exec_module(module)
            except SyntaxError as e:
                del sys.modules[key]
                raise syntax_problem(e, what) from None
            except BaseException:  # the user's own code failed (its traceback says where): the next try reads
                del sys.modules[key]  # the file again, not a module half made
                raise
        return sys.modules[key]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise UserError(f"{what}: can't import {module_name!r} ({e}); give a .py file path or an installed "
                        "module") from None
    except SyntaxError as e:
        raise syntax_problem(e, what) from None


def syntax_problem(e: SyntaxError, what: str) -> UserError:
    """A SyntaxError in the user's file as one line: file:line, Python's words and the line itself."""
    line = (e.text or "").strip()
    said = f": {line[:60]}" if line else ""
    return UserError(f"{what}: {e.filename}:{e.lineno}: {e.msg}{said}; fix that line of your file and run again")


def spec_of(obj: Any) -> str | None:
    """'module:qualname' of a function or class defined at the top of an importable module; None otherwise."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):  # a partial, a lambda's closure, an instance
        return None
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not module or not name or "<" in name or module == "__main__" or module.startswith("_card_"):
        return None
    return f"{module}:{name}"


# ---------------------------------------------------------------------------------------- the rules
def as_pair(batch: Any, where: str = "the batch") -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) from one batch, or a UserError that names what is wrong with it."""
    if isinstance(batch, Mapping):
        keys = ", ".join(repr(k) for k in list(batch)[:6])
        raise UserError(f"{where} is a dict (keys {keys}); the card feeds one input tensor and one target: "
                        "return (input, target), e.g. (b['input_ids'], b['labels'])")
    if isinstance(batch, torch.Tensor):
        raise UserError(f"{where} is one tensor of shape {tuple(batch.shape)} with no target; return (input, "
                        "target): for a language model, (tokens[:, :-1], tokens[:, 1:])")
    if not isinstance(batch, (tuple, list)):
        raise UserError(f"{where} is a {type(batch).__name__}; return (input, target), two tensors")
    if len(batch) != 2 or not isinstance(batch[0], torch.Tensor):
        n = len(batch) - 1 if len(batch) > 2 else len(batch[0]) if isinstance(batch[0], (tuple, list)) else 0
        raise UserError(f"{where} holds several inputs ({max(n, 2)} before the target); the card feeds the model "
                        "one tensor: return (input, target) and wrap your model so that forward takes one tensor "
                        "(stack or concatenate the inputs)")
    if not isinstance(batch[1], torch.Tensor):
        raise UserError(f"{where}'s target is a {type(batch[1]).__name__}, not a tensor; return (input, target)")
    if batch[0].dim() == 0 or batch[0].shape[0] == 0:
        raise UserError(f"{where}'s input has shape {tuple(batch[0].shape)}: the first dimension is the batch")
    return batch[0], batch[1]


def check_model(model: Any, where: str = "the model factory") -> nn.Module:
    if not isinstance(model, nn.Module):
        raise UserError(f"{where} returned a {type(model).__name__}, not a torch.nn.Module; name a function or "
                        "class that builds your model")
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError(f"{where} returned a {type(model).__name__} with no parameters to train; the card "
                        "measures training steps: give a model with trainable parameters")
    return model


def default_loss(output: Any, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer targets (over the output's last dimension), mean squared error for float targets
    of the output's shape; anything else asks for a loss of yours."""
    if not isinstance(output, torch.Tensor):
        kind = f"dict (keys {', '.join(map(repr, list(output)[:5]))})" if isinstance(output, Mapping) else \
            f"{type(output).__name__} of {len(output)}" if isinstance(output, (tuple, list)) else type(output).__name__
        raise UserError(f"the model returned a {kind}; the default loss needs one tensor: give loss= (--loss "
                        "MODULE:FUNCTION), a function (output, target) -> scalar tensor")
    if not y.is_floating_point():
        if output.dim() >= 2 and tuple(y.shape) == tuple(output.shape[:-1]):
            return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), y.reshape(-1))
    elif tuple(y.shape) == tuple(output.shape):
        return F.mse_loss(output.float(), y.float())
    raise UserError(f"output {tuple(output.shape)} and {'float' if y.is_floating_point() else 'integer'} target "
                    f"{tuple(y.shape)} fit no default loss (integer targets: the output's shape without its last "
                    "dimension; float targets: the output's shape); give loss= (--loss MODULE:FUNCTION)")


def check_loss(loss: Any) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UserError(f"the loss returned {shape}; it must return one floating-point number as a tensor "
                        "(e.g. .mean() it)")
    return loss.reshape(())


# ---------------------------------------------------------------------------------------- the input
class UserInput:
    """A batch source as the engine sees its input (`epoch(e, start)`, `steps_per_epoch`, `workers`), each batch
    checked by the rules (`as_pair`) and against the first one's shapes."""

    def __init__(self, source: Any, batch_size: int, workers: int, pin: bool):
        self.first: tuple | None = None
        self.loader = None
        if isinstance(source, Dataset):
            source = DataLoader(source, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                                pin_memory=pin, persistent_workers=False)
        if isinstance(source, DataLoader):
            self.loader = source
            self.workers = source.num_workers
            try:
                self.steps_per_epoch = len(source)
            except TypeError:  # an IterableDataset without __len__
                self.steps_per_epoch = FOREVER
            if not self.steps_per_epoch:
                raise UserError("the DataLoader yields no batch; give it more samples (or drop_last=False)")
        else:
            self.source, self.workers, self.steps_per_epoch = source, 0, FOREVER

    def epoch(self, epoch: int, start_batch: int = 0):
        if self.loader is not None:
            for i, batch in enumerate(self.loader):
                if i >= start_batch:
                    yield self.check(batch, i)
            return
        i = start_batch
        while True:
            yield self.check(self.source() if callable(self.source) else self.source, i)
            i += 1

    def check(self, batch: Any, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = as_pair(batch, f"batch {i}")
        shapes = (tuple(x.shape), tuple(y.shape))
        if self.first is None:
            self.first = shapes
        elif shapes != self.first:
            raise UserError(f"batch {i} has input {shapes[0]} and target {shapes[1]}, the first batch had "
                            f"{self.first[0]} and {self.first[1]}: the card times one shape (compile and CUDA "
                            "graphs record one); pad to one length, or drop_last=True in your DataLoader")
        return x, y


# ---------------------------------------------------------------------------------------- the run
@dataclass
class Parts:
    """A model of yours for the engine: a factory (a fresh model each call), a batch source, a loss (None: the
    default rule), the FLOPs of one sample's training step (tl.card counts them; None: unknown)."""
    factory: Callable[[], nn.Module]
    source: Any
    loss: Callable | None = None
    flops_per_sample: float | None = None

    def make_run(self, cfg, env) -> "UserRun":
        return UserRun(cfg, env, self)


class UserRun(engine.Run):
    """engine.Run with the user's model, batches and loss; everything else (precision, compile, CUDA graphs, DDP,
    the clock) is the engine's own."""

    def __init__(self, cfg, env, parts: Parts):
        self.parts = parts
        if cfg.eval:
            raise UserError("eval=true: a model of yours has no validation set here; use eval=false")
        super().__init__(cfg, env)

    def build_model(self) -> nn.Module:
        return check_model(self.parts.factory())

    def build_input(self):
        pin = self.cfg.pin_memory and self.device.type == "cuda"
        return UserInput(self.parts.source, self.batch_size, self.cfg.workers(), pin)

    def criterion(self, output, y) -> torch.Tensor:
        if self.parts.loss is None:
            return default_loss(output, y)
        return check_loss(self.parts.loss(output, y))

    def prepare(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch on the device as it is (integers stay integers; no dataset statistics to normalise by);
        channels_last for 4-d float inputs when asked."""
        x = x.to(self.device, non_blocking=True)
        if self.cfg.channels_last and x.dim() == 4 and x.is_floating_point():
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y.to(self.device, non_blocking=True)

    def flops_per_image(self) -> float | None:
        return self.parts.flops_per_sample
