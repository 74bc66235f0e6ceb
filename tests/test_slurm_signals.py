"""A real job on the local Slurm cluster, stopped the two ways Slurm stops a job without warning it first, each
time with DataLoader workers running: `scancel`, then its time limit without --signal. Both send SIGTERM to
every process of the job step, the workers included; each time the run leaves a checkpoint, and the job
submitted again resumes it. The run that was stopped twice ends with the losses and the validation history
(its steps and accuracies; its seconds counted on from the original start) of the same run uninterrupted,
which a job beside it trains.

The chain runs its three jobs one after the other (cancelled, timed out, finished) while the uninterrupted
job runs beside them, and beside the jobs of tests/test_slurm.py (which starts the chain as it submits its
own). A time limit comes 60 to 90 s after a job starts (Slurm checks the limits every 30 s): rather than
train for that long, the time-limited job's first step after its resume waits, using no CPU, until the
stop signal arrives (a Python start-up hook, STALL, given to that job only); the step then completes, and
the run stops at the step boundary as it would in any long step.
"""
from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import selected
from test_slurm import PROBLEM, tiny
from tutorial_lib import jobs, scaling
from tutorial_lib.slurm import Job

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))]

STALL = """
# Python's start-up hook (sitecustomize, on PYTHONPATH) of the time-limited job only: the first training step after
# the resume waits, using no CPU, until a stop signal arrives (the time limit's SIGTERM), then runs.
import time

from tutorial_lib import engine

step = engine.Run.train_step


def train_step(self, x, y):
    if self.step == self.resumed_from:
        deadline = time.monotonic() + 240
        while not self.stop_requested and time.monotonic() < deadline:
            time.sleep(0.2)
    return step(self, x, y)


engine.Run.train_step = train_step
"""


class StageChain:
    """Stages (methods named in `stages`) run one after the other in a background thread, so that the Slurm tests
    wait for the cluster side by side; each stage's outcome, or the exception that ended it, in `outcome`."""
    stages: tuple[str, ...] = ()
    wait_s = 900  # how long a test waits for a stage

    def __init__(self, work: Path):
        self.work, self.ids, self.outcome = work, [], {}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        for name in self.stages:
            try:
                self.outcome[name] = getattr(self, name)()
            except BaseException as e:  # noqa: BLE001  (the test that reads this stage raises it)
                self.outcome[name] = e
                return

    def get(self, stage: str):
        """A stage's outcome, once the chain has got there; its exception raised here."""
        deadline = time.monotonic() + self.wait_s
        while stage not in self.outcome and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        if stage not in self.outcome:
            pytest.fail(f"the chain never reached {stage} (stopped at {list(self.outcome)})")
        if isinstance(self.outcome[stage], BaseException):
            raise self.outcome[stage]
        return self.outcome[stage]


class Chain(StageChain):
    """The stopped job's three submissions (cancelled, timed out, finished) and the uninterrupted one beside them,
    run one after the other in a thread (`run`); each stage's outcome, or the exception that ended it, in
    `outcome`."""

    stages = ("prepare", "cancel", "time_out", "finish")

    def prepare(self) -> int:
        # 32 steps an epoch, one worker re-forked every epoch, validation every 20 steps: the history to compare
        cfg = tiny(self.work / "stopped", steps=48, train_size=256, num_workers=1, eval_every=20, log_every=4)
        common = dict(site="local", cpus_per_task=2, jobs_dir=self.work / "jobs", show=False,
                      output=f"{self.work}/logs/%x-%j.out")
        self.path = jobs.write("t_stopped", cfg, **common)
        self.straight = jobs.submit(jobs.write("t_straight", cfg.replace(out_dir=str(self.work / "straight")),
                                               **common))
        self.ids.append(self.straight.id)
        (self.work / "stall").mkdir()
        (self.work / "stall" / "sitecustomize.py").write_text(STALL)
        self.out = Path(cfg.out_dir)
        return cfg.steps

    def submit(self, *sbatch_args: str) -> Job:
        job = jobs.submit(self.path, sbatch_args=list(sbatch_args))
        self.ids.append(job.id)
        return job

    def checkpoint(self) -> dict:
        return torch.load(self.out / "checkpoint.pt", weights_only=True)

    def cancel(self) -> tuple[Job, dict, list[str]]:
        """Submitted, then cancelled with scancel once it trains (past its first validation), its worker running."""
        job = self.submit()
        deadline = time.monotonic() + 300
        while "step 24/" not in job.log(400) and time.monotonic() < deadline:
            assert job.state() in ("PENDING", "RUNNING"), job.log(60)
            time.sleep(0.5)
        processes = _process_names(job.id)
        subprocess.run(["scancel", job.id], check=True)
        assert job.wait(timeout=120, quiet=True) == "CANCELLED", job.log(60)
        return job, self.checkpoint(), processes

    def time_out(self) -> tuple[Job, dict]:
        """Submitted again with a two-minute limit and no --signal: its time limit stops it (during its first step,
        which waits for it: with one minute, a loaded 2-core node was still starting the run when the limit came)."""
        job = self.submit("--time=00:02:00", f"--export=ALL,PYTHONPATH={self.work / 'stall'}")
        assert job.wait(timeout=300, quiet=True) == "TIMEOUT", job.log(60)
        return job, self.checkpoint()

    def finish(self) -> tuple[Job, dict, dict]:
        """Submitted a third time: it finishes. Its result, and the uninterrupted run's."""
        job = self.submit()
        assert job.wait(timeout=300, quiet=True) == "COMPLETED", job.log(60)
        assert self.straight.wait(timeout=300, quiet=True) == "COMPLETED", self.straight.log(60)
        return job, job.result(), self.straight.result()


