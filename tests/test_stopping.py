"""How a run stops and what it leaves: stop signals sent the way Slurm sends them (to every process of the
job, DataLoader workers included), on one process and under DDP; a run that stopped at its target or on a
plateau is finished; a resumed run keeps its whole validation history and its training clock.
docs/reliability.md lists the promise each test holds."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import feed_accuracies
from tutorial_lib import data, engine, launcher

ROOT = Path(__file__).resolve().parents[1]
TINY = ["dataset=shapes", "model=resnet18_imagenet", "batch_size=8", "train_size=64", "val_size=16", "device=cpu",
        "progress=false", "tensorboard=false"]


def _start(argv: list[str], **env) -> subprocess.Popen:
    """A process in a session (and process group) of its own, as a Slurm job step's processes are."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})


def _signal_job_after(p: subprocess.Popen, marker: str, sig: signal.Signals, timeout: float = 180) -> str:
    """Read `p`'s output until a line starts with `marker`, then send `sig` to `p` and every process below it
    (what scancel and a time limit without --signal do: Slurm signals every process of the job step, and
    torchrun's ranks live in sessions of their own, so a process-group signal would miss their workers);
    return everything it printed once it has ended, and the processes signalled."""
    lines, pids = [], []
    for line in p.stdout:
        lines.append(line)
        if line.startswith(marker) or f"]:{marker}" in line:
            pids = [p.pid, *launcher._descendants(p.pid)]  # the job step: the trainer and all below it
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            break
    else:
        pytest.fail("the run ended before the signal: " + "".join(lines[-20:]))
    rest, _ = p.communicate(timeout=timeout)
    return "".join(lines) + rest, pids


def _all_gone(pids: list[int], timeout: float = 10) -> bool:
    """None of `pids` is left (the workers ended with their trainer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


# ================================================================ signals to every process of the job
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_the_whole_process_group_with_workers_running_ends_with_a_checkpoint(tmp_path, sig):
    out = tmp_path / "run"
    p = _start([sys.executable, "-m", "tutorial_lib", "train", *TINY, "steps=400", "num_workers=2", "log_every=1",
                f"out_dir={out}"], OMP_NUM_THREADS="1")
    said, pids = _signal_job_after(p, "step 3/", sig)
    assert len(pids) >= 3  # the trainer and its two workers
    assert p.returncode == engine.EXIT_PREEMPTED, said[-3000:]
    assert f"stopped by {sig.name}: checkpoint at step" in said and "Traceback" not in said, said[-3000:]
    assert 3 <= torch.load(out / "checkpoint.pt", weights_only=True)["step"] < 400
    assert _all_gone(pids), "a DataLoader worker outlived its trainer"


def test_ddp_ranks_with_workers_stop_with_a_checkpoint_on_sigterm_to_the_group(tmp_path):
    out = tmp_path / "ddp"
    p = _start([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                "tutorial_lib", "train", *TINY, "parallel=ddp", "steps=400", "num_workers=1", "log_every=2",
                "train_size=256",  # 16 steps an epoch: the workers are running when the signal comes
                f"out_dir={out}"], OMP_NUM_THREADS="1")
    said, pids = _signal_job_after(p, "step 4/", signal.SIGTERM)
    assert len(pids) >= 5  # torchrun, two ranks, a worker each
    assert "stopped by SIGTERM: checkpoint at step" in said, said[-3000:]
    assert "DataLoader worker" not in said and "is killed by signal" not in said, said[-3000:]
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert 4 <= state["step"] < 400 and state["world_size"] == 2
    assert _all_gone(pids)


def test_a_signal_that_reaches_a_worker_before_its_first_line_is_held_until_the_worker_ignores_it(tmp_path,
                                                                                               monkeypatch):
    """The job's signal can land between the fork of a worker and the moment it ignores the signal: the
    parent forks with the stop signals blocked, so the worker holds it until it ignores it."""
    from conftest import tiny

    ignore = data.worker_init

    def signalled_first(worker_id):  # the signal arrives before the worker's own set-up has run
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        ignore(worker_id)
    monkeypatch.setattr(data, "worker_init", signalled_first)
    cfg = tiny(tmp_path / "run", num_workers=2, train_size=64, batch_size=8)
    batches = list(data.build_input(cfg, "train").epoch(0))
    assert len(batches) == 8


STOP_AT = """
import sys
from tutorial_lib import engine
from tutorial_lib.__main__ import main

step = engine.Run.train_step


def train_step(self, x, y):  # rank 1 sees a stop signal during step 26
    if self.step == 25 and self.env.rank == 1:
        self.stop_requested, self.stop_signal = True, "SIGUSR1"
    return step(self, x, y)


