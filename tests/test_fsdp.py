"""When it does not fit: activation checkpointing (same losses, fewer saved activations, BatchNorm statistics
updated once), parallel=fsdp on two gloo CPU processes (DDP's losses at the same global batch) and its
torch.distributed.checkpoint checkpoints (stopped and resumed to the same losses, also on one process, and
complete or absent after a crash).

Starting torchrun costs most of a run here, so one launch of two processes trains several runs one after another
(RUNS below, one process group for all of them), and one launch of one process the rest."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import ROOT, tiny
from tutorial_lib import blocks, config, engine, models, sharding

RUNS = r'''
import json, os, shutil, sys
from pathlib import Path
import torch.distributed as dist
from torch import nn
from tutorial_lib import config, engine, models, sharding

dist.init_process_group("gloo")  # one process group for all the runs (the engine's setup finds it):
real_destroy, dist.destroy_process_group = dist.destroy_process_group, lambda *a, **k: None  # their teardown keeps it
build, step = models.build, engine.Run.train_step


def group_norm_build(name, num_classes):  # BatchNorm normalises over each rank's batch: 2 x 8 is not 1 x 16
    import torchvision
    return torchvision.models.resnet18(num_classes=num_classes, norm_layer=lambda c: nn.GroupNorm(8, c))


for spec in json.loads(open(sys.argv[1]).read()):
    models.build = group_norm_build if spec.get("group_norm") else build

    def train_step(self, x, y, spec=spec):
        if self.step + 1 == spec.get("stop_at"):  # as a SIGUSR1 during this step
            self.stop_requested, self.stop_signal = True, "SIGUSR1"
        if self.step + 1 == spec.get("crash_at"):
            raise RuntimeError("crashed on purpose")
        return step(self, x, y)
    engine.Run.train_step = train_step
    cfg = config.load(None, spec["overrides"])
    kept = sharding.latest(Path(cfg.out_dir))
    if spec.get("drop_result") and dist.get_rank() == 0:  # a finished run whose result.json is gone
        os.remove(Path(cfg.out_dir) / "result.json")
    dist.barrier()
    stamp = lambda folder: (folder, os.stat(folder / "run.pt").st_ino, os.stat(folder / "run.pt").st_mtime_ns)
    before = stamp(kept) if kept else None
    try:
        engine.train(cfg)
        said = "finished"
    except engine.Preempted:
        said = "preempted"
    except (RuntimeError, config.UserError) as e:
        said = f"error: {e}"
    if dist.get_rank() == 0:
        if kept:
            said += " (kept)" if stamp(sharding.latest(Path(cfg.out_dir))) == before else " (written again)"
        print(f"RUN {spec['name']}: {said}", flush=True)
        if spec.get("copy_to"):
            shutil.copytree(cfg.out_dir, spec["copy_to"])
    dist.barrier()
real_destroy()
'''

COMMON = ["dataset=shapes", "model=resnet18_imagenet", "steps=6", "global_batch_size=16", "train_size=256",
          "device=cpu", "num_workers=0", "progress=false", "tensorboard=false", "log_every=2", "eval=false",
          "augment=false", "lr_schedule=constant"]


def launch(tmp_path, nproc: int, runs: list[dict]) -> dict[str, str]:
    """Train `runs` one after another in one torchrun of `nproc` gloo processes; what each ended with."""
    spec = tmp_path / f"runs{nproc}.json"
    spec.write_text(json.dumps([{**r, "overrides": COMMON + r["overrides"]} for r in runs]))
    (tmp_path / "runs.py").write_text(RUNS)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                        str(tmp_path / "runs.py"), str(spec)], capture_output=True, text=True, cwd=ROOT,
                       timeout=400, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ended = dict(line[4:].split(": ", 1) for line in p.stdout.splitlines() if line.startswith("RUN "))
    assert set(ended) == {r["name"] for r in runs}, p.stdout[-3000:]
    return ended


def result(out) -> dict:
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two processes: DDP and FSDP (ResNet-18, BatchNorm), FSDP in bf16; with GroupNorm (the same on 2 x 8 images
    as on 1 x 16) an FSDP run, the same with activation checkpointing stopped at step 4 (its checkpoint copied)
    and resumed without it. One process: that copy resumed (then, without its result.json, finished again); a
    batch that differs refused; a run that crashes after its async checkpoint at step 2, resumed; the same run
    never stopped."""
    tmp = tmp_path_factory.mktemp("fsdp")
    o = {name: tmp / name for name in ("ddp", "fsdp", "bf16", "gn", "stopped", "on_one", "again", "crash", "one")}
    ended = launch(tmp, 2, [
        dict(name="ddp", overrides=["parallel=ddp", f"out_dir={o['ddp']}"]),
        dict(name="fsdp", overrides=["parallel=fsdp", "eval=true", "val_size=32", f"out_dir={o['fsdp']}"]),
        dict(name="bf16", overrides=["parallel=fsdp", "precision=bf16", f"out_dir={o['bf16']}"]),
        dict(name="gn", group_norm=True, overrides=["parallel=fsdp", f"out_dir={o['gn']}"]),
        dict(name="stopped", group_norm=True, stop_at=3, copy_to=str(o["on_one"]),  # blocks recomputed, then not
             overrides=["parallel=fsdp", "ckpt_every=2", "activation_checkpointing=blocks", f"out_dir={o['stopped']}"]),
        dict(name="resumed", group_norm=True, overrides=["parallel=fsdp", "ckpt_every=2", f"out_dir={o['stopped']}"]),
    ])
    ended |= launch(tmp, 1, [
        dict(name="other_batch", group_norm=True, overrides=["parallel=fsdp", "ckpt_every=2", "global_batch_size=8",
                                                             f"out_dir={o['on_one']}"]),
        dict(name="on_one", group_norm=True, copy_to=str(o["again"]),
             overrides=["parallel=fsdp", "ckpt_every=2", f"out_dir={o['on_one']}"]),
        dict(name="finished_again", group_norm=True, drop_result=True,
             overrides=["parallel=fsdp", "ckpt_every=2", f"out_dir={o['again']}"]),
        dict(name="crash", group_norm=True, crash_at=3, overrides=["parallel=fsdp", "ckpt_every=2",
                                                                   f"out_dir={o['crash']}"]),
        dict(name="after_crash", group_norm=True, overrides=["parallel=fsdp", "ckpt_every=2", f"out_dir={o['crash']}"]),
        dict(name="one", group_norm=True, overrides=["parallel=fsdp", f"out_dir={o['one']}"]),  # never stopped
    ])
    return ended, o


