"""parallel=fsdp: the model sharded over the ranks with FSDP2 (torch.distributed.fsdp.fully_shard), and its
checkpoints with torch.distributed.checkpoint (DCP).

Each block (blocks.py) and then the whole model is sharded: every rank keeps 1/N of the parameters, gradients and
optimizer state, gathers a block's parameters just before the block runs (forward and backward), frees them
after, and reduce-scatters the gradients so that each rank averages only its own shard. precision=bf16: the
parameters are gathered in bf16 and the gradients reduced in fp32 (FSDP2's MixedPrecisionPolicy).

A sharded model has no whole copy on any rank, so rank 0 can't torch.save it. Every rank writes its own shards
into one folder per checkpoint, `<out_dir>/checkpoint.dcp/step_<N>/`, with DCP's async save: the state is
copied, and written while training goes on. The file `checkpoint.dcp/latest` names the last folder that is
complete (every rank's shards, DCP's metadata, the run's progress in run.pt): it is replaced in one rename once
all of it is written, so a checkpoint is complete or absent. DCP reshards when it loads, so a run saved on N
ranks continues on M (same global batch).
"""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from . import blocks, checkpoint, distributed
from .checkpoint import check_length, read_checkpoint, restore_progress, run_state, write_checkpoint
from .config import ConfigError, UserError, resume_differences
from .results import atomic_write_text, disk_problem

FOLDER, LATEST, PROGRESS = "checkpoint.dcp", "latest", "run.pt"


# FSDP2 and DCP are imported by the sharded path only: together they take about a second to import, which every
# other run (each rank, each job, each command) would pay at its start for nothing.
def fsdp():
    """torch's FSDP2 module: fully_shard, MixedPrecisionPolicy."""
    import torch.distributed.fsdp as fsdp2

    if not hasattr(fsdp2, "fully_shard"):  # pragma: no cover  (torch 2.4 and 2.5: FSDP2 under its first name)
        import torch.distributed._composable.fsdp as fsdp2
    return fsdp2


def dcp():
    """torch.distributed.checkpoint, with its state_dict helpers loaded."""
    import torch.distributed.checkpoint as dcp_
    import torch.distributed.checkpoint.state_dict  # noqa: F401  (get_state_dict, set_state_dict)

    return dcp_


# ---------------------------------------------------------------------------------------------- sharding
def policy(precision: str):
    """bf16: parameters gathered (and the blocks computed) in bf16, gradients reduced in fp32; else fp32 all through
    (an FSDP2 MixedPrecisionPolicy)."""
    if precision == "bf16":
        return fsdp().MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return fsdp().MixedPrecisionPolicy()


def prepare(net: nn.Module, cfg, env: distributed.DistEnv) -> nn.Module:
    """The model before the engine wraps it: its blocks checkpointed (activation_checkpointing=blocks) and, for
    parallel=fsdp, sharded; the same module, changed in place."""
    blocks.apply_checkpointing(net, cfg.activation_checkpointing)
    return shard(net, cfg.precision, env) if cfg.parallel == "fsdp" else net


def shard(net: nn.Module, precision: str, env: distributed.DistEnv) -> nn.Module:
    """fully_shard each block, then the model (which then holds what no block holds: stem, head). The module is
    changed in place: its parameters become DTensors holding this rank's shard. A BatchNorm layer is sharded on
    its own in fp32: its parameters stay in the dtype of its running statistics (batch_norm wants one dtype)."""
    fully_shard = fsdp().fully_shard
    mesh = dist.device_mesh.init_device_mesh(env.device.type, (env.world_size,))
    mp = policy(precision)
    if mp.param_dtype is not None:
        for norm in (m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)):
            fully_shard(norm, mesh=mesh, mp_policy=policy("fp32"))
    for block in blocks.find(net):
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(net, mesh=mesh, mp_policy=mp)
    return net


def checkpoint_path(run) -> Path:
    """Where the run's checkpoint lives: checkpoint.pt, or for a sharded model the folder of its shards."""
    return run.out / (FOLDER if run.cfg.parallel == "fsdp" else "checkpoint.pt")


