"""Several training runs in one torchrun (notebook 08's FSDP and checkpoint lessons): starting torchrun costs more
than a short run on a CPU, so one launch trains the runs one after another in one process group.

    runs = [{"name": "ddp", "overrides": ["parallel=ddp", "out_dir=runs/08/ddp", ...]}, ...]
    memory_runs.launch(runs, 2, "runs/08/runs.json")     # each run's result.json in its out_dir; copy_to: its out_dir copied after

The ResNet-18 here normalises with GroupNorm (each image on its own) instead of BatchNorm (over each rank's
batch): then 2 ranks x 8 images make the same step as 1 x 16, and runs on different numbers of processes can be
compared loss for loss. Nothing else changes: the engine, its config, its checkpoints.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..config import ROOT, UserError


def group_norm_build(name: str, num_classes: int):
    import torchvision
    from torch import nn

    stem = {"resnet18_imagenet": {}, "resnet18": None}[name]
    net = torchvision.models.resnet18(num_classes=num_classes, norm_layer=lambda c: nn.GroupNorm(8, c))
    if stem is None:  # the CIFAR stem of models.resnet18
        net.conv1, net.maxpool = nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.Identity()
    return net


def launch(runs: list[dict], nproc: int, spec: str | os.PathLike, timeout: float = 600) -> list[str]:
    """Train `runs` in one torchrun of `nproc` gloo processes; the line each ended with ('ddp: finished')."""
    Path(spec).parent.mkdir(parents=True, exist_ok=True)
    Path(spec).write_text(json.dumps(runs))
    command = [sys.executable, "-m", "tutorial_lib.launcher", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "tutorial_lib.lessons.memory_runs", str(spec)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env)
    ended = [line[4:] for line in p.stdout.splitlines() if line.startswith("RUN ")]
    if p.returncode != 0 or len(ended) != len(runs):
        tail = (p.stdout + p.stderr).strip().splitlines()[-8:]
        raise UserError(f"torchrun of {len(runs)} runs on {nproc} processes failed (code {p.returncode}): "
                        + " | ".join(tail))
    return ended


def main(spec: str) -> None:
    import torch.distributed as dist

    from .. import config, engine, models

    dist.init_process_group("gloo")  # one group for every run: the engine's setup finds it, its teardown keeps it
    destroy, dist.destroy_process_group = dist.destroy_process_group, lambda *a, **k: None
    models.build = group_norm_build
    for run in json.loads(Path(spec).read_text()):
        cfg = config.load(None, run["overrides"])  # key=value words, as on the command line
        try:
            engine.train(cfg)
            said = "finished"
        except engine.Preempted:
            said = "stopped by a signal"
        except config.UserError as e:  # a refused config or checkpoint: its one line, and the next run
            said = f"error: {e}"
        if dist.get_rank() == 0:
            if run.get("copy_to"):
                shutil.rmtree(run["copy_to"], ignore_errors=True)
                shutil.copytree(cfg.out_dir, run["copy_to"])
            print(f"RUN {run['name']}: {said}", flush=True)
        dist.barrier()
    destroy()


if __name__ == "__main__":
    main(sys.argv[1])


COMMON = ["dataset=shapes", "model=resnet18_imagenet", "global_batch_size=16", "train_size=256", "device=cpu",
          "num_workers=0", "progress=false", "tensorboard=false", "log_every=1", "eval=false", "augment=false",
          "lr_schedule=constant", "ckpt_every=2", "timing_warmup=1"]


def lesson_runs(out: str, steps: int = 4, stop: int = 2) -> dict[str, list[dict]]:
    """Notebook 08's runs: on 2 processes DDP, FSDP (an async checkpoint every 2 steps) and FSDP stopped at
    `stop` (its folder copied); on 1 process that copy resumed to `steps`."""
    run = lambda name, steps, *more, **kw: dict(name=name, overrides=COMMON + [f"steps={steps}", f"out_dir={out}/{name}",  # noqa: E731
                                                                             *more], **kw)
    return {"two": [run("ddp", steps, "parallel=ddp"), run("fsdp", steps, "parallel=fsdp"),
                    run("stopped", stop, "parallel=fsdp", copy_to=f"{out}/on_one")],
            "one": [run("on_one", steps, "parallel=fsdp")]}


def same_line(label: str, a, b) -> str:
    """Two results, loss for loss and by their weights at the end (the sum of all parameters)."""
    worst = max(abs(x - y) / abs(y) for x, y in zip(a.loss, b.loss))
    weights = abs(a.param_checksums[0] - b.param_checksums[0]) / abs(b.param_checksums[0])
    return (f"{label}: losses {', '.join(f'{v:.4f}' for v in a.loss)} against {', '.join(f'{v:.4f}' for v in b.loss)}"
            f" (largest difference {worst:.1e} of the loss); weights at the end differ by {weights:.1e}")


def folder_lines(out: str) -> list[str]:
    """What a sharded run's checkpoint folder holds: `latest` and the files of the folder it names."""
    root = Path(out) / "checkpoint.dcp"
    latest = (root / "latest").read_text().strip()
    files = sorted((root / latest).iterdir())
    out_lines = [f"{root}/latest names {latest}; it holds:"]
    out_lines += [f"  {f.name:24s} {f.stat().st_size / 2 ** 10:9,.0f} KiB" for f in files]
    return out_lines
