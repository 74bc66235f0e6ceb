"""A sharded run (parallel=fsdp, two gloo processes under torchrun) on the local Slurm cluster, rendered by
tutorial_lib.jobs with the local site profile: its time limit comes in mid-run, the job's USR1 handler (requeue=60)
asks the training to checkpoint, the training writes its DCP checkpoint (checkpoint.dcp/step_N) and stops, and the
job is requeued. The job's second run resumes from that checkpoint to the losses and parameters of the same run
uninterrupted, which a job beside it trains; that checkpoint, copied as the second run starts, resumes on one
process (the same global batch: DCP reshards) to the same parameters.

The time limit is four minutes (LIMIT_MIN): rather than train for that long, the run waits in step 3, using no CPU,
until the stop signal arrives (a Python start-up hook, HOOK, given to that job only through STALL_STEP); the step
then completes, and the run stops at a step boundary as it would in any long step. The hook also gives every
job's model GroupNorm instead of BatchNorm: a BatchNorm layer normalises over each rank's own batch, so 2 x 8
images are not 1 x 16, and only a model without it trains alike on one and on two processes (tests/test_fsdp.py
does the same).

The chain starts when the session does (tests/conftest.py, when this module is selected and the cluster answers):
it is mostly waiting for the time limit, beside the other tests.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from test_slurm import PROBLEM
from test_slurm_signals import StageChain
from tutorial_lib import jobs, sharding
from tutorial_lib.config import TrainConfig
from tutorial_lib.slurm import Job

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))]

STEPS, STALL_AT = 6, 3
# Slurm sends the USR1 of --signal=USR1@R at its first check of the job's limits (every 30 s) that comes less than
# R + 30 s before the limit, and ends the job at the first check past the limit. With one minute and R=10 the signal
# came 20 s after the start, before two processes on a busy 2-core machine had installed their handler (it was
# lost); on a machine running twenty processes the set-up took 100 s and writing the checkpoint 30 s. With four
# minutes and R=60 the signal comes 150-180 s after the start, at least 60 s before the end; the stalled step waits
# for it using no CPU.
LIMIT_MIN, REQUEUE_S = 4, 60

HOOK = """
# Python's start-up hook (sitecustomize, on PYTHONPATH) of these jobs' training ranks (torchrun sets LOCAL_RANK):
# the model with GroupNorm; where STALL_STEP is set, a run not yet stopped after that step waits in it, using no CPU,
# until a stop signal arrives (the time limit's USR1), and the run resumed after it copies the checkpoint it resumes
# from to COPY_TO (rank 0, before its first step; nothing is written before the run's last step).
import os

if os.environ.get("LOCAL_RANK") is not None:
    import shutil
    import time

    import torchvision
    from torch import nn

    from tutorial_lib import engine, models

    models.build = lambda name, num_classes: torchvision.models.resnet18(
        num_classes=num_classes, norm_layer=lambda c: nn.GroupNorm(8, c))
    step, stall = engine.Run.train_step, int(os.environ.get("STALL_STEP", 0))

    def train_step(self, x, y):
        if stall and self.step + 1 == stall and (self.resumed_from or 0) < stall:  # (a signal may come earlier)
            deadline = time.monotonic() + 240
            while not self.stop_requested and time.monotonic() < deadline:
                time.sleep(0.2)
        copy = os.path.join(os.environ.get("COPY_TO", ""), "checkpoint.dcp")
        if stall and self.step == self.resumed_from >= stall and self.env.is_main and not os.path.exists(copy):
            shutil.copytree(self.out / "checkpoint.dcp", copy)
        return step(self, x, y)

    engine.Run.train_step = train_step
