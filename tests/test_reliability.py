"""Faults and bad input (issue 13): nothing runs that shouldn't, nothing is lost, no silent wrong result, and
every mistake ends in one line that names the value and the fix. One test per class, over many inputs.
docs/reliability.md lists the promise each test holds."""
from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import tiny
from tutorial_lib import config, distributed, engine, jobs, sites, slurm, tensorboard
from tutorial_lib.__main__ import main
from tutorial_lib.checkpoint import OutDirLock, write_checkpoint
from tutorial_lib.config import ConfigError, DataNotFound, TrainConfig, UserError

ROOT = Path(__file__).resolve().parents[1]
GENERIC = (ROOT / "tutorial_lib" / "sites" / "generic.yaml").read_text()


def one_line_error(argv, capsys) -> str:
    """Run the CLI in this process; it must fail with exit code 2 and one line on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run of 4 steps with checkpoints, finished: its out_dir holds checkpoint.pt and result.json."""
    out = tmp_path_factory.mktemp("finished") / "run"
    cfg = tiny(out, steps=4, ckpt_every=2, val_size=16)
    engine.train(cfg)
    return cfg


# ================================================================ code that runs when it shouldn't
CONTROL = ["\n", "\r", "\x1b[2J", "\x00", "\x7f", "\x0b"]


def _site_with_description(tmp_path, text):
    path = tmp_path / "mysite.yaml"
    path.write_text(GENERIC.replace('description: "any Slurm cluster: GPUs as --gpus-per-node, no account"',
                                    f"description: {json.dumps(text)}"))
    return str(path)


@pytest.mark.parametrize("char", CONTROL)
@pytest.mark.parametrize("where", ["description", "sweep value", "sweep key", "out_dir", "data_dir",
                                   "command", "site description", "point"])
def test_control_characters_never_reach_a_job_file(tmp_path, where, char):
    payload = f"x{char}touch /tmp/pwned"
    cfg = TrainConfig(steps=2)
    kw = {"description": dict(cfg=cfg, description=payload),
          "sweep value": dict(cfg=cfg, sweep={"out_dir": ["a", payload]}),
          "sweep key": dict(cfg=cfg, sweep={payload: [1]}),
          "point": dict(cfg=cfg, sweep=[{"data_dir": payload}]),
          "command": dict(command=["python", "-c", payload]),
          "site description": dict(cfg=cfg, site=_site_with_description(tmp_path, payload))}
    with pytest.raises(UserError, match="control character|unknown key"):
        if where in ("out_dir", "data_dir"):
            cfg = cfg.replace(**{where: payload})  # the config refuses it before any job sees it
        jobs.write("demo", **kw.get(where, dict(cfg=cfg)), jobs_dir=tmp_path / "jobs", show=False)
    assert not (tmp_path / "jobs" / "demo.sbatch").exists()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "code ran"))


@pytest.mark.parametrize("how", ["top level", "inside a valid-looking checkpoint", "as the model state"])
def test_a_crafted_checkpoint_runs_no_code(finished_run, tmp_path, how):
    marker = tmp_path / "ran"
    out = tmp_path / "run"
    out.mkdir()
    good = torch.load(Path(finished_run.out_dir) / "checkpoint.pt", weights_only=True)  # ours load safely
    evil = {"top level": _Payload(marker), "inside a valid-looking checkpoint": {**good, "extra": _Payload(marker)},
            "as the model state": {**good, "model": _Payload(marker)}}[how]
    with open(out / "checkpoint.pt", "wb") as f:
        pickle.dump(evil, f, protocol=2)
    with pytest.raises(UserError, match="resume=false"):
        engine.train(finished_run.replace(out_dir=str(out)))
    assert not marker.exists()


@pytest.fixture
def tb_state(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard, "STATE", tmp_path / "state.json")
    return tmp_path


@pytest.mark.parametrize("argv", [["sleep", "60"],
                                  [sys.executable, "-c", "import time; time.sleep(60)", "tensorboard"],
                                  [sys.executable, "-c", "import time; time.sleep(60)", "tensorboard", "--logdir",
                                   "/elsewhere", "--port", "6006"]])
def test_tensorboard_stop_never_signals_a_process_it_did_not_start(tb_state, argv):
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        record = tensorboard.TensorBoard(proc.pid, 6006, str(tb_state / "runs"))
        tensorboard._save([record])  # a stale record whose PID now belongs to someone else
        assert tensorboard.stop() == 0
        assert tensorboard.stop(record) == 0
        time.sleep(0.2)
        assert proc.poll() is None  # still running
        assert tensorboard._records() == []  # and the stale record is gone
    finally:
        proc.kill()
        proc.wait()


# ================================================================ nothing lost
def test_a_finished_run_is_kept_extended_or_redone_only_when_asked(finished_run, capsys):
    result = Path(finished_run.out_dir) / "result.json"
    before = result.read_bytes()
    again = engine.train(finished_run)
    assert result.read_bytes() == before and again.steps == 4 and again.throughput_img_s > 0
    assert "finished run" in capsys.readouterr().out
    assert main(["train", *finished_run.to_overrides()]) == 0  # the same command, from a shell
    assert "kept" in capsys.readouterr().out and result.read_bytes() == before


def _signal_at(monkeypatch, phase, sig):
    """Send `sig` to this process during `phase` of a run."""
    def send():
        os.kill(os.getpid(), sig)
    if phase == "set-up":
        build = engine.models.build
        monkeypatch.setattr(engine.models, "build", lambda *a: (send(), build(*a))[1])
    elif phase == "step 2":
        step = engine.Run.train_step
        monkeypatch.setattr(engine.Run, "train_step",
                            lambda self, x, y: (self.step == 1 and send(), step(self, x, y))[1])
    elif phase == "final evaluation":
        prepare = engine.Run.prepare
        monkeypatch.setattr(engine.Run, "prepare",
                            lambda self, x, y: (not self.model.training and send(), prepare(self, x, y))[1])


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
@pytest.mark.parametrize("phase,step", [("set-up", 0), ("step 2", 2), ("final evaluation", 3)])
def test_a_stop_signal_anywhere_ends_with_a_checkpoint_and_the_rerun_finishes(tmp_path, monkeypatch, capsys,
                                                                              sig, phase, step):
    cfg = tiny(tmp_path / "run", steps=3, val_size=16, log_every=1)
    with monkeypatch.context() as m:
        _signal_at(m, phase, sig)
        with pytest.raises(engine.Preempted):
            engine.train(cfg)
    assert f"stopped by {sig.name}: checkpoint at step {step}" in capsys.readouterr().out
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["step"] == step
    assert not (tmp_path / "run" / "result.json").exists()
    done = engine.train(cfg)
    assert done.steps == 3 and done.resumed_from_step == step and len(done.loss) == 3
    assert done.val_accuracy is not None and done.step_time_ms["timed_steps"] >= 1


