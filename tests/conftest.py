import os
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]  # the environment of a test run: ../conftest.py


def tiny(out_dir, **kw):
    """A config that trains in seconds on a 2-core CPU."""
    from tutorial_lib.config import TrainConfig

    base = dict(dataset="shapes", model="resnet18_imagenet", batch_size=16, steps=6, train_size=256, val_size=64,
                device="cpu", num_workers=0, progress=False, tensorboard=False, out_dir=str(out_dir), log_every=2,
                timing_warmup=1)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory):
    """result.json of one 2-rank DDP run (torchrun, gloo) with test_ddp's settings, shared by the tests that
    read the same run: starting two processes is most of what such a test costs."""
    from test_ddp import torchrun

    return torchrun(2, tmp_path_factory.mktemp("ddp") / "two_ranks")


@pytest.fixture
def tiny_cfg(tmp_path):
    return lambda **kw: tiny(kw.pop("out_dir", tmp_path / "run"), **kw)


def cli(*args, env=None, timeout=300, cwd=None):
    """Run `python -m tutorial_lib ...`; returns the CompletedProcess."""
    import subprocess

    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "tutorial_lib", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)


def interrupted_at(cfg, stop_step):
    """Train until `stop_step`, then behave as on SIGUSR1: checkpoint and raise Preempted."""
    from tutorial_lib import engine

    run = engine.Run(cfg, engine.distributed.setup("none", "cpu"))
    step = run.train_step

    def train_step(x, y):
        if run.step + 1 == stop_step:
            run.stop_requested = True
        return step(x, y)
    run.train_step = train_step
    with pytest.raises(engine.Preempted):
        run.fit()


def feed_accuracies(monkeypatch, accuracies: list[float]) -> list[float]:
    """Every validation pass of a run in this process returns the next of `accuracies`, whatever the model learned:
    a test of what a run does with its validation history feeds the history it needs (where a tiny run's own
    accuracies go depends on the CPU's kernels and threads). Returns the accuracies handed out so far."""
    from tutorial_lib import engine

    given = []

    def evaluate(self):
        given.append(accuracies[len(given)])
        return given[-1]
    monkeypatch.setattr(engine.Run, "evaluate", evaluate)
    return given


class SleepyNet(nn.Module):
    """A linear classifier whose forward takes `seconds` longer: a step of known cost (timing and bench tests)."""

    def __init__(self, num_classes: int, seconds: float):
        super().__init__()
        self.fc, self.seconds = nn.Linear(3 * 32 * 32, num_classes), seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return self.fc(x.flatten(1))



@pytest.fixture
def one_thread():
    """One intra-op thread: on a busy machine two threads that wait for each other turn 1 ms ops into 100 ms."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def selected(session, module: str) -> bool:
    """Whether this session runs any test of tests/<module> (work started early for it is wasted otherwise)."""
    return any(Path(str(item.fspath)).name == module for item in session.items)


@pytest.fixture(scope="session", autouse=True)
def slurm_requeue_job_early(request, tmp_path_factory):
    """tests/test_slurm.py's requeue job and tests/test_slurm_fsdp.py's chain of jobs, submitted as the session starts
    when their module is selected and the local cluster answers: their minutes of waiting for Slurm's time limit
    overlap the other tests (test_slurm.submit_requeue_early, test_slurm_fsdp.start_early)."""
    if selected(request.session, "test_slurm.py"):
        import test_slurm  # the module pytest collected (tests/ is on sys.path)

        if test_slurm.PROBLEM is None:
            test_slurm.submit_requeue_early(tmp_path_factory.mktemp("slurm_requeue"))
    if selected(request.session, "test_slurm_fsdp.py"):  # its jobs wait minutes for a time limit, using no CPU
        import test_slurm_fsdp

        if test_slurm_fsdp.PROBLEM is None:
            test_slurm_fsdp.start_early(tmp_path_factory)
    yield


@pytest.fixture(scope="session", autouse=True)
def studies_05_06_early(request, tmp_path_factory):
    """tests/test_studies_05_06.py's three small studies, started at idle priority as the session starts when that
    module is selected: their CPU time fills the cycles the tests before it leave idle (start_early)."""
    if selected(request.session, "test_studies_05_06.py"):
        import test_studies_05_06

        test_studies_05_06.start_early(tmp_path_factory)
    yield


@pytest.fixture(autouse=True)
def no_worker_left_behind(request):
    """Every test ends the worker processes it started (DataLoader workers, spawned ranks). One left running is
    a bug a learner meets too: the workbook's workers ignore SIGTERM, so Python's exit, which ends leftover
    workers with it, would then wait for them forever (the test session, a kernel, a job)."""
    import multiprocessing

    yield
    deadline = time.monotonic() + 10  # a worker told to stop may take a moment to exit
    while (left := multiprocessing.active_children()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in left:
        proc.kill()  # the session goes on, and ends
    assert not left, f"{request.node.nodeid} left worker processes running: {[p.name for p in left]}"
