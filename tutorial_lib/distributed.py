"""One description of where this process runs (DistEnv), read from torchrun's or Slurm's variables,
process-group set-up and teardown, and the few collectives the engine needs. (Starting processes:
`launcher.py`.)"""
from __future__ import annotations

import os
import pickle
import platform
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from . import lastwords
from ._gloo_exit import hand_over
from .config import ConfigError, UserError
from .values import count, is_whole


@dataclass
class DistEnv:
    """Where this process runs: its rank, local rank, the world size, its device (notebook 05 teaches it)."""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    launched: bool = False  # started by torchrun or srun (one process per device)
    device: torch.device = torch.device("cpu")
    backend: str | None = None
    timeout_s: int = 300
    source: str = ""  # the launcher's variables this was read from, e.g. "RANK=0 WORLD_SIZE=2"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def read_env(environ=os.environ) -> DistEnv:
    """Rank, local rank and world size from torchrun (RANK, ...) or an srun task (SLURM_PROCID, ...)."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        rank, local, world = (_env_int(environ, k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        return DistEnv(rank, local, world, True, source=f"RANK={rank} WORLD_SIZE={world}")
    if "SLURM_STEP_ID" in environ and _env_int(environ, "SLURM_NTASKS", 1) > 1 and "MASTER_ADDR" in environ:
        rank, local, world = (_env_int(environ, k) for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"))
        return DistEnv(rank, local, world, True, source=f"SLURM_PROCID={rank} SLURM_NTASKS={world}")
    return DistEnv()


def _env_int(environ, name: str, default: int = 0) -> int:
    """A launcher's number from the environment, or a one-line error naming the variable."""
    text = environ.get(name)
    if text is None:
        return default
    if not is_whole(text):
        raise ConfigError(f"{name}={text!r} in the environment is not a whole number: torchrun and srun set it "
                          f"for the processes they start; if it is left over from an earlier shell, unset {name}")
    return int(text)


def check_launch(parallel: str, env: DistEnv) -> None:
    """Several processes by the launcher's variables but parallel is not ddp: started by a launcher, or variables
    left over in the shell (exported by hand, or by an earlier session) that say so wrongly."""
    if env.launched and env.world_size > 1 and parallel not in ("ddp", "fsdp"):
        names = " ".join(word.split("=")[0] for word in env.source.split())
        raise ConfigError(f"{env.source} in the environment say this is one of {env.world_size} processes started "
                          f"together (by torchrun or srun), but parallel={parallel!r}: if a launcher started them, "
                          f"add parallel=ddp; if not, they are left over from an earlier shell: unset {names}")