@pytest.mark.parametrize("where", ["during the validation pass", "in the step before it"])
def test_a_stop_signal_near_a_validation_pass_loses_no_point_of_val_history(tmp_path, monkeypatch, where):
    """A stop during the pass at step 4 (or at step 4, before its pass) left a checkpoint at step 4 without that
    point, and the resumed run went on from step 5: val_history had lost it."""
    kw = dict(steps=6, eval_every=2, val_size=32, log_every=1)
    straight = engine.train(tiny(tmp_path / "straight", **kw))
    cfg = tiny(tmp_path / "run", **kw)
    with monkeypatch.context() as m:
        if where == "during the validation pass":
            prepare = engine.Run.prepare
            m.setattr(engine.Run, "prepare", lambda self, x, y: (
                not self.model.training and self.step == 4 and os.kill(os.getpid(), signal.SIGUSR1),
                prepare(self, x, y))[1])
        else:
            step = engine.Run.train_step
            m.setattr(engine.Run, "train_step", lambda self, x, y: (
                self.step == 3 and os.kill(os.getpid(), signal.SIGUSR1), step(self, x, y))[1])
        with pytest.raises(engine.Preempted):
            engine.train(cfg)
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert saved["step"] == 4 and [h[0] for h in saved["val_history"]] == [2]
    resumed = engine.train(cfg)
    assert resumed.resumed_from_step == 4 and resumed.loss == straight.loss
    assert [(s, a) for s, _, a in resumed.val_history] == [(s, a) for s, _, a in straight.val_history]
    assert resumed.val_history[1][1] == round(saved["clock"]["seconds"], 4)  # done again at the stop's seconds
    seconds = [t for _, t, _ in resumed.val_history]
    assert seconds == sorted(seconds)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_cli_exits_3_on_a_stop_signal(tmp_path, sig):
    args = [sys.executable, "-m", "tutorial_lib", "train", "dataset=shapes", "model=resnet18_imagenet",
            "steps=400", "batch_size=8", "train_size=64", "device=cpu", "num_workers=0", "progress=false",
            "log_every=1", "tensorboard=false", f"out_dir={tmp_path}/run"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("step 2/"):
            p.send_signal(sig)
            break
    out, err = p.communicate(timeout=120)
    assert p.returncode == engine.EXIT_PREEMPTED, err
    assert 2 <= torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["step"] < 400


@pytest.mark.parametrize("missing", ["val", "train"])
def test_every_input_is_checked_before_the_first_step(tmp_path, monkeypatch, missing):
    from tutorial_lib.imagefolder import write_imagefolder

    write_imagefolder(tmp_path / "data" / "imagefolder", train_size=32, val_size=16, processes=1)
    import shutil
    shutil.rmtree(tmp_path / "data" / "imagefolder" / missing)
    monkeypatch.setattr(engine.Run, "train_step", lambda *a: pytest.fail("a step ran"))
    with pytest.raises(DataNotFound, match=f"'{missing}' split is missing"):
        engine.train(tiny(tmp_path / "run", dataset="imagefolder", data_dir=str(tmp_path / "data"), train_size=32))


def test_a_second_run_on_the_same_out_dir_is_refused(tmp_path, monkeypatch):
    cfg = tiny(tmp_path / "run", steps=2)
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(engine.Run, "train_step", lambda *a: pytest.fail("a step ran"))
    with OutDirLock(tmp_path / "run"):  # the first run
        with pytest.raises(UserError, match=f"in use by another run \\(pid {os.getpid()} on "):
            engine.train(cfg)
    assert not list((tmp_path / "run").glob(".checkpoint.pt.*"))


CHANGES = [dict(lr=0.01), dict(seed=1), dict(train_size=128), dict(augment=False), dict(lr_schedule="constant"),
           dict(warmup_steps=2), dict(optimizer="sgd"), dict(weight_decay=0.0), dict(momentum=0.5),
           dict(batch_size=8), dict(precision="bf16"), dict(model="resnet18"), dict(lr=1.0),
           dict(seed=2, lr=0.5, augment=False), dict(loader="gpu_resident")]


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: ",".join(c))
def test_resume_names_every_field_that_changes_the_run(finished_run, change):
    saved = finished_run.to_dict()
    differ = config.resume_differences(saved, finished_run.replace(**change))
    changed = {k for k, v in change.items() if saved[k] != v}
    assert {d.split("=")[0] for d in differ} == changed


@pytest.mark.parametrize("change", [dict(steps=8), dict(log_every=1), dict(num_workers=1), dict(progress=True),
                                    dict(tensorboard=True), dict(eval=False), dict(ckpt_every=0)], ids=str)
def test_resume_accepts_what_may_change(finished_run, change):
    assert config.resume_differences(finished_run.to_dict(), finished_run.replace(**change)) == []


def test_resume_refuses_a_changed_run_naming_each_field(finished_run):
    with pytest.raises(ConfigError, match=r"lr=0.002 \(now 0.1\); seed=0 \(now 7\).*resume=false"):
        engine.train(finished_run.replace(lr=0.1, seed=7))


@pytest.mark.parametrize("fault", ["tmpfs full", "ENOSPC", "EDQUOT", "torch iostream error"])
def test_a_failed_checkpoint_write_keeps_the_old_one_and_says_why(tmp_path, monkeypatch, fault):
    folder = tmp_path / "out"
    folder.mkdir()
    if fault == "tmpfs full":
        if os.geteuid() != 0:
            pytest.skip("mounting a 1 MB tmpfs needs root")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)]).returncode:
            pytest.skip("mount -t tmpfs is not allowed here")
    try:
        (folder / "checkpoint.pt").write_bytes(b"the previous checkpoint")
        state = {"model": torch.zeros(1 << 20)}  # 4 MB: more than the tmpfs holds
        if fault != "tmpfs full":
            err = (RuntimeError("[enforce fail at inline_container.cc:659] . unexpected pos 64 vs 0")
                   if fault == "torch iostream error" else OSError(getattr(errno, fault), os.strerror(getattr(errno, fault))))

            def failing_save(obj, f, *a, **k):
                f.write(b"half")
                raise err
            monkeypatch.setattr(torch, "save", failing_save)
        expected = {"tmpfs full": "no space left on", "ENOSPC": "no space left on", "EDQUOT": "disk quota exceeded",
                    "torch iostream error": "could not write the checkpoint"}[fault]
        with pytest.raises(UserError, match=expected) as e:
            write_checkpoint(state, folder / "checkpoint.pt")
        assert "previous checkpoint" in str(e.value) and str(folder) in str(e.value)
        assert (folder / "checkpoint.pt").read_bytes() == b"the previous checkpoint"
        assert not list(folder.glob(".checkpoint.pt.*"))  # the partial file is removed
    finally:
        if fault == "tmpfs full":
            subprocess.run(["umount", "-l", str(folder)])  # lazily: torch may still hold the partial file


def _fill(folder: Path) -> Path:
    """Fill the file system of `folder` to the last byte; returns the filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 16, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


class _FullDisk:
    """A file whose first write fails as on a full disk (`code`: ENOSPC or EDQUOT), after a few bytes."""

    def __init__(self, f, code):
        self.f, self.code = f, code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[:10])
        raise OSError(self.code, os.strerror(self.code))


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MB tmpfs (root only): a real full disk."""
    folder = tmp_path / "small"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)]).returncode:
        pytest.skip("mount -t tmpfs is not allowed here")
    yield folder
    subprocess.run(["umount", "-l", str(folder)])


def _full_at_finish(monkeypatch, out: Path) -> None:
    """Fill the disk of `out` when the run has trained and is about to write its result."""
    finish = engine.Run.finish
    monkeypatch.setattr(engine.Run, "finish", lambda self, *a: (_fill(out), finish(self, *a))[1])


