"""DDP through torchrun on CPU/gloo: the replicas stay identical."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


def torchrun(nproc, out_dir, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "tutorial_lib", "train", "dataset=shapes", "model=resnet18_imagenet", "steps=6", "batch_size=16",
           "train_size=256", "val_size=64", "device=cpu", "num_workers=0", "progress=false", "parallel=ddp",
           f"out_dir={out_dir}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads((out_dir / "result.json").read_text())


def test_two_ranks_end_with_identical_parameters(two_rank_run):
    r = two_rank_run
    assert r["world_size"] == 2 and r["global_batch"] == 32
    assert len(r["param_checksums"]) == 2
    assert r["param_checksums"][0] == r["param_checksums"][1]


def test_global_batch_size_is_split_over_ranks(tmp_path):
    r = torchrun(2, tmp_path / "gb", "global_batch_size=24")
    assert r["global_batch"] == 24 and r["config"]["global_batch_size"] == 24


@pytest.mark.parametrize("nproc", [1])
def test_ddp_with_one_process_is_valid(tmp_path, nproc):
    r = torchrun(nproc, tmp_path / "ddp1")
    assert r["world_size"] == 1


def test_launch_from_python_runs_torchrun_and_returns_the_result(tmp_path, capsys):
    import tutorial_lib as tl
    from conftest import tiny

    r = tl.launch(tiny(tmp_path / "launch", steps=4), nproc=2)
    out = capsys.readouterr().out
    assert "$ torchrun --standalone --nproc_per_node=2 -m tutorial_lib train" in out
    assert "step 4/4" in out  # the ranks' output streams into the cell
    assert r.world_size == 2 and r.param_checksums[0] == r.param_checksums[1]


def test_launch_reports_a_failing_run(tmp_path):
    import tutorial_lib as tl
    from conftest import tiny

    with pytest.raises(tl.UserError, match="torchrun exited with code"):
        tl.launch(tiny(tmp_path / "bad", train_size=8, batch_size=16), nproc=2)


def test_a_failed_launch_shows_a_ranks_own_last_words_above_torchruns_summary():
    from tutorial_lib import distributed

    lines = ([f"[rank0] step {i}\n" for i in range(30)] + ["terminate called without an active exception\n"]
             + [f"[rank0] after {i}\n" for i in range(20)] + [f"summary line {i}\n" for i in range(12)])
    text = distributed.failure_lines(lines)
    assert text.startswith("terminate called without an active exception\n...")
    assert text.endswith("summary line 11") and "summary line 0" in text
    assert "step 3" not in text and "after 5" not in text  # the ordinary lines in between stay out
    assert distributed.failure_lines(["a\n", "b\n"]) == "a\nb"


def test_collectives_return_only_once_gloo_has_let_go_of_their_tensors():
    """The wait that keeps a gloo worker from touching a Python tensor during shutdown: another holder (here a
    view, dropped by another thread as a worker drops its work) keeps let_go waiting until it is gone."""
    import threading
    import time

    import torch

    from tutorial_lib import _gloo_exit

    t = torch.ones(4)
    before = [t._use_count()]
    done = _gloo_exit.hand_over("gloo", "test", t)
    view = [t[:2]]  # a second C++ reference to t, like the one a worker holds until it drops its work
    assert t._use_count() > before[0]
    threading.Timer(0.2, view.clear).start()
    start = time.monotonic()
    done()
    assert time.monotonic() - start >= 0.15 and t._use_count() == before[0]
    view.append(t[:2])  # NCCL's works: not waited for
    start = time.monotonic()
    _gloo_exit.let_go("nccl", [t], before)
    assert time.monotonic() - start < 0.1


def test_a_compiled_ddp_model_traces_ddps_profiler_range_without_a_warning(tmp_path):
    """DDP's forward opens a profiler range (record_function); Dynamo, compiling the DDP module, printed
    '[rank0]:W ... Profiler record function ... will be ignored' into notebook 07's card (seen on an H200, torch
    2.11). The engine has Dynamo keep the range instead: one compiled DDP step on the CPU prints no warning."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = ("import torch\n"
              "compile = torch.compile  # Dynamo traces (and would warn), Inductor is not needed: its eager backend\n"
              "torch.compile = lambda model, **kw: compile(model, backend='eager')\n"
              "from tutorial_lib import TrainConfig, distributed, engine\n"
              "cfg = TrainConfig(dataset='shapes', model='resnet18_imagenet', batch_size=4, steps=2, timing_warmup=0, "
              "train_size=64, device='cpu', num_workers=0, progress=False, tensorboard=False, eval=False, "
              f"out_dir={str(tmp_path)!r}, parallel='ddp', compile=True)\n"
              "run = engine.Run(cfg, distributed.setup('ddp', 'cpu'))\n"
              "run.train_step(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))\n"
              "distributed.teardown(run.env)\n"
              "print('stepped')\n")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                         cwd=ROOT)
    assert run.returncode == 0 and "stepped" in run.stdout, run.stderr[-3000:]
    assert "will be ignored" not in run.stderr, run.stderr[-3000:]