# ---------------------------------------------------------------------------------------------- saving
class Pending:
    """A checkpoint being written by DCP's async save; `publish` names it in `latest` once it is complete."""

    def __init__(self, future, folder: Path, progress: dict | None):
        self.future, self.folder, self.progress = future, folder, progress  # progress: rank 0's run.pt, else None
        self.lock, self.done = threading.Lock(), False

    def publish(self) -> None:
        """Rank 0: run.pt into the folder, then `latest` points at it, then older folders go (once, either from
        the save's own thread when it finishes or from wait())."""
        with self.lock:
            if self.done or self.progress is None or self.future.exception() is not None:
                return
            write_checkpoint(self.progress, self.folder / PROGRESS)
            atomic_write_text(self.folder.parent / LATEST, self.folder.name + "\n")
            for old in self.folder.parent.glob("step_*"):
                if old != self.folder:
                    shutil.rmtree(old, ignore_errors=True)
            self.done = True

    def wait(self) -> None:
        """Until this rank's shards are written (and, on rank 0, the checkpoint is published); a failed write in
        one line, the previous checkpoint kept."""
        try:
            self.future.result()
        except (Exception, dcp().api.CheckpointException) as e:  # noqa: BLE001  (CheckpointException: a BaseException)
            problem = disk_problem(self.folder.parent, e) or (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserError(f"could not write the checkpoint {self.folder} ({problem[:200]}); the one "
                            f"{self.folder.parent / LATEST} names is kept. Free space or use another out_dir") from None
        self.publish()


def save(run) -> None:
    """Everything the run needs to continue (checkpoint.run_state): rank 0 writes checkpoint.pt, or every rank
    the shards of a sharded model (save_shards)."""
    if run.cfg.parallel == "fsdp":
        return save_shards(run)
    if run.env.is_main:
        run.loss_log.ship(run.step)
        run.loss_log.ready(wait=True)  # the checkpoint holds every loss so far (fit() has reported them)
        write_checkpoint(run_state(run), checkpoint_path(run))
        run.saved_step = run.step


def save_shards(run) -> None:
    """Every rank: start writing this step's checkpoint (after the one before it is complete). It is waited for
    at once when the run stops here (a stop signal, its end), else while the next steps train."""
    pending = getattr(run, "pending_checkpoint", None)
    if pending is not None:
        pending.wait()
    if pending is not None and run.saved_step == run.step:  # already written (the last step's checkpoint)
        return
    folder = run.out / FOLDER / f"step_{run.step:08d}"
    if latest(run.out) == folder:  # this step's checkpoint is complete already (a finished run resumed)
        run.saved_step = run.step
        return
    progress = None
    if run.env.is_main:
        run.loss_log.ship(run.step)
        run.loss_log.ready(wait=True)  # the checkpoint holds every loss so far
        progress = run_state_without_weights(run)
        shutil.rmtree(folder, ignore_errors=True)  # what a save of this step that never finished left
        folder.mkdir(parents=True, exist_ok=True)
    distributed.barrier(run.env, "barrier before the checkpoint")
    model, optim = dcp().state_dict.get_state_dict(run.raw_model, run.opt)
    if getattr(run, "checkpoint_group", None) is None:  # the async save's collectives run beside the training's
        run.checkpoint_group = dist.new_group(backend="gloo")
        distributed.before_teardown(lambda: finish(run))
    future = dcp().async_save({"model": model, "optim": optim}, checkpoint_id=str(folder),
                            process_group=run.checkpoint_group)
    run.pending_checkpoint = pending = Pending(future, folder, progress)
    if progress is not None:
        future.add_done_callback(lambda _: pending.publish())
    run.saved_step = run.step
    if not training_goes_on(run):
        pending.wait()


def training_goes_on(run) -> bool:
    """A checkpoint every ckpt_every steps in mid-run is written while the next steps train; one where the run
    stops (a stop signal, its last step) is waited for."""
    every = run.cfg.ckpt_every
    return bool(every) and run.step % every == 0 and run.step < run.total_steps and not run.stop_requested


def finish(run) -> None:
    """Before the process group goes (an error ended the run, or a rank stopped): the checkpoint still being
    written is completed, or a line says it was not."""
    pending = getattr(run, "pending_checkpoint", None)
    try:
        if pending is not None:
            pending.wait()
    except UserError as e:
        if run.env.is_main:
            print(f"the last checkpoint is lost: {e}", flush=True)


def run_state_without_weights(run) -> dict:
    """checkpoint.run_state with empty model and optimizer entries: those are the shards DCP writes."""
    return {**run_state(run), "model": {}, "optimizer": {}}


# ---------------------------------------------------------------------------------------------- resuming
def resume(run) -> bool:
    """Continue from the run's checkpoint when resume=true and one exists (checkpoint.resume, or resume_shards for
    a sharded model): True once restored."""
    return resume_shards(run) if run.cfg.parallel == "fsdp" else checkpoint.resume(run)


def resume_shards(run) -> bool:
    """Continue from the checkpoint `latest` names, on any number of ranks with the same global batch (DCP
    reshards): True once restored. A checkpoint of another run is refused with the fix."""
    root, folder = run.out / FOLDER, latest(run.out)
    if not (run.cfg.resume and folder is not None):
        return False
    state = read_checkpoint(folder / PROGRESS, run.device)
    differ = resume_differences(state["config"], run.cfg)
    saved = global_batch(state["config"], state["world_size"])
    if saved != run.images_per_step:
        differ.append(f"a global batch of {saved} images on {state['world_size']} ranks (now {run.images_per_step}"
                      f" on {run.env.world_size}: give global_batch_size={saved} to continue it here)")
    if differ:
        raise ConfigError(f"{folder} holds a run with {'; '.join(differ)}: resuming would mix two runs; use "
                          "the checkpoint's values, another out_dir, or resume=false to start afresh")
    check_length(folder, state["step"], run.cfg, run.total_steps)
    dcp_ = dcp()
    model, optim = dcp_.state_dict.get_state_dict(run.raw_model, run.opt)
    try:
        dcp_.load({"model": model, "optim": optim}, checkpoint_id=str(folder))
        dcp_.state_dict.set_state_dict(run.raw_model, run.opt, model_state_dict=model, optim_state_dict=optim)
        restore_progress(run, state)
    except (Exception, dcp_.api.CheckpointException) as e:  # noqa: BLE001  (another model's shards, a missing file)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"{folder} does not fit this run ({first}); move {root} away, or give resume=false to "
                        "start afresh") from None
    return True


def latest(out: Path) -> Path | None:
    """The folder of the last complete checkpoint in `out` (the one `latest` names), or None."""
    name = out / FOLDER / LATEST
    return out / FOLDER / name.read_text().strip() if name.is_file() else None


def global_batch(config: dict, world_size: int) -> int:
    """Images per optimizer step of a saved run's config on `world_size` ranks."""
    per_rank = config["global_batch_size"] // world_size if config.get("global_batch_size") else config["batch_size"]
    return per_rank * world_size * config.get("grad_accum_steps", 1)