@pytest.mark.parametrize("fault", ["ENOSPC", "EDQUOT"])
def test_a_full_disk_when_result_json_is_written_keeps_the_trained_run(tmp_path, monkeypatch, capsys, fault):
    """The default ckpt_every=0 keeps no checkpoint: when result.json can't be written, the trained run goes into
    one, and the same command then writes result.json without training again."""
    from tutorial_lib import results

    cfg = tiny(tmp_path / "run", steps=4, val_size=16)
    fresh = results.fresh_file

    def full_for_the_result(path):
        f, tmp = fresh(path)
        return (_FullDisk(f, getattr(errno, fault)) if path.name == "result.json" else f), tmp
    with monkeypatch.context() as m:
        m.setattr(results, "fresh_file", full_for_the_result)
        with pytest.raises(UserError) as e:
            engine.train(cfg)
    assert not list((tmp_path / "run").glob(".result.json.*"))  # no partial file left
    message = str(e.value)
    assert "\n" not in message and str(tmp_path / "run") in message and "result.json" in message
    assert ("no space left on" if fault == "ENOSPC" else "disk quota exceeded on") in message
    assert "checkpoint at step 4" in message and "run the same command again" in message
    capsys.readouterr()
    again = engine.train(cfg)
    assert again.steps == 4 and again.resumed_from_step == 4 and len(again.loss) == 4  # nothing trained again
    assert "holds a finished run (4 steps) whose result.json is missing" in capsys.readouterr().out
    assert (tmp_path / "run" / "result.json").is_file()


def test_a_really_full_disk_at_the_end_of_a_run_is_one_line_and_leaves_no_partial_file(small_tmpfs, monkeypatch):
    out = small_tmpfs / "run"
    cfg = tiny(out, steps=2, val_size=16, model="mnist_cnn", dataset="mnist")  # a small checkpoint, still too big
    monkeypatch.setattr(engine.data, "base_dataset", _fake_mnist)
    _full_at_finish(monkeypatch, out)
    with pytest.raises(UserError) as e:
        engine.train(cfg)
    message = str(e.value)
    assert "\n" not in message and f"no space left on {out}" in message and "could not be saved" in message
    assert sorted(p.name for p in out.iterdir() if p.name != "ranks") == [".lock", "filler"]  # no result, checkpoint
    assert not list(out.rglob("*.tmp"))  # nor a partial file (ranks/: the last words, each written whole, or none)


def _fake_mnist(cfg, split):
    """MNIST-shaped images without the files (the tmpfs is too small for anything else)."""
    import numpy as np

    from tutorial_lib.data import ArrayImages

    n = cfg.train_size if split == "train" else cfg.val_size
    rng = np.random.default_rng(0)
    return ArrayImages(rng.integers(0, 255, (n, 28, 28, 1), dtype=np.uint8), rng.integers(0, 10, n))


@pytest.mark.parametrize("where", ["writer", "tensorboard.start"])
def test_a_full_disk_for_tensorboard_is_one_line(small_tmpfs, tb_state, where):
    (small_tmpfs / "run").mkdir()  # the run's folder exists: the event file is what can't be written
    _fill(small_tmpfs)
    expected = "TensorBoard can't write its event file into .*no space left on .*tensorboard=false" \
        if where == "writer" else f"TensorBoard .*no space left on {small_tmpfs}"
    with pytest.raises(UserError, match=expected) as e:
        if where == "writer":
            engine.train(tiny(small_tmpfs / "run", steps=2, tensorboard=True))
        else:
            tensorboard.start(small_tmpfs / "runs")
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- links planted in out_dir
PLANTED = [".lock", "checkpoint.pt.tmp", ".result.json.{pid}.tmp", "result.json", "tb"]  # {pid}: this process's


@pytest.mark.parametrize("name", PLANTED)
@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_link_planted_in_out_dir_never_makes_the_run_write_through_it(tmp_path, name, kind):
    """In a shared, group-writable runs folder anyone may create files in your out_dir: a link named like a file the
    run writes must not make the run overwrite what it points to. The lock refuses links; every other file is
    written as a fresh file under a random name, then renamed over the name (which replaces a link, not its
    target)."""
    name = name.format(pid=os.getpid())  # the run trains in this process (ids are the same in every xdist worker)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "run"
    out.mkdir()
    if name == "tb":
        if kind == "hard link":
            pytest.skip("folders have no hard links")
        (out / name).symlink_to(tmp_path, target_is_directory=True)
    elif kind == "symlink":
        (out / name).symlink_to(victim)
    else:
        os.link(victim, out / name)
    cfg = tiny(out, steps=4, ckpt_every=2, val_size=16, tensorboard=True)
    if name == ".lock":
        with pytest.raises(UserError, match=r"\.lock is a (symbolic|hard) link.*remove it"):
            engine.train(cfg)
    else:
        engine.train(cfg)
        assert (out / "result.json").is_file() and not (out / "result.json").is_symlink()
    assert victim.read_text() == "precious"
    assert not list(out.glob(".*.tmp")) or name.endswith(".tmp")  # no temporary file of ours left behind


def test_tensorboard_start_never_writes_its_log_through_a_planted_link(tmp_path, tb_state):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    logdir = tmp_path / "runs"
    logdir.mkdir()
    (logdir / ".tensorboard.log").symlink_to(victim)
    tb = tensorboard.start(logdir)
    try:
        assert victim.read_text() == "precious" and not (logdir / ".tensorboard.log").is_symlink()
    finally:
        tensorboard.stop(tb)


# ================================================================ no silent wrong results
@pytest.mark.parametrize("override,key,value", [
    ("out_dir=runs/exp #1", "out_dir", "runs/exp #1"), ("out_dir=no", "out_dir", "no"),
    ("data_dir=12:30", "data_dir", "12:30"), ("out_dir=0x1F", "out_dir", "0x1F"), ("out_dir=null", "out_dir", "null"),
    ("out_dir=true", "out_dir", "true"), ("out_dir= runs/a ", "out_dir", " runs/a "), ("data_dir=~", "data_dir", "~"),
    ("eval=no", "eval", False), ("eval=off", "eval", False), ("eval=True", "eval", True), ("augment=0", "augment", False),
    ("steps=null", "steps", None), ("steps=+12", "steps", 12), ("lr=1e-3", "lr", 0.001), ("lr=.5", "lr", 0.5),
    ("batch_size=064", "batch_size", 64), ("train_size=10000", "train_size", 10000)])
def test_override_text_is_read_by_the_fields_type(override, key, value):
    assert getattr(config.load(None, [override]), key) == value


@pytest.mark.parametrize("override,message", [
    ("steps=12:30", "not a valid int"), ("steps=0x1F", "not a valid int"), ("steps=1e3", "not a valid int"),
    ("steps=", "steps= is empty"), ("out_dir=", "out_dir= is empty"), ("lr= ", "lr= is empty"),
    ("steps=[1]", "not a valid int"), ("eval=maybe", "not a valid bool"), ("lr=fast", "not a valid float"),
    ("lr=inf", "not a finite number"), ("lr=nan", "not a finite number"), ("weight_decay=nan", "not a finite"),
    ("lr=0", "must be > 0"), ("lr=-1", "must be > 0"), ("weight_decay=-0.1", "must be >= 0"),
    ("momentum=-0.1", r"in \[0, 1\)"), ("momentum=1", r"in \[0, 1\)"), ("seed=-1", r"2\*\*63"),
    ("seed=9223372036854775808", r"2\*\*63"), ("num_workers=null", "None is not allowed"),
    ("dist_timeout_s=0", "positive integer"), ("batch_size=1.5", "not a valid int"),
    ("steps=²", r"steps='²' is not a valid int; give a whole number in decimal digits"), ("seed=٣", "not a valid int"),
    ("num_workers=²", "auto or an integer"), ("eval=２", "not a valid bool")])
def test_bad_override_values_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        config.load(None, [override])