def test_fsdp_on_two_processes_matches_ddp_at_the_same_global_batch(runs):
    ended, o = runs
    assert ended["ddp"] == ended["fsdp"] == ended["bf16"] == "finished", ended
    ddp, fsdp = result(o["ddp"]), result(o["fsdp"])
    assert fsdp["world_size"] == 2 and fsdp["global_batch"] == ddp["global_batch"] == 16
    assert fsdp["loss"] == pytest.approx(ddp["loss"], rel=1e-3)
    assert fsdp["param_checksums"][0] == fsdp["param_checksums"][1]  # gathered whole on every rank
    assert fsdp["param_checksums"][0] == pytest.approx(ddp["param_checksums"][0], rel=1e-4)
    assert 0 <= fsdp["val_accuracy"] <= 1
    bf16 = result(o["bf16"])  # parameters gathered in bf16: the first loss (same weights, same batch) within its
    assert bf16["loss"][0] != fsdp["loss"][0] and bf16["loss"][0] == pytest.approx(fsdp["loss"][0], rel=1e-2)  # rounding
    assert all(math.isfinite(v) for v in bf16["loss"])


def test_a_sharded_run_stopped_and_resumed_gives_the_losses_of_one_never_stopped(runs):
    ended, o = runs
    assert ended["stopped"] == "preempted" and ended["resumed"] == "finished (written again)", ended
    resumed, whole = result(o["stopped"]), result(o["gn"])
    assert resumed["resumed_from_step"] == 4
    assert resumed["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert resumed["param_checksums"][0] == pytest.approx(whole["param_checksums"][0], rel=1e-6)
    folder = o["stopped"] / sharding.FOLDER
    assert (folder / "latest").read_text().strip() == "step_00000006"
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step_00000006"]  # older ones removed
    assert not (o["stopped"] / "checkpoint.pt").exists()


def test_a_checkpoint_of_two_processes_resumes_on_one_with_the_same_global_batch(runs):
    ended, o = runs
    assert ended["other_batch"].startswith("error: ") and ended["on_one"] == "finished (written again)", ended
    assert ended["finished_again"] == "finished (kept)"  # result.json written again, the complete checkpoint kept
    assert result(o["again"])["loss"] == result(o["on_one"])["loss"]
    said = ended["other_batch"]
    assert "global batch of 16 images on 2 ranks (now 8 on 1: give global_batch_size=16" in said and "\n" not in said
    one, whole = result(o["on_one"]), result(o["gn"])
    assert one["world_size"] == 1 and one["resumed_from_step"] == 4
    assert one["loss"][:4] == whole["loss"][:4]  # carried in the checkpoint (a loss is rank 0's: 8 or 16 images)
    assert one["param_checksums"][0] == pytest.approx(whole["param_checksums"][0], rel=1e-7)  # the same training


def test_after_a_crash_the_last_complete_checkpoint_is_the_one_resumed(runs):
    """The run crashed in step 3, after the async save of step 2 had begun: `latest` names step 2, and the run
    resumed from it trains as the uninterrupted run on as many processes did, step for step and bit for bit (the
    state was copied before training went on). Against the run on two processes, only to rounding: the gradient
    of 16 images summed as one batch or as two of 8 differs in its last bits, and six steps carry that on."""
    ended, o = runs
    assert "crashed on purpose" in ended["crash"] and ended["after_crash"] == "finished (written again)", ended
    again, straight, whole = result(o["crash"]), result(o["one"]), result(o["gn"])
    assert again["resumed_from_step"] == 2 and ended["one"] == "finished"
    assert again["loss"] == straight["loss"] and again["param_checksums"] == straight["param_checksums"]
    assert again["param_checksums"][0] == pytest.approx(whole["param_checksums"][0], rel=1e-4)


def test_a_missing_shard_is_one_line_naming_the_folder(tmp_path):
    """A checkpoint whose `latest` names a folder that is gone: one line, the file and the fix."""
    class FakeRun:
        out, cfg = tmp_path, tiny(tmp_path, parallel="fsdp")
        device = torch.device("cpu")
    (tmp_path / sharding.FOLDER).mkdir()
    (tmp_path / sharding.FOLDER / "latest").write_text("step_00000004\n")
    with pytest.raises(config.UserError, match=r"step_00000004/run.pt can't be read as a checkpoint") as e:
        sharding.resume(FakeRun())
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------- activation checkpointing
def test_activation_checkpointing_trains_to_the_same_losses(tmp_path):
    plain = engine.train(tiny(tmp_path / "plain", steps=4, eval=False))
    checkpointed = engine.train(tiny(tmp_path / "ac", steps=4, eval=False, activation_checkpointing="blocks"))
    assert checkpointed.loss == plain.loss
    assert checkpointed.param_checksums == plain.param_checksums


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors the forward pass keeps for the backward pass (those a checkpointed block keeps are
    counted: its input; those it recomputes are not)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return total[0]


def test_checkpointed_blocks_keep_fewer_activations_and_the_same_gradients():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 32, 32)
    plain = models.build("resnet18", 10)
    ac = models.build("resnet18", 10)
    ac.load_state_dict(plain.state_dict())
    assert blocks.apply_checkpointing(ac, "blocks") == 8  # ResNet-18's BasicBlocks
    before, after = saved_bytes(plain, x), saved_bytes(ac, x)
    assert after < before / 3, (before, after)
    for p, q in zip(plain.parameters(), ac.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)
    for (name, a), b in zip(plain.state_dict().items(), ac.state_dict().values()):  # running stats updated once
        assert torch.equal(a, b), name


