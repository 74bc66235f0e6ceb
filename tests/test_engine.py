"""The training loop: a step that learns, exact resume, the result contract."""
import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import cli, interrupted_at
from tutorial_lib import data, engine, shapes
from tutorial_lib.engine import Run


def test_shapes_deterministic_from_seed():
    a, ya = shapes.make_shapes(300, seed=5)
    b, yb = shapes.make_shapes(300, seed=5)
    c, _ = shapes.make_shapes(300, seed=6)
    assert a.shape == (300, 32, 32, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and np.array_equal(ya, yb)
    assert not np.array_equal(a, c)
    head, _ = shapes.make_shapes(50, seed=5)  # a smaller set is a prefix of the larger one
    assert np.array_equal(head, a[:50])
    assert set(np.unique(ya)) == set(range(10))


def test_a_training_step_lowers_the_loss_of_its_own_batch(tiny_cfg):
    """What learning rests on, true on any CPU: a small step against the gradient lowers the loss of the batch it
    was computed on. (How far a tiny run gets in N steps depends on the CPU's kernels and threads: no test asserts
    it.)"""
    run = Run(tiny_cfg(lr=1e-4, weight_decay=0.0, lr_schedule="constant"), engine.distributed.setup("none", "cpu"))
    x, y = run.prepare(*next(iter(run.input.epoch(0))))

    def loss() -> float:
        with torch.no_grad():
            return run.criterion(run.model(x), y).item()
    before = loss()
    stepped = run.train_step(x, y).item()
    after = loss()
    assert np.isfinite(before) and stepped == pytest.approx(before, rel=1e-4)  # the step's loss is this batch's
    assert after < before, (before, after)


def test_the_same_seed_trains_the_same_losses_and_another_seed_others(tiny_cfg, tmp_path):
    one, again, other = (engine.train(tiny_cfg(steps=4, eval=False, seed=seed, out_dir=tmp_path / name))
                         for name, seed in (("one", 0), ("again", 0), ("other", 1)))
    assert one.loss == again.loss and one.param_checksums == again.param_checksums
    assert one.loss != other.loss and all(np.isfinite(one.loss + other.loss))


def test_augmentation_crop_flip_matches_reference():
    x = torch.from_numpy(shapes.make_shapes(16, seed=0)[0]).permute(0, 3, 1, 2)
    offsets, flips = data.draw_augment(16, torch.Generator().manual_seed(1))
    out = data.crop_flip(x, offsets, flips)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(16):
        ref = padded[i, :, offsets[i, 0]:offsets[i, 0] + 32, offsets[i, 1]:offsets[i, 1] + 32]
        assert torch.equal(out[i], ref.flip(2) if flips[i] else ref)


@pytest.mark.parametrize("workers, extra", [(0, {}), (2, {}), (0, {"cuda_graph": True, "warmup_steps": 3})])
def test_resume_equals_uninterrupted_run(tiny_cfg, tmp_path, workers, extra):
    """cuda_graph: the learning rate lives in a tensor (saved with the optimizer) and the warm-up's schedule crosses
    the interruption."""
    # 3 steps per epoch, so the interruption lands mid-epoch and the resumed run crosses an epoch boundary
    kw = dict(steps=8, train_size=48, num_workers=workers, ckpt_every=0, **extra)
    straight = engine.train(tiny_cfg(out_dir=str(tmp_path / "straight"), **kw))
    cfg = tiny_cfg(out_dir=str(tmp_path / "resumed"), **kw)
    interrupted_at(cfg, 4)
    assert (tmp_path / "resumed" / "checkpoint.pt").is_file()
    resumed = engine.train(cfg)
    assert resumed.resumed_from_step == 4 and resumed.steps == 8
    assert resumed.loss == straight.loss  # step for step, bit for bit
    assert resumed.param_checksums == straight.param_checksums


def test_checkpoint_write_is_atomic(tiny_cfg, tmp_path, monkeypatch):
    cfg = tiny_cfg(steps=4, ckpt_every=2)
    engine.train(cfg)
    ckpt = tmp_path / "run" / "checkpoint.pt"
    before = ckpt.read_bytes()

    def crash(obj, f, *a, **k):  # torch.save writes into the fresh temporary file it is given
        f.write(b"half a checkpoint")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", crash)
    run = Run(cfg.replace(steps=6), engine.distributed.setup("none", "cpu"))
    with pytest.raises(engine.UserError, match="could not write the checkpoint"):
        run.save_checkpoint()
    assert ckpt.read_bytes() == before  # the old checkpoint survives a failed write
    assert not list(ckpt.parent.glob(".checkpoint.pt.*"))  # nor its partial file


def test_resume_refuses_a_different_run(tiny_cfg):
    engine.train(tiny_cfg(steps=2, ckpt_every=2))
    with pytest.raises(engine.ConfigError, match="resume=false"):
        engine.train(tiny_cfg(steps=4, batch_size=8))


def test_sigusr1_checkpoints_and_exits_3(tmp_path):
    args = [sys.executable, "-m", "tutorial_lib", "train", "dataset=shapes", "model=resnet18_imagenet",
            "steps=400", "batch_size=8", "train_size=64", "device=cpu", "num_workers=0", "progress=false",
            "log_every=1", "tensorboard=false", f"out_dir={tmp_path}/run"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("step 3/"):
            p.send_signal(signal.SIGUSR1)
            break
    out, err = p.communicate(timeout=120)
    assert p.returncode == engine.EXIT_PREEMPTED, err
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert 3 <= state["step"] < 400
    assert "stopped by SIGUSR1: checkpoint at step" in out


def test_dataparallel_on_cpu_runs_with_a_note(tiny_cfg, capsys):
    r = engine.train(tiny_cfg(parallel="dp", steps=2))
    assert r.steps == 2
    assert "DataParallel has nothing to split" in capsys.readouterr().out


def test_cli_writes_result_json(tmp_path):
    p = cli("train", "dataset=shapes", "model=resnet18_imagenet", "steps=10", "batch_size=32", "train_size=320",
            "val_size=128", "device=cpu", "num_workers=1", f"out_dir={tmp_path}/demo", "progress=false")
    assert p.returncode == 0, p.stderr
    r = json.loads((tmp_path / "demo" / "result.json").read_text())
    for key in ("config", "device", "world_size", "steps", "throughput_img_s", "step_time_ms", "loss", "final_loss",
                "val_accuracy", "peak_memory_mb", "torch_version", "param_checksums"):
        assert key in r
    assert r["config"]["batch_size"] == 32 and r["world_size"] == 1 and r["steps"] == 10
    assert r["peak_memory_mb"] is None and r["device"].startswith("CPU")
    assert set(r["step_time_ms"]) >= {"median", "p10", "p90"}
    assert r["step_time_ms"]["p10"] <= r["step_time_ms"]["median"] <= r["step_time_ms"]["p90"]
    assert r["throughput_img_s"] > 0 and len(r["loss"]) == 10
    assert all(np.isfinite(r["loss"])) and r["final_loss"] == r["loss"][-1] and 0 <= r["val_accuracy"] <= 1
    assert r["torch_version"] == torch.__version__
