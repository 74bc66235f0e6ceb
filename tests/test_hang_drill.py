"""The hang drill (notebook 05, tutorial_lib/lessons/hang.py) and each rank's last words (tutorial_lib/lastwords.py):
a 2-rank gloo DDP run whose rank 1 freezes before a step fails within dist_timeout_s, and the diagnosis names
rank 1 and the collective rank 0 waited in, from the last words and from the flight recorder."""
import json
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli, tiny
from tutorial_lib import lastwords
from tutorial_lib.config import UserError
from tutorial_lib.lessons import hang

TIMEOUT_S = 3


@pytest.fixture(scope="module")
def drilled(tmp_path_factory):
    out = tmp_path_factory.mktemp("hang") / "drill"
    t0 = time.monotonic()
    report = hang.drill(tiny(out, steps=4, log_every=1), nproc=2, freeze_rank=1, at_step=2, dist_timeout_s=TIMEOUT_S)
    return report, time.monotonic() - t0, out


def test_the_frozen_rank_ends_the_run_within_dist_timeout_s(drilled):
    report, wall, _ = drilled
    assert TIMEOUT_S <= report.after_freeze_s <= TIMEOUT_S + 12  # the timeout, the 2 s grace, torchrun's teardown
    assert "rank 1 did not answer within dist_timeout_s=3 s" in report.log


def test_the_last_words_name_the_frozen_rank_and_the_collective_the_other_waited_in(drilled):
    report, _, _ = drilled
    assert report.suspects == [1]
    frozen, waiter = report.rank(1), report.rank(0)
    assert frozen["phase"] == hang.FROZEN and frozen["step_completed"] == 1  # frozen before step 2
    assert waiter["state"] == "failed" and waiter["failure"]["collective"] == "step 2"
    assert waiter["failure"]["in"] == "forward"  # DDP broadcasts the BatchNorm buffers as its forward starts
    assert waiter["failure"]["silent_ranks"] == [1] and waiter["failure"]["error"]  # gloo's words vary
    assert report.waited_in == "forward"
    assert report.verdict().startswith("rank 1 stopped answering: last completed step 1, then in 'frozen by")


def test_the_flight_recorder_names_the_rank_missing_from_the_collective(drilled):
    report, _, out = drilled
    assert sorted(p.name for p in (out / "flight_recorder").iterdir()) == ["rank_0", "rank_1"]  # gloo: both dumped
    assert report.fr_missing_ranks == [1]
    assert report.fr_collective.startswith("gloo:broadcast (sequence number ")
    assert "The flight recorder agrees" in report.verdict()


def test_the_hang_command_prints_the_same_diagnosis_with_the_three_commands(drilled):
    report, _, out = drilled
    run = cli("hang", str(out))
    assert run.returncode == 0, run.stderr
    assert report.verdict() in run.stdout
    for command in ("python -m tutorial_lib hang", "torchfrtrace", "py-spy dump --pid"):
        assert command in run.stdout
    assert f"--pid {report.rank(1)['pid']}" in run.stdout  # the frozen rank's process, from its last words


def words(rank, step, phase="backward", state="running", failure=None):
    return {"rank": rank, "world_size": 2, "host": "node1", "pid": 100 + rank, "backend": "nccl", "state": state,
            "step_completed": step, "total_steps": 10, "phase": phase, "phase_since": 1.0, "written": 3.0,
            "failure": failure}


def test_without_a_failure_on_record_the_rank_behind_the_others_is_named(tmp_path):
    """NCCL ends a timed-out rank from its own thread (no error reaches Python): the host of a waiting rank runs a
    few steps ahead of the GPU, the frozen rank stays behind."""
    (tmp_path / "ranks").mkdir()
    for w in (words(0, 7, "stop vote (all_reduce)"), words(1, 4, "data wait")):
        (tmp_path / "ranks" / f"rank{w['rank']}.json").write_text(json.dumps(w))
    report = hang.read_report(tmp_path)
    assert report.suspects == [1] and report.fr_missing_ranks is None
    assert "no collective timed out, or the flight recorder was off" in report.flight_recorder


def test_a_folder_without_last_words_is_refused_with_the_fix(tmp_path):
    with pytest.raises(UserError, match="no last words in .*ranks/rank<R>.json"):
        hang.read_report(tmp_path)


def test_a_finished_run_leaves_last_words_that_say_so(tmp_path):
    from tutorial_lib import engine

    engine.train(tiny(tmp_path / "run", steps=2, timing_warmup=0, eval=False))
    w = json.loads((tmp_path / "run" / "ranks" / "rank0.json").read_text())
    assert (w["state"], w["step_completed"], w["failure"]) == ("finished", 2, None)