@pytest.mark.parametrize("key", ["train_size", "val_size"])
def test_a_synthetic_set_too_large_for_memory_is_one_line(tmp_path, capsys, key):
    """train_size=99999999999999999999 passed the checks, then the set made in memory ended in a MemoryError."""
    err = one_line_error(["train", *tiny(tmp_path / "run", **{key: 10**20}).to_overrides()], capsys)
    assert f"{key}={10**20}: the shapes set of" in err and f"does not fit in this machine's memory; lower {key}" in err


@pytest.mark.parametrize("kw,key,value", [
    (dict(eval="false"), "eval", False), (dict(eval="true"), "eval", True), (dict(augment=0), "augment", False),
    (dict(lr="1e-3"), "lr", 0.001), (dict(lr=1), "lr", 1.0), (dict(steps="40"), "steps", 40),
    (dict(steps=40.0), "steps", 40), (dict(out_dir=Path("runs/p")), "out_dir", "runs/p"),
    (dict(num_workers="3"), "num_workers", 3)])
def test_python_api_coerces_like_the_command_line(kw, key, value):
    cfg = TrainConfig(**kw)
    assert getattr(cfg, key) == value and type(getattr(cfg, key)) is type(value)


@pytest.mark.parametrize("kw,message", [
    (dict(num_workers=None), "num_workers=None is not allowed"), (dict(eval="sometimes"), "not a valid bool"),
    (dict(lr="fast"), "not a valid float"), (dict(lr=float("inf")), "finite"), (dict(steps=2.5), "not a valid int"),
    (dict(batch_size=True), "not a valid int"), (dict(out_dir=["a"]), "not a valid str"), (dict(seed=2**63), "2"),
    (dict(eval=2), "not a valid bool"), (dict(momentum=float("nan")), "finite")])
def test_python_api_refuses_what_the_command_line_refuses(kw, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**kw)


def test_a_field_set_after_construction_is_checked_before_the_run(tmp_path):
    cfg = tiny(tmp_path / "run")
    cfg.eval = "false"
    cfg.validate()
    assert cfg.eval is False
    cfg.lr = float("nan")
    with pytest.raises(ConfigError, match="finite"):
        engine.train(cfg)


@pytest.mark.parametrize("values,last,bad,precision", [([1.0, float("nan")], 4, 4, "fp32"),
                                                      ([float("inf"), 2.0], 4, 3, "bf16"),
                                                      ([1.0, 2.0, float("-inf")], 5, 5, "fp16"),
                                                      ([float("nan")] * 3, 30, 28, "fp32")])
def test_a_non_finite_loss_stops_the_run_naming_the_step_and_the_cause(tmp_path, values, last, bad, precision):
    from tutorial_lib import watch

    run = engine.Run.__new__(engine.Run)  # only what check_finite reads: fp16 can't be built on a CPU
    run.cfg, run.batch_size, run.env = tiny(tmp_path / "run"), 16, distributed.DistEnv()
    run.cfg.precision = precision
    with pytest.raises(engine.NonFiniteLoss, match=f"at step {bad}: the learning rate lr=0.002 is likely too high "
                                                   f"for batch size 16 at precision={precision}") as e:
        watch.check_finite(run, last, values)
    assert ("fp16 overflow" in str(e.value)) == (precision == "fp16")
    watch.check_finite(run, last, [1.0, 0.5])  # finite losses pass


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_loss_not_finite_at_step_1_is_not_blamed_on_the_learning_rate(tmp_path, precision):
    """Step 1's loss comes from the weights the run started with: no update, no learning rate, has touched them."""
    from tutorial_lib import watch

    run = engine.Run.__new__(engine.Run)
    run.cfg, run.batch_size, run.env = tiny(tmp_path / "run", precision=precision), 16, distributed.DistEnv()
    with pytest.raises(engine.NonFiniteLoss) as e:
        watch.check_finite(run, 2, [float("nan"), 1.0])
    said = str(e.value)
    assert said.startswith("the loss became nan at step 1, before any weight update, so the learning rate is not "
                           "the cause: the model's output or the loss") and "lower lr" not in said
    assert ("fp16 overflow in the forward pass" in said) == (precision == "fp16")


def test_a_model_whose_output_is_nan_from_the_start_is_named_at_step_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(engine.Run, "criterion", lambda self, out, y: (out * float("nan")).sum())
    with pytest.raises(engine.NonFiniteLoss, match="at step 1, before any weight update"):
        engine.train(tiny(tmp_path / "run", steps=4, log_every=2, eval=False))


def test_a_diverging_run_stops_with_a_one_line_error(tmp_path, capsys):
    err = one_line_error(["train", *tiny(tmp_path / "run", steps=6, optimizer="sgd", lr=1e30,
                                          weight_decay=0.0).to_overrides(), "eval=false"], capsys)
    assert "the loss became" in err and "lower lr" in err
    assert not (tmp_path / "run" / "result.json").exists()


STALL = """
import os, sys, time
from tutorial_lib import distributed
from tutorial_lib.config import UserError
os.environ.update(RANK=sys.argv[1], WORLD_SIZE="2", LOCAL_RANK=sys.argv[1], MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=sys.argv[2])
env = distributed.setup("ddp", "cpu", timeout_s=3)
if env.rank == 1:
    time.sleep(12)  # a stalled rank: it answers nothing for longer than the timeout
    sys.exit(0)
t0 = time.time()
try:
    distributed.any_rank(False, env)
except UserError as e:
    print("USERERROR", round(time.time() - t0, 1), e)
"""


def test_a_stalled_rank_is_named_after_dist_timeout_s(tmp_path):
    script = tmp_path / "stall.py"
    script.write_text(STALL)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), port], stdout=subprocess.PIPE, text=True,
                              env=env) for r in (0, 1)]
    out = ranks[0].communicate(timeout=90)[0]
    ranks[1].kill()
    _, waited, message = next(l for l in out.splitlines() if l.startswith("USERERROR")).split(" ", 2)
    assert message.startswith("rank 0: all_reduce (stop check) failed: rank 1 did not answer within "
                              "dist_timeout_s=3 s")
    assert float(waited) < 11  # the timeout and a short grace, not the 12 s of the stalled rank


@pytest.mark.parametrize("line,message", [
    ('max_time: 48:00:00', 'quote it: max_time: "48:00:00"'), ('max_time: 2:00', 'quote it: max_time: "00:02:00"'),
    ('default_time: 1:00:00', 'quote it: default_time: "01:00:00"'), ("gpus_per_node: true", "gpus_per_node=True"),
    ("gpus_per_node: 0", "positive integer"), ("max_nodes: 2.5", "positive integer"),
    ("account_required: maybe", "true or false"), ("description: [a, b]", "must be text"),
    ('shell: "/bin/bash\\nrm -rf ~"', "control character")])
def test_site_profile_values_are_checked_with_the_fix(tmp_path, line, message):
    key = line.split(":")[0]
    text = "\n".join(line if l.startswith(key + ":") else l for l in GENERIC.splitlines())
    (tmp_path / "mine.yaml").write_text(text)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")):
        sites.load_site(str(tmp_path / "mine.yaml"))


@pytest.mark.parametrize("text", ["- description: a\n- partition: b\n", "just text\n", "42\n"])
def test_a_site_profile_that_is_not_a_mapping_is_refused(tmp_path, text):
    (tmp_path / "mine.yaml").write_text(text)
    with pytest.raises(UserError, match="must be a mapping"):
        sites.load_site(str(tmp_path / "mine.yaml"))


