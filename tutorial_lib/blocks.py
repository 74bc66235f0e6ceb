"""A model's blocks, and activation checkpointing on them (`activation_checkpointing=blocks`).

A block is a module that the model repeats: ResNet-18's eight BasicBlocks, a transformer's layers. The rule
needs no list of model classes: walking down from the model, the first modules whose class occurs at least twice,
that hold parameters and are more than one layer, are the blocks (plain containers such as nn.Sequential are looked
into, never taken). FSDP2 shards the same blocks (sharding.py).

Activation checkpointing keeps only each block's input during the forward pass and runs the block's forward again
in the backward pass to get the rest: the activations inside a block are held for one block at a time, at the cost
of a second forward pass of every block (about a third more compute per step). torch.utils.checkpoint with
use_reentrant=False: the same random numbers (dropout) in both passes, and it composes with FSDP2 and compile.
"""
from __future__ import annotations

import functools
from collections import Counter
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

from .config import ConfigError

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def find(model: nn.Module) -> list[nn.Module]:
    """The model's blocks, outermost first, in the order the model holds them; [] when it repeats none."""
    counts = Counter(type(m) for m in model.modules())
    found: list[nn.Module] = []

    def walk(module: nn.Module) -> None:
        for child in module.children():
            repeated = counts[type(child)] > 1 and not isinstance(child, CONTAINERS)
            if repeated and any(True for _ in child.children()) and any(True for _ in child.parameters()):
                found.append(child)
            else:
                walk(child)
    walk(model)
    return found


def checkpointed(block: nn.Module):
    """`block`'s forward run under torch.utils.checkpoint: its activations recomputed in the backward pass. The
    recomputation leaves the BatchNorm running statistics as the forward pass left them (updated once)."""
    forward = block.forward
    norms = [m for m in block.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    contexts = (lambda: (nullcontext(), statistics_kept(norms))) if norms else noop_context_fn

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if torch.compiler.is_compiling():  # the recomputation is the compiled backward graph's: no statistics updated
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)
    run.checkpointed = True
    return run


@contextmanager
def statistics_kept(norms: list):
    """BatchNorm layers that normalise as in training but leave their running statistics unchanged."""
    kept = [(m.momentum, m.num_batches_tracked.clone()) for m in norms]
    for m in norms:
        m.momentum = 0.0  # running = (1 - 0) x running + 0 x this batch's
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(norms, kept):
            m.momentum = momentum
            m.num_batches_tracked.copy_(tracked)


def apply_checkpointing(model: nn.Module, how: str) -> int:
    """activation_checkpointing=blocks: every block of `model` recomputes its activations in the backward pass.
    The model keeps its modules and parameter names (its checkpoints load either way). How many blocks."""
    if how == "none":
        return 0
    found = find(model)
    if not found:
        raise ConfigError(f"activation_checkpointing={how!r}: {type(model).__name__} repeats no block (a module "
                          "class with parameters that occurs twice or more) to checkpoint; use "
                          "activation_checkpointing=none")
    for block in found:
        if not getattr(block.forward, "checkpointed", False):
            block.forward = checkpointed(block)
    return len(found)