def pick_device(requested: str, local_rank: int = 0) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' was requested but no CUDA GPU is visible "
                          "(check `nvidia-smi` and that the job asked for a GPU); use device=auto or device=cpu")
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model and threads: every printed figure names it (notebook 01 teaches it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(l.split(":", 1)[1].strip() for l in info if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU ({cpu}, {count(torch.get_num_threads(), 'thread')})"


def setup(parallel: str, device: str = "auto", timeout_s: int = 300) -> DistEnv:
    """Read the environment, choose the device, and join the process group when running DDP. A collective
    that waits more than `timeout_s` for another rank fails (see `collective`) instead of blocking the job."""
    env = read_env()
    env.timeout_s = timeout_s
    env.device = pick_device(device, env.local_rank)
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if parallel in ("ddp", "fsdp") and env.launched:
        env.backend = "nccl" if env.device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29500")
            dist.init_process_group(env.backend, rank=env.rank, world_size=env.world_size,
                                    timeout=timedelta(seconds=timeout_s))
    return env


_BEFORE_TEARDOWN: list = []  # what must end while the process group lives (sharding: a checkpoint being written)


def before_teardown(fn) -> None:
    _BEFORE_TEARDOWN.append(fn)


def teardown(env: DistEnv) -> None:
    while _BEFORE_TEARDOWN:
        _BEFORE_TEARDOWN.pop()()
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()


# a rank's own last words, which torchrun's summary of the failure (the last lines it prints) leaves out
_LAST_WORDS = re.compile(r"terminate called|Traceback|Error|Signal \d+|Aborted|Segmentation|core dumped", re.I)


def failure_lines(lines: list[str], tail: int = 12, earlier: int = 8) -> str:
    """The lines to show when a torchrun run failed: the last `tail` lines (torchrun's summary: which rank,
    which exit code or signal) and, before them, up to `earlier` lines where a rank said what went wrong."""
    said = [line for line in lines[:-tail] if _LAST_WORDS.search(line)][-earlier:]
    return "".join([*said, *(["...\n"] if said else []), *lines[-tail:]]).strip()


def is_comm_error(e: BaseException) -> bool:
    """A collective that failed because another rank did not answer (timeout, closed connection)."""
    backend_error = getattr(dist, "DistBackendError", ())
    text = str(e)
    return isinstance(e, backend_error) or (isinstance(e, RuntimeError) and any(
        w in text for w in ("Timed out", "timed out", "timeout", "closed by peer", "Connection reset", "NCCL")))


@contextmanager
def collective(name: str, env: DistEnv):
    """Run a collective; if it fails because other ranks did not answer, a one-line UserError that names them.
    torch does not say which rank is missing, so each failing rank leaves a mark in the rendezvous store and,
    after a short grace, the ranks without a mark are the ones that stopped answering."""
    try:
        yield
    except RuntimeError as e:
        if not (env.distributed and is_comm_error(e)):
            raise
        lastwords.failed(name, e)  # this rank's last words (and, gloo, the flight recorder's dumps) at once
        silent = _silent_ranks(env)
        lastwords.NOW.failure["silent_ranks"] = silent
        who = (f"rank{'s' * (len(silent) > 1)} {', '.join(map(str, silent))} did not answer" if silent
               else "another rank did not answer")
        raise UserError(f"rank {env.rank}: {name} failed: {who} within dist_timeout_s={env.timeout_s} s (stalled, "
                        f"or ended: see {'their' if len(silent) > 1 else 'its'} log lines); torch said: "
                        f"{str(e).splitlines()[0][:200]}") from None


def _silent_ranks(env: DistEnv, grace_s: float = 2.0) -> list[int]:
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"workbook/failed/{env.rank}", "1")
        time.sleep(grace_s)  # the other ranks that timed out in the same collective mark themselves too
        return [r for r in range(env.world_size) if not store.check([f"workbook/failed/{r}"])]
    except Exception:  # the store lives in rank 0's agent: gone with it  # noqa: BLE001
        return []


def _device(env: DistEnv) -> torch.device:
    return env.device if env.backend == "nccl" else torch.device("cpu")


def all_gather(value, env: DistEnv) -> list:
    """Every rank's `value` (any picklable), on every rank; [value] when not distributed. (torch's
    all_gather_object, its tensors handed over to gloo safely: _gloo_exit.hand_over.)"""
    if not env.distributed:
        return [value]
    data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.long, device=_device(env))
    sizes = [torch.zeros_like(size) for _ in range(env.world_size)]
    with collective("all_gather", env), lastwords.phase("all_gather"):
        done = hand_over(env.backend, "all_gather sizes", size, *sizes)
        dist.all_gather(sizes, size)
        done()
        n = max(int(s.item()) for s in sizes)
        mine = torch.zeros(n, dtype=torch.uint8, device=_device(env))
        mine[:data.numel()] = data.to(mine.device)
        out = [torch.empty_like(mine) for _ in range(env.world_size)]
        done = hand_over(env.backend, "all_gather", mine, *out)
        dist.all_gather(out, mine)
        done()
    return [pickle.loads(o[:int(s.item())].cpu().numpy().tobytes()) for o, s in zip(out, sizes)]


