"""The run's optimizer and its learning-rate schedule: torch.optim's SGD or AdamW in the implementation
`optimizer_impl` names (notebook 04 measures them), and linear warm-up then constant or cosine decay."""
from __future__ import annotations

import math
from typing import Iterable

import torch

from . import stepgraph
from .config import ConfigError, TrainConfig

OPTIMIZER_IMPLS = {"auto": {}, "fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}


def make_optimizer(cfg: TrainConfig, params: Iterable[torch.nn.Parameter],
                   device: torch.device) -> torch.optim.Optimizer:
    """optimizer_impl picks torch.optim's implementation: fused (one kernel updates every parameter),
    foreach (one kernel per operation over all of them), for-loop (kernels per parameter), auto (torch's
    choice: foreach on a GPU). Notebook 04 measures the difference."""
    impl = OPTIMIZER_IMPLS["fused" if cfg.cuda_graph else cfg.optimizer_impl]  # a graph needs one kernel
    try:
        if cfg.optimizer == "sgd":
            opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum,
                                  weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0, **impl)
        else:
            opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **impl)
        if cfg.cuda_graph:
            stepgraph.tensor_lr(opt)
        return opt
    except (RuntimeError, TypeError) as e:  # e.g. fused=True where this torch has no fused kernel
        raise ConfigError(f"optimizer_impl={cfg.optimizer_impl!r} does not work for optimizer={cfg.optimizer!r} "
                          f"on {device.type} with torch {torch.__version__} ({e}); use "
                          "optimizer_impl=auto") from None


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

