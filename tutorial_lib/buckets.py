"""Gradient buckets that all-reduce while the backward pass goes on (ddp_sync=buckets; notebook 05).

The backward pass produces gradients from the last layer to the first. DDP groups them into buckets and
all-reduces each bucket as soon as its last gradient is ready, so the messages travel while the earlier
layers are still differentiated; only the last bucket's all-reduce is left after the backward pass. The
engine's whole-step CUDA graph (cuda_graph=true) has no DDP module, so it does the same here by hand: a hook
on every parameter counts the gradients of its bucket, and the hook that completes a bucket starts its
all-reduce without waiting for it (on a GPU, NCCL's own stream runs it beside the backward kernels; a CUDA
graph records both streams). After the backward pass, `finish()` waits for them all.

Buckets follow the model's top-level parts (for the ResNet: conv1, bn1, layer1 ... layer4, fc), from the
last part to the first, each part cut into pieces of at most ddp_bucket_cap_mb. A bucket never holds two
parts, because under torch.compile the gradients of a compiled piece are all ready at its end: the engine
compiles each part on its own (`compile_parts`), so that the parts' gradients arrive one after another.
Every rank starts the buckets in the same order (the order of the parts, not of the gradients' arrival),
as collectives must.
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from . import distributed


def parts(net: nn.Module) -> list:
    """The parameters of `net` grouped by its top-level parts, in the order the parts were defined (for
    models built as a chain, the order of the forward pass); parameters of `net` itself form a last part."""
    seen: set = set()
    groups = []
    for module in list(net.children()) + [None]:
        params = net.parameters(recurse=False) if module is None else module.parameters()
        group = [p for p in params if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in group)
        if group:
            groups.append(group)
    return groups


def plan(net: nn.Module, cap_mb: float) -> list:
    """The buckets, in the order the backward pass fills them: the parts from last to first, each cut after
    cap_mb megabytes of gradients (its parameters from last to first, as they are differentiated)."""
    cap = cap_mb * 2**20
    buckets = []
    for group in reversed(parts(net)):
        bucket, size = [], 0
        for p in reversed(group):
            if bucket and size + p.numel() * p.element_size() > cap:
                buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(p)
            size += p.numel() * p.element_size()
        buckets.append(bucket)
    return buckets


def compile_parts(net: nn.Module, mode: str) -> None:
    """torch.compile each top-level part of `net` that has parameters, in place (nn.Module.compile: the
    state_dict keeps its names). One compiled model hands all its gradients back at the end of its backward
    pass, leaving nothing to overlap; compiled part by part, layer4's gradients are ready while layer3 is
    still being differentiated. Each part is one more entry in Dynamo's cache of the same code (the ResNet's
    eight blocks are eight), so its limit is raised; dynamic=False keeps every entry specialised to its shapes
    (after a few recompiles Dynamo would otherwise switch to slower shape-generic kernels)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    for module in net.children():
        if any(p.requires_grad for p in module.parameters()):
            module.compile(mode=mode, dynamic=False)


class GradBuckets:
    """Call `start()` before the forward pass and `finish()` after the backward pass; in between, each
    bucket is all-reduced (averaged over the ranks) as soon as its gradients are ready. After finish(),
    every .grad is a view of its bucket's buffer."""

    def __init__(self, net: nn.Module, env: distributed.DistEnv, cap_mb: float, dtype: torch.dtype | None = None):
        self.env, self.dtype = env, dtype
        self.buckets = plan(net, cap_mb)
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(functools.partial(self._ready, i))
        self.start()

    def start(self) -> None:
        self.missing = [len(b) for b in self.buckets]  # gradients each bucket still waits for
        self.landings: list = []  # one per bucket started, in order: waits for its all-reduce

    def _ready(self, bucket: int, _param: torch.Tensor) -> None:
        """A parameter of `bucket` has its gradient; start every bucket that is complete and next in order."""
        self.missing[bucket] -= 1
        self._start_complete()

    def _start_complete(self, all_of_them: bool = False) -> None:
        while len(self.landings) < len(self.buckets) and (all_of_them or self.missing[len(self.landings)] == 0):
            bucket = self.buckets[len(self.landings)]
            self.landings.append(distributed.start_average(bucket, self.env, self.dtype))

    def finish(self) -> None:
        """Start what is left (buckets whose parameters got no gradient: zeros), then wait for every bucket."""
        self._start_complete(all_of_them=True)
        for land in self.landings:
            land()
        self.start()