def all_reduce(t: torch.Tensor, env: DistEnv, name: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """All-reduce `t` in place over the ranks (a `collective` error naming the silent ranks)."""
    done = hand_over(env.backend, name, t)
    with collective(name, env), lastwords.phase(name):
        dist.all_reduce(t, op=op)
    done()
    return t


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank when `flag` is true on at least one (e.g. a stop signal seen by one rank)."""
    if not env.distributed:
        return flag
    return bool(all_reduce(torch.tensor([int(flag)], device=_device(env)), env, "all_reduce (stop check)",
                           dist.ReduceOp.MAX).item())


def barrier(env: DistEnv, name: str = "barrier") -> None:
    """Every rank waits here for all the others: an all-reduce of one number. (gloo's own barrier keeps the
    collectives still in flight when it starts, and frees them in a worker thread whenever it is freed.)"""
    if env.distributed:
        all_reduce(torch.zeros(1, device=_device(env)), env, name)


def average_gradients(params: list, env: DistEnv, dtype: torch.dtype | None = None) -> None:
    """Average the gradients of `params` over the ranks with one all-reduce of one flat buffer (the engine's
    ddp_sync=flat): a few kernels and little host time, where DDP's hooks copy and scale each parameter's
    gradient into its bucket. Each .grad becomes a view of the buffer, in the layout it had. `dtype`
    (ddp_grad_dtype=bf16): the buffer travels in that dtype, half the bytes of fp32 and rounded, as DDP's
    bf16_compress_hook does."""
    start_average(params, env, dtype)()


def start_average(params: list, env: DistEnv, dtype: torch.dtype | None = None):
    """Start averaging the gradients of `params` (one flat buffer, all-reduced without waiting for it) and
    return the function that waits for it and makes each .grad a view of the result. On a GPU the wait only
    orders the streams: the caller's kernels queued after it run once the all-reduce is done, and the
    kernels queued before it (the rest of the backward pass) run alongside it (tutorial_lib.buckets)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = flatten(grads)
    sent = flat.to(dtype) if dtype is not None and dtype != flat.dtype else flat
    average = env.backend == "nccl"  # NCCL averages as it sums: no extra pass over the buffer; gloo has no AVG
    done = hand_over(env.backend, "gradients", sent)
    work = dist.all_reduce(sent, op=dist.ReduceOp.AVG if average else dist.ReduceOp.SUM, async_op=True)

    def land() -> None:
        nonlocal work
        work.wait()
        work = None
        done()
        if not average:
            sent.div_(env.world_size)
        if sent is not flat:
            flat.copy_(sent)
        for p, view in zip(params, views_of(flat, grads)):
            p.grad = view
    return land


@torch.no_grad()
def broadcast_(tensors: list, env: DistEnv, src: int = 0) -> None:
    """Copy rank `src`'s values of `tensors` into every rank's, in place: one broadcast per dtype of one flat
    buffer (what DDP does with the parameters when it wraps a model, and with the buffers every forward)."""
    by_dtype: dict = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = flatten(group)
        done = hand_over(env.backend, "broadcast", flat)
        dist.broadcast(flat, src)
        done()
        torch._foreach_copy_(group, views_of(flat, group))  # one kernel, not one per tensor (~60 BatchNorm buffers)


def flatten(tensors: list) -> torch.Tensor:
    """One 1-D buffer holding `tensors` one after the other, each in the order it lies in memory. One foreach
    copy writes them all (torch.cat of ResNet-18's 62 gradients of mixed sizes ran at an eighth of an H200's
    bandwidth: 0.16 ms of a 4.4 ms step)."""
    flat = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, device=tensors[0].device)
    torch._foreach_copy_(views_of(flat, tensors), tensors)
    return flat


def views_of(flat: torch.Tensor, like: list) -> list:
    """Views of `flat` with each tensor's size, and its strides when it is dense (channels_last stays
    channels_last); a tensor with gaps (a slice) gets a contiguous view."""
    parts = flat.split([t.numel() for t in like])
    return [part.as_strided(t.size(), t.stride()) if _dense(t) else part.view(t.size()) for t, part in zip(like, parts)]


def _dense(t: torch.Tensor) -> bool:
    return t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))


class StopVote:
    """Did any rank see a stop signal? Asked at every log_every step without stopping the GPU: `.item()` right
    after an all_reduce waits for every kernel queued so far, and the GPU then idles while Python queues the next
    step. So the vote is cast one step before each log step (copied to pinned host memory in the meantime) and
    read at the log step, while the device still has that step queued: every rank reads the same vote at the
    same step, and they all stop together at the first log step after the signal (one step later when the signal
    comes in the step before it). One process: the flag itself, at every step."""

    def __init__(self, env: DistEnv, every: int = 1, last: int | None = None):
        self.env, self.every, self.last, self.pending = env, every, last, None

    def _log_step(self, step: int) -> bool:
        return step % self.every == 0 or step == self.last

    def stop_now(self, step: int, flag: bool) -> bool:
        """After `step`: True on every rank when the run stops here (a vote cast before it found a flag on some
        rank); casts this rank's `flag` when the next step is a log step."""
        if not self.env.distributed:
            return flag
        seen = bool(self._land().item()) if self.pending is not None and self._log_step(step) else False
        if not seen and self._log_step(step + 1) and (self.last is None or step < self.last):
            self.cast(flag)
        return seen

    def cast(self, flag: bool) -> None:
        """Start the all-reduce of this rank's `flag` (the answer is read by `_land`)."""
        nccl = self.env.backend == "nccl"
        t = torch.full((1,), int(flag), dtype=torch.int32, device=_device(self.env))
        done = hand_over(self.env.backend, "stop vote", t)
        work = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
        if nccl:
            work.wait()  # with NCCL: the current stream waits for the all-reduce; the host does not
            host = torch.empty(1, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            self.pending = (host, ready, done)
        else:
            self.pending = (t, work, done)

    def _land(self) -> torch.Tensor:
        """Wait for the vote cast last (and, with gloo, for its worker to let go of it); its answer."""
        host, ready, let_go = self.pending
        self.pending = None
        with lastwords.phase("stop vote (all_reduce)"):
            ready.synchronize() if isinstance(ready, torch.cuda.Event) else ready.wait()
        del ready  # gloo: the work, whose last reference the worker must not be left holding
        let_go()
        return host

    def settle(self) -> None:
        """Wait for the last vote cast, whose answer nobody reads: no collective may still be in flight when the
        process group is torn down (a gloo rank was seen to abort at exit, after its run had finished)."""
        if self.pending is not None:
            self._land()
