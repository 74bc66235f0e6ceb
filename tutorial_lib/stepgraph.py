"""The whole training step as one CUDA graph (cuda_graph=true; notebooks 04 and 05 teach it).

A ResNet-18 step at batch 256 launches a few hundred kernels. On a fast GPU each takes microseconds, so the
GPU finishes them faster than Python can queue them and idles in between (notebook 02's trace). A CUDA graph
records the kernels of one step once and replays them with one launch: forward, backward, the gradient
all-reduce (NCCL collectives can be recorded too) and the optimizer update, with no Python in between.
torch.compile's `reduce-overhead` mode records graphs of the compiled forward and backward pieces; DDP's
per-bucket hooks and the optimizer still run in Python between them, which at batch 256 per GPU costs half
of every GPU (notebook 05). Recording the whole step removes that.

What a graph asks of the step: the same tensor addresses every replay (the batch is copied into fixed input
buffers; gradients and optimizer state stay where they were recorded), no host synchronisation inside it (no
`.item()`, no GradScaler: fp16 is excluded), and a learning rate held in a tensor, which the scheduler fills
between replays. The first steps run eagerly on a side stream (they compile, tune cuDNN and create the NCCL
communicator), then one step is recorded and replayed. On a CPU there are no graphs: the same step runs
eagerly, so the rest of the run behaves the same.
"""
from __future__ import annotations

from typing import Callable

import torch

from .config import UserError

WARMUP_STEPS = 3  # eager steps before recording: compilation, cuDNN's autotuning, NCCL's communicator


class GraphedStep:
    """Call it with each step's batch; returns the step's loss (a tensor on the device, not yet read).

    `body(x, y)` runs forward, backward, the gradient sync and the optimizer step, and returns the loss;
    `optimizer` is zeroed before each eager step (a replay overwrites the gradients instead)."""

    def __init__(self, body: Callable, optimizer: torch.optim.Optimizer, device: torch.device,
                 warmup: int = WARMUP_STEPS):
        self.body, self.opt, self.warmup = body, optimizer, warmup
        self.capture = device.type == "cuda"
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.side = torch.cuda.Stream(device) if self.capture else None

    @property
    def recorded(self) -> bool:
        return self.graph is not None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if not self.capture or (self.graph is None and self.calls <= self.warmup):
            return self.eager(x, y)
        if self.graph is None:
            self.record(x, y)
        elif x.shape != self.x.shape or y.shape != self.y.shape:
            raise UserError(f"cuda_graph=true recorded the step for a batch of shape {tuple(self.x.shape)} but got "
                            f"{tuple(x.shape)}: a graph replays fixed shapes; drop the last partial batch "
                            "(training loaders do) or use cuda_graph=false")
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.loss.clone()  # the next replay overwrites self.loss; the loss log keeps this one

    def eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One ordinary step (on a side stream on a GPU, as recording asks of the steps before it)."""
        if not self.capture:
            self.opt.zero_grad(set_to_none=True)
            return self.body(x, y)
        capturable(self.opt, False)  # AdamW warns when a capturable step runs outside a graph
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            self.opt.zero_grad(set_to_none=True)
            loss = self.body(x, y)
        torch.cuda.current_stream().wait_stream(self.side)
        return loss

    def release(self) -> None:
        """Free the graph and its memory; the next call records again after its warm-up."""
        if self.graph is not None:
            self.graph.reset()
            self.graph, self.loss, self.calls = None, None, 0

    def record(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Record one step into a graph (recording runs nothing: the caller replays it for this batch)."""
        self.x, self.y = torch.empty_like(x), torch.empty_like(y)  # the graph's input buffers
        torch.cuda.synchronize()
        self.opt.zero_grad(set_to_none=True)  # the gradients are then allocated inside the graph's memory
        capturable(self.opt, True)  # AdamW refuses to be recorded otherwise (the fused kernel is the same)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: NCCL's watchdog thread may query its events while this thread records
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.loss = self.body(self.x, self.y)


def tensor_lr(optimizer: torch.optim.Optimizer) -> None:
    """Hold each parameter group's learning rate in a tensor on the parameters' device, so a recorded
    optimizer step reads the value the scheduler writes before each replay (a float would be frozen into
    the graph). `initial_lr` stays a float: the scheduler then fills the tensor without reading the device."""
    for group in optimizer.param_groups:
        lr, device = float(group["lr"]), group["params"][0].device
        # float64 on a CPU, where the fused kernels then step exactly as with a float; CUDA's read a float32
        group["lr"] = torch.tensor(lr, device=device, dtype=torch.float32 if device.type == "cuda" else torch.float64)
        group["initial_lr"] = lr


def capturable(optimizer: torch.optim.Optimizer, flag: bool) -> None:
    """Set AdamW's `capturable` flag (SGD has none). The fused kernels ignore it: their step counts already
    live on the device; AdamW only checks it when it is recorded, and warns when a capturable step runs eagerly."""
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = flag