@pytest.mark.parametrize("array", ["5-2", "0-3,9-4", "10-1%2", "7-6:2"])
def test_a_backwards_array_range_is_refused(tmp_path, array):
    with pytest.raises(UserError, match="runs backwards"):
        jobs.render("demo", command="true", array=array)


@pytest.mark.parametrize("record", ["{not json", '"a string"', '{"name": "x"}', "", "[1, 2]"])
def test_a_damaged_render_record_is_a_one_line_error(tmp_path, record, capsys):
    (tmp_path / "bad.sbatch").write_text(f"#!/bin/bash\n{jobs.RENDER_MARK}{record}\n")
    err = one_line_error(["jobs", "check", "--jobs-dir", str(tmp_path)], capsys)
    assert "damaged" in err and "bad.sbatch" in err


@pytest.mark.parametrize("folder", ["no-such-folder", "jobs/01_single_gpu.sbatch"])
def test_jobs_check_of_a_missing_folder_fails(folder, capsys):
    err = one_line_error(["jobs", "check", "--jobs-dir", str(ROOT / folder)], capsys)
    assert "does not exist" in err


# ---------------------------------------------------------------- quiet mismatches (issue of the stop signals)
def test_a_checkpoint_past_the_runs_length_is_refused_with_both_fixes(finished_run):
    with pytest.raises(ConfigError, match=r"holds a run at step 4, past steps=2: .*steps >= 4.*resume=false"):
        engine.train(finished_run.replace(steps=2))


