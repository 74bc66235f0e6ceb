"""Every bad input gets one line that names the field, the bad value and the fix."""
import pytest

from conftest import cli
from tutorial_lib.config import ConfigError, TrainConfig, load


@pytest.mark.parametrize("overrides, message", [
    (["precision=fp8"], "precision='fp8' is not one of fp32, tf32, bf16, fp16"),
    (["dataset=imagenet"], "dataset='imagenet' is not one of shapes, cifar10"),
    (["model=vit"], "model='vit' is not one of resnet18, resnet18_imagenet, mnist_cnn"),
    (["parallel=tp"], "parallel='tp' is not one of none, dp, ddp, fsdp"),
    (["batch_size=0"], "batch_size=0 must be a positive integer"),
    (["batch_size=-8"], "batch_size=-8 must be a positive integer"),
    (["steps=-1"], "steps=-1 must be a positive integer"),
    (["num_workers=-2"], "num_workers=-2 must be auto or an integer >= 0"),
    (["num_workers=x"], "num_workers='x' must be auto or an integer >= 0"),
    (["lr=0"], "lr=0.0 must be > 0"),
    (["batch_size=abc"], "batch_size='abc' is not a valid int"),
    (["batchsize=64"], "unknown key 'batchsize' (did you mean 'batch_size'?)"),
    (["dataset=mnist"], "dataset='mnist' has 1x28x28 images; use model=mnist_cnn"),
    (["steps"], "override 'steps' is not key=value"),
])
def test_bad_values_name_field_value_and_choices(overrides, message):
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.yaml")


def test_yaml_then_overrides(tmp_path):
    path = TrainConfig(batch_size=64, precision="bf16").save_yaml(tmp_path / "c.yaml")
    cfg = load(path, ["batch_size=32", "channels_last=true", "steps=null"])
    assert (cfg.batch_size, cfg.precision, cfg.channels_last, cfg.steps) == (32, "bf16", True, None)


def test_overrides_round_trip():
    cfg = TrainConfig(batch_size=48, precision="bf16", steps=7, compile=True, out_dir="runs/x")
    assert load(None, cfg.to_overrides()) == cfg


@pytest.mark.parametrize("device, world, launched, kw, message", [
    ("cpu", 1, False, {"precision": "fp16"}, "precision='fp16' needs a CUDA GPU"),
    ("cpu", 1, False, {"parallel": "ddp"}, "tl.launch(cfg, nproc=N)"),
    ("cpu", 3, True, {"parallel": "ddp", "global_batch_size": 100},
     "global_batch_size=100 is not divisible by the world size 3"),
    ("cpu", 2, True, {"parallel": "none"}, "add parallel=ddp"),
])
def test_runtime_checks(device, world, launched, kw, message):
    with pytest.raises(ConfigError) as e:
        TrainConfig(**kw).check_runtime(device, world, launched)
    assert message in str(e.value)


def test_ddp_with_world_size_one_is_valid():
    TrainConfig(parallel="ddp").check_runtime("cpu", 1, True)


def test_global_batch_is_split_per_device():
    assert TrainConfig(global_batch_size=512).per_device_batch(4) == 128
    assert TrainConfig(batch_size=64).per_device_batch(4) == 64


@pytest.mark.parametrize("args, message", [
    (["precision=fp8"], "precision='fp8' is not one of fp32, tf32, bf16, fp16"),
    (["--config", "missing.yaml"], "does not exist"),
    (["colour=red"], "unknown key 'colour'"),
    (["precision=fp16", "device=cpu"], "precision='fp16' needs a CUDA GPU"),
    (["parallel=ddp", "device=cpu"], "torchrun"),
    (["dataset=cifar10", "data_dir=nowhere", "device=cpu", "steps=1"],
     "python -m tutorial_lib data fetch cifar10"),
])
def test_cli_bad_input_is_one_line_and_nonzero(args, message, tmp_path):
    p = cli("train", *args, f"out_dir={tmp_path}/run", cwd=tmp_path)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], p.stderr


def test_num_workers_auto_follows_the_cpus_this_process_was_given(monkeypatch):
    from tutorial_lib.config import TrainConfig, usable_cpus

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    assert TrainConfig().num_workers == "auto" and TrainConfig().workers() == 7
    assert TrainConfig(num_workers=2).workers() == 2  # a value the user set is kept
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "32")
    assert TrainConfig().workers() == 8  # capped
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # 4 processes of one torchrun share the task's CPUs
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert usable_cpus() == 8 and TrainConfig().workers() == 7


def test_a_count_is_said_in_words():
    """Printed counts agree with their number (no '1 GPUs', no 'GPU(s)')."""
    from tutorial_lib.values import count

    assert [count(n, "GPU") for n in (0, 1, 2, 1024)] == ["0 GPUs", "1 GPU", "2 GPUs", "1,024 GPUs"]
    assert count(1, "thread") == "1 thread" and count(3, "process", "processes") == "3 processes"
    assert count("1", "GPU") == "1 GPU" and count("4", "GPU") == "4 GPUs"  # Slurm reports counts as text
