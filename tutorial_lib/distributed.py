"""One description of where this process runs (DistEnv), read from torchrun's or Slurm's variables,
process-group set-up and teardown, and the few collectives the engine needs. (Starting processes:
`engine.launch`.)"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class DistEnv:
    """Where this process runs: its rank, local rank, the world size, its device (notebook 05 teaches it)."""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    launched: bool = False  # started by torchrun or srun (one process per device)
    device: torch.device = torch.device("cpu")
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def read_env(environ=os.environ) -> DistEnv:
    """Rank, local rank and world size from torchrun (RANK, ...) or an srun task (SLURM_PROCID, ...)."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return DistEnv(int(environ["RANK"]), int(environ.get("LOCAL_RANK", 0)), int(environ["WORLD_SIZE"]), True)
    if "SLURM_STEP_ID" in environ and int(environ.get("SLURM_NTASKS", 1)) > 1 and "MASTER_ADDR" in environ:
        return DistEnv(int(environ["SLURM_PROCID"]), int(environ.get("SLURM_LOCALID", 0)),
                       int(environ["SLURM_NTASKS"]), True)
    return DistEnv()


def pick_device(requested: str, local_rank: int = 0) -> torch.device:
    from .config import ConfigError

    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' was requested but no CUDA GPU is visible "
                          "(check `nvidia-smi` and that the job asked for a GPU); use device=auto or device=cpu")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def setup(parallel: str, device: str = "auto", timeout_s: int = 600) -> DistEnv:
    """Read the environment, choose the device, and join the process group when running DDP.
    (Notebook 05 teaches it.)"""
    env = read_env()
    env.device = pick_device(device, env.local_rank)
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if parallel == "ddp" and env.launched:
        env.backend = "nccl" if env.device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29500")
            dist.init_process_group(env.backend, rank=env.rank, world_size=env.world_size,
                                    timeout=timedelta(seconds=timeout_s))
    return env


def teardown(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()


def all_gather(value, env: DistEnv) -> list:
    """Every rank's `value` (any picklable), on every rank; [value] when not distributed."""
    if not env.distributed:
        return [value]
    out = [None] * env.world_size
    dist.all_gather_object(out, value)
    return out


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank when `flag` is true on at least one (e.g. a stop signal seen by one rank)."""
    if not env.distributed:
        return flag
    t = torch.tensor([int(flag)], device=env.device if env.backend == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