def test_a_phase_an_exception_leaves_is_kept_as_where_it_failed():
    lastwords.NOW.raised_in = None
    with pytest.raises(RuntimeError):
        with lastwords.phase("backward"):
            raise RuntimeError("Timed out")
    assert lastwords.NOW.raised_in[0] == "backward" and lastwords.NOW.stack == []
    lastwords.NOW.raised_in = None


@pytest.mark.slurm
def test_the_drill_job_fails_on_the_local_slurm_and_its_folder_names_the_frozen_rank(tmp_path):
    """jobs/05_hang_drill.sbatch as notebook 05 writes it (torchrun on 2 GPUs), with CPU sizes: the job fails
    after dist_timeout_s, and `hang` on its out_dir names rank 1 and the flight recorder agrees."""
    from test_slurm import PROBLEM, finished
    from tutorial_lib import jobs
    from tutorial_lib.config import TrainConfig

    if PROBLEM is not None:
        pytest.skip(str(PROBLEM))
    out = tmp_path / "drill"
    cfg = TrainConfig(dataset="shapes", model="resnet18_imagenet", batch_size=16, steps=4, train_size=256,
                      device="cpu", parallel="ddp", dist_timeout_s=TIMEOUT_S, eval=False, tensorboard=False,
                      log_every=1, timing_warmup=1, num_workers=0, out_dir=str(out))
    path = jobs.write("t05_hang_drill", command=["python", "-m", "tutorial_lib", "drill", "--freeze-rank", "1",
                                                 "--at-step", "2", *cfg.to_overrides()],
                      gpus_per_node=2, time="00:05:00", show=False, jobs_dir=tmp_path / "jobs",
                      output=f"{tmp_path}/logs/%x-%j.out")
    job = jobs.submit(path)
    try:
        assert finished(job) == "FAILED"
    finally:
        import subprocess

        subprocess.run(["scancel", job.id], capture_output=True)
    report = hang.read_report(out)
    assert report.suspects == [1] and report.rank(1)["phase"] == hang.FROZEN
    assert report.fr_missing_ranks == [1]


def test_a_flight_recorder_reader_that_fails_is_one_line_not_its_stack(tmp_path, monkeypatch):
    """torch 2.11's torchfrtrace fails on gloo dumps with a traceback; the report says the reader failed, with its
    last line, and where the dumps are, and keeps the ranks' own diagnosis."""
    import subprocess

    from tutorial_lib.lessons import hang

    folder = tmp_path / "flight_recorder"
    folder.mkdir()
    (folder / "rank_0").write_bytes(b"x")
    stack = "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'process_group'\n"
    monkeypatch.setattr(hang.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", stack))
    report = hang.HangReport(out_dir=str(tmp_path))
    hang._read_flight_recorder(report, folder, 2)
    assert report.flight_recorder.startswith("the reader failed on these dumps (torch ")
    assert "KeyError: 'process_group'" in report.flight_recorder and "Traceback" not in report.flight_recorder
    assert str(folder) in report.flight_recorder and not report.fr_missing_ranks


def test_a_reader_that_knows_only_nccl_reads_gloos_records_under_nccls_names(drilled, monkeypatch):
    """torch 2.11's torchfrtrace stops at the first gloo record ("name formatting error? gloo != 'nccl' or
    'xccl'", as on a one-GPU server, whose drill runs on gloo); it is given the same records under NCCL's names,
    and the report names the missing rank and gloo's collective as a newer reader does, and says how it read them."""
    import subprocess

    _, _, out = drilled
    real = subprocess.run
    refused = []

    def reader_of_torch_2_11(args, **kw):
        folder = Path(args[args.index("torch.distributed.flight_recorder.fr_trace") + 1])
        if hang._renamed_gloo(sorted(folder.glob("rank_*")), None):
            refused.append(folder)
            return subprocess.CompletedProcess(args, 1, "", "Traceback (most recent call last):\n  File \"x\"\n"
                                               "AssertionError: name formatting error? gloo != 'nccl' or 'xccl'\n")
        return real(args, **kw)
    monkeypatch.setattr(hang.subprocess, "run", reader_of_torch_2_11)
    report = hang.read_report(out)
    assert refused == [out / "flight_recorder"]  # refused once, then read the renamed copies
    assert report.fr_missing_ranks == [1] and report.fr_collective.startswith("gloo:broadcast (sequence number ")
    assert "nccl:" not in report.flight_recorder
    assert report.flight_recorder.endswith("it read gloo's under NCCL's names)")
    assert "The flight recorder agrees" in report.verdict()