engine.Run.train_step = train_step
sys.exit(main(["train", *sys.argv[1:]]))
"""


def test_ddp_stops_at_the_first_log_step_after_the_signal(tmp_path):
    """The ranks agree to stop at a log_every step, and they reach that agreement without stopping the device: the
    vote is cast one step before each log step and read at it. A signal seen by one rank during step 26 stops
    every rank at step 40 with log_every=20 (it stopped at 60: the vote cast at 40 was read at 60)."""
    out = tmp_path / "ddp"
    (tmp_path / "stop_at.py").write_text(STOP_AT)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(tmp_path / "stop_at.py"), *TINY, "parallel=ddp", "steps=400", "num_workers=0",
                        "log_every=20", "train_size=256", "eval=false", f"out_dir={out}"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "checkpoint at step 40 " in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 40


# ================================================================ finished runs, and what a resumed run keeps
EARLY = dict(steps=12, eval_every=1, ckpt_every=12)  # a validation pass after every step, a checkpoint at the end
# The validation accuracies the runs below are fed, one a pass: where a tiny run's own accuracies go depends on the
# CPU (its kernels, its threads), so a test of stopping feeds the history it needs
FED = [0.10, 0.20, 0.15, 0.18, 0.20, 0.25, 0.30, 0.10, 0.10, 0.10, 0.10, 0.10]
STOPS = [(dict(patience=3), 5, "patience"),  # the passes at steps 3, 4, 5 find nothing above 0.20 (equal is not better)
         (dict(target_accuracy=0.25), 6, "target_accuracy"),  # the first pass at the target, reached exactly
         (dict(target_accuracy=0.3, patience=3), 5, "patience"),  # whichever comes first
         (dict(patience=4), 11, "patience")]  # the best, 0.30 at step 7, then four passes without a better one


@pytest.mark.parametrize("how, stop_step, why", STOPS,
                         ids=["patience", "target_accuracy", "both", "patience_after_gain"])
def test_a_run_stopped_early_is_finished_and_keeps_its_result(tiny_cfg, monkeypatch, capsys, how, stop_step, why):
    fed = feed_accuracies(monkeypatch, FED)
    cfg = tiny_cfg(**EARLY, **how)
    first = engine.train(cfg)
    assert first.steps == stop_step and first.stopped_by == why, (first.steps, first.stopped_by)
    assert [(step, acc) for step, _, acc in first.val_history] == list(enumerate(FED[:stop_step], 1))
    assert first.val_accuracy == FED[stop_step - 1] and len(fed) == stop_step  # no pass after the stop
    assert "stopping" in capsys.readouterr().out
    saved = (Path(cfg.out_dir) / "result.json").read_bytes()
    for again in (cfg, cfg.replace(steps=40)):  # the same command, and a longer one: nothing more to train
        kept = engine.train(again)
        assert "holds a finished run" in capsys.readouterr().out
        assert kept.steps == stop_step and kept.val_history == first.val_history
        assert (Path(cfg.out_dir) / "result.json").read_bytes() == saved
    assert len(fed) == stop_step  # a finished run validates nothing again


def test_a_run_whose_accuracy_keeps_rising_runs_all_its_steps(tiny_cfg, monkeypatch):
    feed_accuracies(monkeypatch, [0.1 + 0.05 * i for i in range(12)])
    r = engine.train(tiny_cfg(**EARLY, patience=3, target_accuracy=0.9))
    assert r.steps == EARLY["steps"] and r.stopped_by == "steps" and len(r.val_history) == 12


def test_patience_is_checked_and_documented(tiny_cfg):
    from tutorial_lib import config, jobs

    with pytest.raises(config.ConfigError, match="patience=-1 must be >= 0"):
        config.TrainConfig(patience=-1)
    for bad, message in ((dict(patience=2), "patience=2 needs eval_every > 0"),
                         (dict(patience=2, eval_every=20, steps=10), "no validation pass within the run"),
                         (dict(target_accuracy=0.5, eval_every=20, steps=10), "no validation pass within the run")):
        with pytest.raises(config.UserError, match=message):
            jobs.render("t_patience", config.TrainConfig(**bad))  # refused at render time, not in the queue
        with pytest.raises(config.ConfigError, match=message):
            engine.train(tiny_cfg(**bad))  # and before the first step
    assert "without a better validation accuracy" in config.key_help()["patience"][2]


def test_target_accuracy_with_epochs_is_checked_against_the_run_length(tiny_cfg):
    cfg = tiny_cfg(steps=None, epochs=1, train_size=64, batch_size=16, eval_every=5, target_accuracy=0.5)
    with pytest.raises(engine.ConfigError, match="eval_every=5: the run has 4 steps"):
        engine.train(cfg)


def test_a_resumed_run_keeps_its_whole_validation_history_and_its_clock(tiny_cfg, tmp_path):
    from conftest import interrupted_at

    kw = dict(steps=12, eval_every=2, val_size=64)
    straight = engine.train(tiny_cfg(out_dir=tmp_path / "straight", **kw))
    cfg = tiny_cfg(**kw)
    interrupted_at(cfg, 7)
    before = torch.load(Path(cfg.out_dir) / "checkpoint.pt", weights_only=True)
    assert [h[0] for h in before["val_history"]] == [2, 4, 6]
    resumed = engine.train(cfg)
    assert resumed.resumed_from_step == 7 and resumed.loss == straight.loss
    assert [(s, a) for s, _, a in resumed.val_history] == [(s, a) for s, _, a in straight.val_history]
    assert resumed.val_history[:3] == before["val_history"]  # the points before the interruption, as they were
    seconds = [t for _, t, _ in resumed.val_history]
    assert seconds == sorted(seconds) and seconds[3] > seconds[2]  # counted on from the original start
    assert before["clock"]["seconds"] >= seconds[2] and resumed.wall_time_s > before["clock"]["wall_s"]