def test_tensorboard_start_on_a_port_in_use_says_so(tb_state, tmp_path):
    """A port held by another TensorBoard of the same logdir (one this state file does not know): the handle
    must not point at a process that failed to start while the other one answers for it."""
    import http.server
    import threading

    logdir = str((tmp_path / "runs").resolve())

    class Other(http.server.BaseHTTPRequestHandler):  # answers as a TensorBoard of the same logdir does
        def do_GET(self):
            body = json.dumps({"logdir": logdir}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        port = httpd.server_address[1]
        with pytest.raises(UserError, match=f"port {port} is in use.*leave port out"):
            tensorboard.start(logdir, port=port)
    finally:
        httpd.shutdown()


@pytest.mark.parametrize("env,message", [
    (dict(RANK="0", WORLD_SIZE="2"), r"RANK=0 WORLD_SIZE=2 in the environment.*parallel=ddp.*unset RANK WORLD_SIZE"),
    (dict(RANK="abc", WORLD_SIZE="2"), r"RANK='abc' in the environment is not a whole number.*unset"),
    (dict(RANK="0", WORLD_SIZE="two"), r"WORLD_SIZE='two' in the environment is not a whole number"),
    (dict(RANK="²", WORLD_SIZE="2"), r"RANK='²' in the environment is not a whole number"),
    (dict(RANK="0", WORLD_SIZE="٢"), r"WORLD_SIZE='٢' in the environment is not a whole number")])
def test_stale_launcher_variables_are_named_with_the_fix(tmp_path, monkeypatch, capsys, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=message):
        engine.train(tiny(tmp_path / "run", steps=2))
    assert message.split("=")[0].strip("(") in one_line_error(["train", *tiny(tmp_path / "run", steps=2).to_overrides()],
                                                           capsys)


@pytest.mark.parametrize("dataset", ["cifar10", "imagefolder"])
def test_a_data_dir_that_is_a_file_says_so(tmp_path, dataset):
    (tmp_path / "data").write_text("not a folder")
    with pytest.raises(DataNotFound, match=r"data_dir=.* is a file, not a folder") as e:
        engine.train(tiny(tmp_path / "run", dataset=dataset, data_dir=str(tmp_path / "data")))
    assert "fetch" not in str(e.value)


STALL_RANKS = """
import os, time
if "LOCAL_RANK" in os.environ:  # a rank started by torchrun (not torchrun itself): it stalls, using no CPU
    time.sleep(60)
"""


def test_launch_returns_at_its_timeout_and_stops_the_ranks(tmp_path):
    """tl.launch read the ranks' output to its end before it applied the timeout: a stalled rank held the cell
    (for the 60 s its rank sleeps here). Now the timeout counts from the start, and the ranks are stopped."""
    (tmp_path / "stall").mkdir()
    (tmp_path / "stall" / "sitecustomize.py").write_text(STALL_RANKS)
    t0 = time.monotonic()
    with pytest.raises(UserError, match="torchrun did not finish within timeout=5 s: its processes were stopped"):
        engine.launch(tiny(tmp_path / "run"), nproc=2, timeout=5,
                      extra_env={"PYTHONPATH": f"{tmp_path / 'stall'}:{ROOT}"})
    assert time.monotonic() - t0 < 40, "the timeout was not applied while the ranks ran"
    assert not subprocess.run(["pgrep", "-f", f"out_dir={tmp_path}/run"], capture_output=True).stdout


@pytest.mark.parametrize("nproc", [0, -1, 1.5, True, "2"])
def test_launch_refuses_a_bad_nproc(tmp_path, nproc):
    with pytest.raises(UserError, match=f"nproc={nproc!r} must be a positive whole number"):
        engine.launch(tiny(tmp_path / "run"), nproc=nproc)


# ================================================================ tracebacks that should be one line
def _checkpoint_damage(finished_run, how, path):
    good = (Path(finished_run.out_dir) / "checkpoint.pt").read_bytes()
    if how == "missing keys":
        state = torch.load(Path(finished_run.out_dir) / "checkpoint.pt", weights_only=True)
        del state["optimizer"]
        torch.save(state, path)
        return
    path.write_bytes({"truncated": good[: len(good) // 2], "empty": b"", "text": b"not a checkpoint\n",
                      "a tensor": b"", "a zip of something else": b"PK\x03\x04" + b"\0" * 100}[how])
    if how == "a tensor":
        torch.save(torch.zeros(3), path)


@pytest.mark.parametrize("how", ["truncated", "empty", "text", "a tensor", "a zip of something else",
                                 "missing keys"])
def test_an_unreadable_checkpoint_is_named_with_the_fix(finished_run, tmp_path, capsys, how):
    out = tmp_path / "run"
    out.mkdir()
    _checkpoint_damage(finished_run, how, out / "checkpoint.pt")
    err = one_line_error(["train", *finished_run.replace(out_dir=str(out)).to_overrides()], capsys)
    assert str(out / "checkpoint.pt") in err and "resume=false" in err


@pytest.mark.parametrize("content,message", [
    (b"steps: [1, 2\n", "not valid YAML at line"), (b"a: b: c\n", "not valid YAML"), (b"\tsteps: 2\n", "not valid YAML"),
    (b"steps: 2\n\xff\xfe\n", "not UTF-8"), (b"- steps\n", "must hold a mapping"), (b"steps: 12:30\n", "not a valid int"),
    (b"out_dir: runs/a\nstep: 2\n", "unknown key 'step'")])
def test_a_bad_config_file_is_one_line(tmp_path, capsys, content, message):
    (tmp_path / "c.yaml").write_bytes(content)
    assert message in one_line_error(["train", "--config", str(tmp_path / "c.yaml")], capsys)


def test_config_naming_a_folder_says_so(tmp_path, capsys):
    assert "is a folder" in one_line_error(["train", "--config", str(tmp_path)], capsys)


@pytest.mark.parametrize("source,line,said", [
    ("import torch\ndef make():\n    return torch.nn.Linear(2, 2\n", 3, "'(' was never closed"),
    ("def make():\n  x = 1\n    return x\n", 3, "unexpected indent"),
    ("def make()\n    pass\n", 1, "expected ':'")])
def test_a_syntax_error_in_your_model_file_is_one_line_with_its_place(tmp_path, capsys, source, line, said):
    from tutorial_lib import ownmodel

    model = tmp_path / "my_models.py"
    model.write_text(source)
    err = one_line_error(["card", f"{model}:make", "--small"], capsys)
    assert f"{model}:{line}: {said}" in err and "fix that line of your file" in err
    model.write_text("import torch\ndef make():\n    return torch.nn.Linear(2, 2)\n")  # fixed: read again
    assert ownmodel.resolve(f"{model}:make")().out_features == 2


def test_a_model_file_that_fails_on_import_is_read_again_once_fixed(tmp_path):
    from tutorial_lib import ownmodel

    model = tmp_path / "my_models.py"
    model.write_text("import torch\nsize = undefined_name\ndef make():\n    return torch.nn.Linear(2, 2)\n")
    with pytest.raises(NameError):  # the user's own code: its traceback says where
        ownmodel.resolve(f"{model}:make")
    model.write_text("import torch\ndef make():\n    return torch.nn.Linear(2, 2)\n")
    assert ownmodel.resolve(f"{model}:make")().out_features == 2


@pytest.mark.parametrize("where", ["out_dir under a file", "out_dir is a file", "out_dir read-only",
                                   "jobs-dir under a file", "data_dir under a file"])
def test_unusable_folders_are_one_line(tmp_path, capsys, where):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    if where == "out_dir read-only" and os.access(readonly, os.W_OK):
        readonly.chmod(0o700)
        pytest.skip("root writes into read-only folders")
    argv = {"out_dir under a file": ["train", f"out_dir={blocker}/run", "steps=1", "device=cpu"],
            "out_dir is a file": ["train", f"out_dir={blocker}", "steps=1", "device=cpu"],
            "out_dir read-only": ["train", f"out_dir={readonly}", "steps=1", "device=cpu"],
            "jobs-dir under a file": ["jobs", "render", "--name", "demo", "--jobs-dir", f"{blocker}/jobs", "steps=2"],
            "data_dir under a file": ["data", "fetch", "cifar10", "--data-dir", f"{blocker}/data"]}[where]
    err = one_line_error(argv, capsys)
    assert str(blocker if "read-only" not in where else readonly) in err
    readonly.chmod(0o700)


@pytest.mark.parametrize("reason", ["[Errno -3] Temporary failure in name resolution", "timed out",
                                    "[Errno 111] Connection refused"])
def test_data_fetch_without_internet_says_to_use_a_login_node(tmp_path, capsys, monkeypatch, reason):
    import urllib.error

    import torchvision

    def offline(*a, **k):
        raise urllib.error.URLError(reason)
    monkeypatch.setattr(torchvision.datasets.utils, "urlopen", offline, raising=False)
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", lambda self: offline())
    err = one_line_error(["data", "fetch", "cifar10", "--data-dir", str(tmp_path / "data")], capsys)
    assert "login node with internet" in err and reason in err


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    from tutorial_lib.imagefolder import write_imagefolder

    root = tmp_path_factory.mktemp("imgs") / "data"
    write_imagefolder(root / "imagefolder", train_size=32, val_size=16, processes=1)
    return root


@pytest.mark.parametrize("bad", ["truncated png", "text named .png", "empty file", "odd size", "grey odd size"])
@pytest.mark.parametrize("workers", [0, 1])
def test_a_bad_image_file_is_named(small_folder, tmp_path, capsys, bad, workers):
    import shutil

    from PIL import Image

    data = tmp_path / "data"
    shutil.copytree(small_folder, data)
    target = sorted((data / "imagefolder" / "train").glob("*/*.png"))[5]
    if bad == "truncated png":
        target.write_bytes(target.read_bytes()[:60])
    elif bad in ("text named .png", "empty file"):
        target.write_bytes(b"" if bad == "empty file" else b"hello")
    else:
        Image.new("RGB" if bad == "odd size" else "L", (31, 40)).save(target)
    err = one_line_error(["train", *tiny(tmp_path / "run", dataset="imagefolder", data_dir=str(data), train_size=32,
                                          steps=2, num_workers=workers, eval=False).to_overrides()], capsys)
    assert str(target) in err
    assert ("31x40 pixels, not 32x32" in err) == ("odd size" in bad)


def test_a_process_that_leaves_its_loader_mid_epoch_still_exits():
    """The workers ignore SIGTERM (a job's stop signal is for the trainer); a program that drops a loader
    mid-epoch without closing it must still exit, not wait for its workers forever."""
    code = ("import torch; from torch.utils.data import TensorDataset; from tutorial_lib import data\n"
            "loader = data.WorkbookLoader(TensorDataset(torch.arange(64.)), batch_size=4, num_workers=2,\n"
            "                             worker_init_fn=data._worker_init)\n"
            "KEPT = iter(loader); next(KEPT); print('one batch', flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "one batch" in p.stdout, p.stderr


def test_persistent_workers_ended_early_are_started_again():
    from torch.utils.data import TensorDataset

    from tutorial_lib import data

    loader = data.WorkbookLoader(TensorDataset(torch.arange(16.)), batch_size=4, num_workers=1,
                                 persistent_workers=True, worker_init_fn=data._worker_init)
    first = iter(loader)
    next(first)
    data.end_workers(first)  # what a run's end does mid-epoch
    assert [len(b[0]) for b in loader] == [4, 4, 4, 4]  # new workers serve the next epoch
    data.end_workers(loader._iterator)


@pytest.mark.parametrize("hidden", [".DS_Store", "._00000.png", ".ipynb_checkpoints/x.png"])
def test_hidden_files_in_an_image_folder_are_skipped(small_folder, tmp_path, hidden):
    import shutil

    from tutorial_lib.imagefolder import ImageFolderImages

    shutil.copytree(small_folder, tmp_path / "data")
    train = tmp_path / "data" / "imagefolder" / "train"
    for where in (train, train / sorted(os.listdir(train))[0]):
        (where / hidden).parent.mkdir(parents=True, exist_ok=True)
        (where / hidden).write_bytes(b"\0\0 not an image")
    ds = ImageFolderImages(train)
    assert len(ds) == 32 and len(ds.classes) == len(os.listdir(small_folder / "imagefolder" / "train"))
    assert all(ds[i][0].shape == (3, 32, 32) for i in range(len(ds)))


# ---------------------------------------------------------------- tracebacks left (after the first round)
def test_the_ladder_takes_num_workers_auto():
    from tutorial_lib import ladder

    runs = ladder.configs(ladder.SMALL, {"num_workers": "auto"}, "cpu")  # a TypeError: "auto" * prefetch_factor
    ahead = config.default_workers() * 2
    assert runs[0][1].timing_warmup == ladder.SMALL.warmup + ahead


def test_ladder_out_that_cant_be_used_fails_before_any_rung_runs(tmp_path, capsys, monkeypatch):
    from tutorial_lib import ladder

    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(ladder, "run", lambda *a, **k: pytest.fail("a rung ran"))
    err = one_line_error(["ladder", "--small", "--out", f"{tmp_path}/file/ladder"], capsys)
    assert f"{tmp_path}/file/ladder" in err


@pytest.mark.parametrize("name", ["imagefolder", "cifar10"])
@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_data_fetch_into_a_folder_that_cant_be_made_is_one_line(tmp_path, capsys, name, where):
    (tmp_path / "file").write_text("x")
    folder = f"{tmp_path}/file/data" if where == "under a file" else "/proc/workbook-data"
    err = one_line_error(["data", "fetch", name, "--data-dir", folder], capsys)
    assert folder in err and "login node" not in err  # not an internet problem


@pytest.mark.parametrize("where", ["logdir under a file", "state folder under a file"])
def test_tensorboard_start_on_a_folder_that_cant_be_used_is_one_line(tmp_path, monkeypatch, where):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(tensorboard, "STATE", (tmp_path / "file" if "state" in where else tmp_path) / "state.json")
    logdir = tmp_path / "file" / "runs" if "logdir" in where else tmp_path / "runs"
    with pytest.raises(UserError, match=str(tmp_path / "file")) as e:
        tensorboard.start(logdir)  # nothing started
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("damage", ["truncated", "a JSON list", "empty"])
def test_the_ledger_skips_a_damaged_result_with_a_note(finished_run, tmp_path, capsys, damage):
    from tutorial_lib import scaling

    good = (Path(finished_run.out_dir) / "result.json").read_text()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(good)
    (tmp_path / "b" / "result.json").write_text({"truncated": good[: len(good) // 2], "a JSON list": "[1, 2]",
                                                 "empty": ""}[damage])
    rows = scaling.ledger(tmp_path)
    assert [r["run"] for r in rows] == ["a"]
    assert f"skipped {tmp_path / 'b' / 'result.json'}" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["42", "[1, 2]", '"text"', json.dumps({"card": "x", "gpus": 1, "torch": "2", "date":
                                  "d", "script": "s", "figures": [1, 2]}), "null"])
def test_a_reference_file_of_the_wrong_shape_is_one_line(tmp_path, text):
    from tutorial_lib import reference

    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(UserError, match="bad.json .*not a reference record") as e:
        reference.show("bad", folder=tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("how", ["weights of another model", "step is text", "losses is a number",
                                 "world_size is text"])
def test_a_checkpoint_that_does_not_fit_the_run_is_one_line(finished_run, tmp_path, capsys, how):
    state = torch.load(Path(finished_run.out_dir) / "checkpoint.pt", weights_only=True)
    if how == "weights of another model":
        from tutorial_lib import models
        state["model"] = models.build("resnet18", 10).state_dict()
    else:
        key = how.split()[0]
        state[key] = {"step": "4", "losses": 3.0, "world_size": "1"}[key]
    out = tmp_path / "run"
    out.mkdir()
    torch.save(state, out / "checkpoint.pt")
    err = one_line_error(["train", *finished_run.replace(out_dir=str(out)).to_overrides()], capsys)
    assert str(out / "checkpoint.pt") in err and "resume=false" in err


@pytest.mark.parametrize("damage", ["truncated", "a JSON list", "a number"])
def test_a_damaged_result_of_a_finished_run_is_written_again_by_the_same_command(finished_run, tmp_path, capsys,
                                                                              damage):
    """The message said "run the training again to rewrite it", and running it again repeated the error."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run.out_dir, out)
    good = (out / "result.json").read_text()
    (out / "result.json").write_text({"truncated": good[:100], "a JSON list": "[1]", "a number": "7"}[damage])
    with pytest.raises(UserError, match="run the same training command again") as e:
        config_free_load(out)
    assert "\n" not in str(e.value)
    cfg = finished_run.replace(out_dir=str(out))
    assert main(["train", *cfg.to_overrides()]) == 0
    assert "whose result.json is damaged: writing it again" in capsys.readouterr().out
    again = config_free_load(out)
    assert again.steps == 4 and again.resumed_from_step == 4 and len(again.loss) == 4  # nothing trained again


def config_free_load(out):
    from tutorial_lib.results import load_result

    return load_result(out)


# ================================================================ jobs that fail must say why
@pytest.mark.parametrize("tool,kw", [("nsys", dict(nsys=True)), ("kernprof", dict(line_profile=True))])
def test_a_job_whose_tool_is_missing_says_how_to_get_it(tmp_path, tool, kw):
    path = jobs.write("t_tool", TrainConfig(steps=2), site="local", jobs_dir=tmp_path, show=False, **kw)
    stub = tmp_path / "bin"
    stub.mkdir()
    for name in ("python", "python3"):  # the job's python, without kernprof or nsys next to it
        (stub / name).symlink_to(sys.executable)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "1",
           "SLURM_JOB_NAME": "t_tool", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1",
           "SLURM_CPUS_PER_TASK": "1", "HOME": str(tmp_path)}
    (tmp_path / "tutorial_lib").mkdir()
    p = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 2
    assert f"error: {tool} is not on PATH on" in p.stderr and "site profile 'local'" in p.stderr


def test_an_impossible_node_count_names_the_partitions_nodes(monkeypatch):
    monkeypatch.setattr(slurm, "_sinfo", lambda fmt: "debug*: 2 nodes, 4 CPUs, 8000 MB, GRES gpu:2")
    msg = slurm.refusal_message(Path("jobs/x.sbatch"), "sbatch: error: Batch job submission failed: Node count "
                                                       "specification invalid")
    assert "more nodes than its partition has" in msg and "debug*: 2 nodes" in msg


@pytest.mark.parametrize("name,kw", [("gpu_monitor.csv", dict(gpu_monitor=1)),
                                     ("line_profile.lprof", dict(line_profile=True)), ("nsys", dict(nsys=True))])
def test_a_job_never_writes_its_own_files_through_a_link_planted_in_out_dir(tmp_path, name, kw):
    """The files a job writes into out_dir itself (the GPU monitor's CSV, line_profiler's report, nsys's reports)
    are refused at the job's top when a link stands in their place."""
    out = tmp_path / "runs" / "t_link"
    out.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / name).symlink_to(victim)
    path = jobs.write("t_link", TrainConfig(steps=2, out_dir=str(out)), site="local", jobs_dir=tmp_path, show=False,
                      **kw)
    stubs = tmp_path / "bin"  # the tools the job checks for, doing nothing
    stubs.mkdir()
    for tool in ("nsys", "kernprof", "nvidia-smi"):
        (stubs / tool).write_text("#!/bin/sh\necho fake\n")
        (stubs / tool).chmod(0o755)
    env = {"PATH": f"{stubs}:{Path(sys.executable).parent}:/usr/bin:/bin", "SLURM_SUBMIT_DIR": str(tmp_path),
           "SLURM_JOB_ID": "1", "SLURM_JOB_NAME": "t_link", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1",
           "SLURM_CPUS_PER_TASK": "1", "HOME": str(tmp_path)}
    (tmp_path / "tutorial_lib").mkdir()
    p = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and f"error: {out}/{name} is a link" in p.stderr, p.stdout + p.stderr
    assert victim.read_text() == "precious"


# ---------------------------------------------------------------- job files that render, then fail
def _render_cli(tmp_path, *argv) -> str:
    assert main(["jobs", "render", "--name", "t_render", "--jobs-dir", str(tmp_path), *argv]) == 0
    return (tmp_path / "t_render.sbatch").read_text()


@pytest.mark.parametrize("sweep,line", [("num_workers=0, 2", "workers=2; program+=(num_workers=2)"),
                                        ("lr= 1e-3 ,0.002", "program+=(lr=0.001)"),
                                        ("eval=yes,no", "program+=(eval=false)")])
def test_a_swept_value_is_written_as_the_config_reads_it(tmp_path, capsys, sweep, line):
    """`--sweep 'num_workers=0, 2'` wrote `workers= 2;`, and task 1 died with `2: command not found`."""
    text = _render_cli(tmp_path, "--sweep", sweep, "steps=2")
    assert line in text, text
    assert subprocess.run(["bash", "-n", str(tmp_path / "t_render.sbatch")]).returncode == 0


@pytest.mark.parametrize("kw,message", [
    (dict(cfg=TrainConfig(global_batch_size=7, parallel="ddp"), gpus_per_node=2),
     "global_batch_size=7 is not divisible by the world size 2"),
    (dict(cfg=TrainConfig(parallel="ddp"), gpus_per_node=2, sweep={"global_batch_size": [8, 7]}),
     "global_batch_size=7 is not divisible by the world size 2"),
    (dict(command="python a.py\npython b.py"), "command holds 2 lines"),
    (dict(command="python a.py\r\npython b.py"), "command holds 2 lines"),
    (dict(cfg=TrainConfig(), time="\u0661:\u0660\u0660:\u0660\u0660"), "is not a Slurm time"),
    (dict(cfg=TrainConfig(), time="\uff11\uff10"), "is not a Slurm time")])
def test_what_would_fail_in_the_job_fails_at_render_time(tmp_path, kw, message):
    with pytest.raises(UserError, match=message) as e:
        jobs.write("t_render", **kw, jobs_dir=tmp_path, show=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "t_render.sbatch").exists()


@pytest.mark.parametrize("key,value", [("setup", ["module load cuda", "source venv/bin/activate"]), ("setup", 42),
                                       ("setup", {"module": "cuda"}), ("launcher", 7)])
def test_a_site_profiles_shell_text_must_be_text(tmp_path, key, value):
    """A setup given as a list or a number was pasted into the job file as Python's repr of it."""
    import yaml

    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**yaml.safe_load(GENERIC), key: value}))
    with pytest.raises(UserError, match=f"{key}=.* must be text"):
        jobs.render("t_render", TrainConfig(), site=str(tmp_path / "mine.yaml"))


@pytest.mark.parametrize("how", ["WORKBOOK_SITE", "--site"])
def test_a_site_profile_whose_name_holds_a_newline_is_refused_however_it_is_named(tmp_path, monkeypatch, capsys, how):
    """A profile named by $WORKBOOK_SITE skipped the check --site had: the rest of its name became a shell line of
    its own in the job file."""
    path = tmp_path / "x\ntouch pwned\n.yaml"
    path.write_text(GENERIC)
    if how == "WORKBOOK_SITE":
        monkeypatch.setenv("WORKBOOK_SITE", str(path))
        argv = []
    else:
        argv = ["--site", str(path)]
    err = one_line_error(["jobs", "render", "--name", "t_render", "--jobs-dir", str(tmp_path), *argv, "steps=2"],
                         capsys)
    assert "control character" in err
    assert not (tmp_path / "t_render.sbatch").exists()


def test_a_job_rendered_with_workbook_site_naming_a_file_renders_again(tmp_path, monkeypatch):
    (tmp_path / "own.yaml").write_text(GENERIC)
    monkeypatch.setenv("WORKBOOK_SITE", str(tmp_path / "own.yaml"))
    path = jobs.write("t_render", TrainConfig(steps=2), jobs_dir=tmp_path, show=False)
    assert jobs.render_record(path)["site"] == str(tmp_path / "own.yaml")
    monkeypatch.delenv("WORKBOOK_SITE")
    assert jobs.rerender(path) == path.read_text()


# ---------------------------------------------------------------- the pre-flight check
@pytest.mark.parametrize("value", ["abc", "²", "٣"])
def test_doctor_names_a_slurm_cpus_per_task_that_is_not_a_number(monkeypatch, value):
    from tutorial_lib import doctor

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", value)
    cpus = doctor.check_cpus(doctor.Context(doctor.Options()))  # was: "the check itself failed ... report it"
    assert cpus.status == "WARN" and f"SLURM_CPUS_PER_TASK={value!r}" in cpus.message, cpus
    assert "unset SLURM_CPUS_PER_TASK" in cpus.fix
    assert config.usable_cpus() == len(os.sched_getaffinity(0))  # ignored, as it says ('²' was a ValueError)


@pytest.mark.parametrize("argv", [["--timeout", "0"], ["--timeout", "-3"], ["--timeout", "nan"],
                                  ["--shm-min-mib", "-1"], ["--min-free-gib", "-1"], ["--min-free-inodes", "-5"]])
def test_doctor_refuses_limits_that_mean_nothing(capsys, argv):
    """--timeout 0 was accepted, and every command then 'timed out', blaming the kernel and the proxy."""
    err = one_line_error(["doctor", *argv], capsys)
    assert f"{argv[0]}={argv[1]}" in err


@pytest.mark.parametrize("folder,says", [("/proc/workbook-data", "not on a disk"),
                                         ("FILE/data", "can't be created")])
def test_doctor_on_a_data_dir_that_cant_hold_data_says_so(tmp_path, folder, says):
    from tutorial_lib import doctor

    (tmp_path / "file").write_text("x")
    folder = folder.replace("FILE", str(tmp_path / "file"))
    ctx = doctor.Context(doctor.Options(data_dir=folder))
    disk, datasets = doctor.check_disk(ctx), doctor.check_datasets(ctx)
    assert datasets.status == "FAIL" and "writable" not in datasets.message and says in datasets.message, datasets
    if says == "not on a disk":
        assert disk.status == "FAIL" and "not on a disk" in disk.message and not re.search(r"(?<![\d.])0\.0 GiB", disk.message), disk  # not '70.0 GiB' free


# ---------------------------------------------------------------- what listens where
def _listening(pid: int) -> list[str]:
    """The addresses process `pid` listens on (ss -ltnp)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to list listening sockets")
def test_a_run_on_one_node_keeps_torchruns_stores_on_the_loopback_address(tmp_path, monkeypatch):
    """torchrun --standalone (PyTorch's own behaviour) serves its rendezvous store and the store its ranks share on
    every interface; `python -m tutorial_lib.launcher`, which tl.launch and the rendered one-node jobs run, binds them
    to 127.0.0.1."""
    from tutorial_lib import launcher

    p = subprocess.Popen([sys.executable, "-m", "tutorial_lib.launcher", "--standalone", "--nproc_per_node=2", "-m",
                          "tutorial_lib", "train", *tiny(tmp_path / "run", steps=400, parallel="ddp", log_every=1,
                                                          eval=False).to_overrides()],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        said = []
        for line in p.stdout:
            said.append(line)
            if line.startswith("step 2/"):
                break
        addresses = _listening(p.pid)
        assert len(addresses) >= 2 and all(a.startswith("127.0.0.1:") for a in addresses), (addresses, said[-20:])
    finally:
        launcher.stop_processes(p, grace_s=10)
    started = []
    popen = subprocess.Popen
    monkeypatch.setattr(launcher.subprocess, "Popen", lambda argv, **kw: started.append(argv) or popen(argv, **kw))
    with pytest.raises(UserError):  # a run that fails at once: only its command line is looked at here
        launcher.launch(tiny(tmp_path / "bad", precision="fp16"), nproc=2)  # fp16 on a CPU: every rank refuses
    assert started[0][1:4] == ["-m", "tutorial_lib.launcher", "--standalone"]
    one_node = jobs.render("t_ddp", TrainConfig(parallel="ddp"), gpus_per_node=2)
    assert "python -m tutorial_lib.launcher --standalone --nproc_per_node=2" in one_node
    two_nodes = jobs.render("t_ddp", TrainConfig(parallel="ddp"), nodes=2, gpus_per_node=2)
    assert "torchrun --nnodes" in two_nodes  # across nodes the stores must be reachable from the other nodes