"""


def config(out: Path) -> TrainConfig:
    return TrainConfig(dataset="shapes", model="resnet18_imagenet", parallel="fsdp", steps=STEPS, global_batch_size=16,
                       train_size=128, device="cpu", num_workers=0, progress=False, tensorboard=False, log_every=1,
                       eval=False, augment=False, lr_schedule="constant", out_dir=str(out))


class Chain(StageChain):
    """Submitted at once: the time-limited job and the uninterrupted one beside it; once the first has finished,
    the one-process resume of its copied checkpoint. Each stage's outcome, or the exception that ended it."""

    stages, wait_s = ("submit", "time_limit", "on_one"), 1200

    def job(self, name: str, out: str, *env: str, **resources) -> Job:
        path = jobs.write(f"t_fsdp_{name}", config(self.work / out), site="local", jobs_dir=self.work / "jobs",
                          show=False, output=f"{self.work}/logs/%x-%j.out", **resources)
        job = jobs.submit(path, sbatch_args=[f"--export={','.join(['ALL', f'PYTHONPATH={self.hook}', *env])}"])
        self.ids.append(job.id)
        return job

    def submit(self) -> None:
        self.hook = self.work / "hook"
        self.hook.mkdir()
        (self.hook / "sitecustomize.py").write_text(HOOK)
        (self.work / "copy").mkdir()
        self.limited = self.job("limited", "limited", f"STALL_STEP={STALL_AT}", f"COPY_TO={self.work / 'copy'}",
                                gpus_per_node=2, time=f"00:0{LIMIT_MIN}:00", requeue=REQUEUE_S)
        self.straight = self.job("straight", "straight", gpus_per_node=2)

    def time_limit(self) -> tuple[dict, str]:
        """The time-limited job, requeued once and finished: its result and log."""
        assert self.limited.wait(timeout=900, poll=1.0, quiet=True) == "COMPLETED", self.limited.log(80)
        return self.limited.result(), self.limited.log(1000)

    def on_one(self) -> tuple[dict, dict]:
        """The checkpoint the requeued run resumed from, resumed by one process (torchrun, one rank); and the
        uninterrupted run's result."""
        self.stopped_at = int((self.work / "copy" / sharding.FOLDER / "latest").read_text().strip()
                              .removeprefix("step_"))  # before the one-process run writes its own checkpoints there
        job = self.job("on_one", "copy", gpus_per_node=1, mode="torchrun")
        assert job.wait(timeout=300, poll=1.0, quiet=True) == "COMPLETED", job.log(80)
        assert self.straight.wait(timeout=300, poll=1.0, quiet=True) == "COMPLETED", self.straight.log(80)
        return job.result(), self.straight.result()


_CHAIN: list[Chain] = []


def start_early(tmp_path_factory) -> None:
    """Start the chain in the background (tests/conftest.py calls this as the session starts)."""
    if not _CHAIN:
        _CHAIN.append(Chain(tmp_path_factory.mktemp("slurm_fsdp")))
        _CHAIN[0].thread.start()


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    start_early(tmp_path_factory)  # already running when the session started it
    yield _CHAIN[0]
    _CHAIN[0].thread.join(timeout=1)
    for job_id in _CHAIN[0].ids:  # nothing of ours left on the cluster when a test failed early
        subprocess.run(["scancel", job_id], capture_output=True)


def test_a_sharded_run_at_its_time_limit_checkpoints_and_is_requeued(chain):
    (res, log), _ = chain.get("time_limit"), chain.get("on_one")
    step = chain.stopped_at  # the checkpoint the time limit left (copied as the requeued run started)
    assert STALL_AT <= step < STEPS  # in or just after the step the signal came in: the ranks agree at a step's end
    assert chain.limited.restarts() >= 1
    assert "USR1: the time limit is near" in log and "requeueing job" in log, log[-3000:]
    assert f"stopped by SIGUSR1: checkpoint at step {step}" in log and "DUE TO TIME LIMIT" not in log, log[-3000:]
    assert f"resuming from step {step} of " in log, log[-3000:]
    # (on a busy machine the resumed run may meet the time limit too, and be requeued again, from a later step)
    assert res["world_size"] == 2 and step <= res["resumed_from_step"] <= STEPS and res["steps"] == STEPS
    folder = chain.work / "limited" / sharding.FOLDER  # a DCP checkpoint, no checkpoint.pt
    assert (folder / "latest").read_text().strip() == f"step_{STEPS:08d}"
    assert not (chain.work / "limited" / "checkpoint.pt").exists()


def test_the_requeued_sharded_run_ends_as_the_uninterrupted_run_did(chain):
    (res, _), (_, straight) = chain.get("time_limit"), chain.get("on_one")
    assert straight["world_size"] == 2 and straight["resumed_from_step"] is None and len(straight["loss"]) == STEPS
    assert len(res["loss"]) == STEPS and res["loss"] == pytest.approx(straight["loss"], rel=1e-5)
    assert res["param_checksums"][0] == res["param_checksums"][1]  # gathered whole on every rank
    assert res["param_checksums"][0] == pytest.approx(straight["param_checksums"][0], rel=1e-6)


def test_the_time_limits_checkpoint_resumes_on_one_process_to_the_same_parameters(chain):
    (res, _), (one, straight) = chain.get("time_limit"), chain.get("on_one")
    step = chain.stopped_at
    assert one["world_size"] == 1 and one["resumed_from_step"] == step and one["steps"] == STEPS
    assert one["global_batch"] == straight["global_batch"] == 16
    assert one["loss"][:step] == res["loss"][:step]  # carried in the checkpoint (rank 0's: 8 images a step)
    assert one["param_checksums"][0] == pytest.approx(straight["param_checksums"][0], rel=1e-6)  # the same training