def _process_names(job_id: str) -> list[str]:
    """The names of the job's processes (a DataLoader worker calls itself pt_data_worker)."""
    node = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True).stdout.strip()
    listing = subprocess.run(["scontrol", "listpids", job_id, node], capture_output=True, text=True).stdout
    names = []
    for pid in (line.split()[0] for line in listing.splitlines()[1:] if line.split()):
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            pass
    return names


_CHAIN: list[Chain] = []


def start_beside(session, tmp_path_factory, here: bool = False) -> None:
    """Start the chain in the background when this module's tests are selected: tests/test_slurm.py calls this as
    it submits its own jobs, so that the two wait for the cluster side by side (the chain is mostly waiting).
    `here`: this module's tests are running now (its fixture), so start it in any case."""
    if not _CHAIN and (here or selected(session, "test_slurm_signals.py")):
        _CHAIN.append(Chain(tmp_path_factory.mktemp("slurm_signals")))
        _CHAIN[0].thread.start()


@pytest.fixture(scope="module")
def chain(request, tmp_path_factory):
    start_beside(request.session, tmp_path_factory, here=True)  # already running if tests/test_slurm.py started it
    yield _CHAIN[0]
    _CHAIN[0].thread.join(timeout=1)
    for job_id in _CHAIN[0].ids:  # nothing of ours left on the cluster when a test failed early
        subprocess.run(["scancel", job_id], capture_output=True)


def test_scancel_with_dataloader_workers_running_leaves_a_checkpoint(chain):
    job, state, processes = chain.get("cancel")
    log = job.log(400)
    assert "stopped by SIGTERM: checkpoint at step" in log and "is killed by signal" not in log, log[-3000:]
    assert "pt_data_worker" in processes, processes  # the signal reached a running worker
    assert 24 <= state["step"] < chain.get("prepare") and [h[0] for h in state["val_history"]][:1] == [20]


def test_a_time_limit_without_signal_stops_the_resumed_run_with_a_checkpoint(chain):
    (_, first, _), (job, state) = chain.get("cancel"), chain.get("time_out")
    log = job.log(400)
    assert f"resuming from step {first['step']}" in log and "stopped by SIGTERM: checkpoint at step" in log, log[-3000:]
    assert "is killed by signal" not in log
    assert state["step"] == first["step"] + 1  # the step it was in when the limit came


def test_the_run_stopped_twice_ends_as_the_uninterrupted_run_did(chain):
    (_, first, _), (_, second), steps = chain.get("cancel"), chain.get("time_out"), chain.get("prepare")
    job, res, straight = chain.get("finish")
    assert f"resuming from step {second['step']}" in job.log(400)
    assert res["steps"] == straight["steps"] == steps and res["resumed_from_step"] == second["step"]
    assert res["loss"] == straight["loss"]  # step for step, bit for bit
    assert res["param_checksums"] == straight["param_checksums"]
    assert [(s, a) for s, _, a in res["val_history"]] == [(s, a) for s, _, a in straight["val_history"]]
    # the points before each stop as they were recorded, and the clock counted on from the original start
    assert res["val_history"][:len(first["val_history"])] == first["val_history"]
    assert res["val_history"][:len(second["val_history"])] == second["val_history"]
    seconds = [t for _, t, _ in res["val_history"]]
    assert all(a < b for a, b in zip(seconds, seconds[1:])), seconds
    for _, t, accuracy in res["val_history"]:  # time to each accuracy on the run's own clock, whole history
        assert scaling.time_to_target(res, accuracy) <= t
    assert res["wall_time_s"] > second["clock"]["wall_s"] > first["clock"]["wall_s"]