def test_compiled_checkpointed_blocks_give_the_gradients_and_statistics_of_the_plain_model():
    """Under torch.compile the recomputation is the compiled backward graph's (checkpoint's context_fn, which keeps
    the statistics in eager mode, can't be compiled)."""
    torch.manual_seed(0)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    plain, ac = models.build("resnet18_imagenet", 10), models.build("resnet18_imagenet", 10)
    ac.load_state_dict(plain.state_dict())
    blocks.apply_checkpointing(ac, "blocks")
    torch._dynamo.reset()
    nn.functional.cross_entropy(plain(x), y).backward()
    nn.functional.cross_entropy(torch.compile(ac, backend="aot_eager")(x), y).backward()
    for p, q in zip(plain.parameters(), ac.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)
    for (name, a), b in zip(plain.state_dict().items(), ac.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), name


def test_blocks_are_found_by_what_a_model_repeats():
    from tutorial_lib.lessons import card_examples

    assert {type(b).__name__ for b in blocks.find(models.build("resnet18", 10))} == {"BasicBlock"}
    gpt = card_examples.GPT(card_examples.GPT_SMALL)
    assert blocks.find(gpt) == list(gpt.blocks)
    assert blocks.find(models.build("mnist_cnn", 10)) == []


def test_bad_values_are_one_line_naming_the_value_and_the_choices(tmp_path):
    with pytest.raises(config.ConfigError, match=r"activation_checkpointing='layers' is not one of none, blocks"):
        tiny(tmp_path, activation_checkpointing="layers")
    with pytest.raises(config.ConfigError, match=r"MnistCNN repeats no block.*use activation_checkpointing=none"):
        blocks.apply_checkpointing(models.build("mnist_cnn", 10), "blocks")
    for bad, fix in (("precision=fp16", "precision=bf16"), ("compile=true", "compile=false"),
                     ("cuda_graph=true", "cuda_graph=false"), ("grad_sync=false", "grad_sync=true"),
                     ("channels_last=true", "channels_last=false")):
        with pytest.raises(config.ConfigError, match=rf"parallel=fsdp does not work with {bad}.*use {fix}, or "
                                                     "parallel=ddp"):
            config.load(None, ["parallel=fsdp", bad])
    with pytest.raises(config.ConfigError, match=r"activation_checkpointing=blocks does not work with parallel=dp.*"
                                                 "use parallel=ddp, or activation_checkpointing=none"):
        config.load(None, ["parallel=dp", "activation_checkpointing=blocks"])
    with pytest.raises(config.ConfigError, match=r"parallel='fsdp' needs one process per device started by a "
                                                 "launcher"):
        engine.train(tiny(tmp_path, parallel="fsdp"))


def test_activation_checkpointing_may_change_when_a_run_resumes():
    saved = config.TrainConfig().to_dict()
    assert config.resume_differences(saved, config.TrainConfig(activation_checkpointing="blocks")) == []


def test_launch_from_a_cell_keeps_parallel_fsdp(tmp_path, monkeypatch, capsys):
    """tl.launch runs a config as DDP unless it asks for the model sharded (it made every config parallel=ddp)."""
    from tutorial_lib import launcher

    asked = []

    def command(cfg, nproc, command, args):
        asked.append(cfg.parallel)
        return [sys.executable, "-c", "pass", "a", "b"]
    monkeypatch.setattr(launcher, "torchrun_command", command)
    for parallel in ("fsdp", "none", "ddp"):
        assert launcher.launch(tiny(tmp_path, parallel=parallel), nproc=2, command="bench") is None
    assert asked == ["fsdp", "ddp", "ddp"]
