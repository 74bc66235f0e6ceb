"""Notebook 05's jobs on the local Slurm: each rendered as the notebook renders it (tl.jobs.write with the same
site and resources), with CPU sizes, submitted, and run to COMPLETED.

The test cluster lacks two things the real sites have: Apptainer (a stand-in runs the command outside any image,
after checking the options and that the image file exists) and MNIST (a few hundred 28x28 images from the
shapes generator are written in MNIST's file format, so torchvision's MNIST class reads them as it would the
real files). The container profile's partition and memory request are the local cluster's.
"""
from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from tutorial_lib import jobs
from tutorial_lib.config import TrainConfig

from test_slurm import PROBLEM, finished

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))]

FAKE_APPTAINER = """#!/bin/bash
# Stand-in for apptainer on the CPU test cluster: `exec --nv --bind DIR --pwd DIR IMAGE command...` runs the
# command here, with the environment Apptainer would pass in (APPTAINERENV_*).
[[ $1 == exec ]] || { echo "fake apptainer: only exec" >&2; exit 2; }
shift
nv=0
while [[ $1 == --* ]]; do
    case $1 in
        --nv) nv=1; shift ;;
        --bind|--pwd) shift 2 ;;
        *) echo "fake apptainer: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $nv == 1 ]] || { echo "fake apptainer: --nv missing: the GPUs would be invisible" >&2; exit 2; }
[[ -f $1 ]] || { echo "fake apptainer: no image $1" >&2; exit 2; }
shift
export PYTHONPATH=$APPTAINERENV_PYTHONPATH
exec "$@"
"""


def tiny(out_dir: Path, **kw) -> TrainConfig:
    base = dict(dataset="shapes", model="resnet18_imagenet", steps=6, batch_size=8, train_size=64, val_size=32,
                device="cpu", tensorboard=False, log_every=2, eval=False, out_dir=str(out_dir))
    return TrainConfig(**{**base, **kw})


def write_mnist_files(folder: Path, n_train: int = 256, n_test: int = 64) -> Path:
    """MNIST's four idx files (unpacked, as torchvision keeps them after a download) holding grey 28x28 images
    from the shapes generator."""
    from tutorial_lib import shapes

    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        images, labels = shapes.make_shapes(n, seed=seed, size=28)
        grey = images.mean(axis=3).astype(np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + grey.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n)
                                                         + labels.astype(np.uint8).tobytes())
    return folder


@pytest.fixture(scope="module")
def submitted(tmp_path_factory):
    work = tmp_path_factory.mktemp("jobs05")
    fake = work / "bin"
    fake.mkdir()
    (fake / "apptainer").write_text(FAKE_APPTAINER)
    (fake / "apptainer").chmod(0o755)
    image = work / "pytorch.sif"
    image.write_text("stand-in image\n")
    data = write_mnist_files(work / "data")
    path = f"{fake}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    env = f"--export=ALL,PATH={path},WORKBOOK_IMAGE={image}"
    common = dict(jobs_dir=work / "jobs", show=False, output=f"{work}/logs/%x-%j.out", time="00:10:00")
    specs = {  # as notebook 05 writes them, with CPU sizes
        "05_ddp": dict(cfg=tiny(work / "ddp", parallel="ddp"), gpus_per_node=2),
        "05_ddp_container": dict(cfg=tiny(work / "container", parallel="ddp"), site="container",
                                 account="your_project", gpus_per_node=2, partition="debug", mem="2G"),
        "05_dp_mnist_line_profile": dict(cfg=tiny(work / "mnist", dataset="mnist", model="mnist_cnn", parallel="dp",
                                                  data_dir=str(data)),
                                         gpus_per_node=2, line_profile=True),
    }
    out = {}
    for name, spec in specs.items():
        cfg = spec.pop("cfg")
        out[name] = jobs.submit(jobs.write(f"t{name}", cfg, **common, **spec), sbatch_args=[env])
    yield out
    import subprocess

    for job in out.values():
        subprocess.run(["scancel", job.id], capture_output=True)


def test_ddp_job_runs_two_ranks_under_torchrun(submitted):
    job = submitted["05_ddp"]
    assert finished(job) == "COMPLETED"
    res = job.result()
    assert res["world_size"] == 2 and res["param_checksums"][0] == res["param_checksums"][1]


def test_container_job_runs_inside_apptainer_exec_nv(submitted):
    job = submitted["05_ddp_container"]
    assert finished(job) == "COMPLETED"
    assert "exec --nv" in job.log(200)
    assert job.result()["world_size"] == 2


def test_dataparallel_mnist_job_prints_the_line_profile(submitted):
    job = submitted["05_dp_mnist_line_profile"]
    assert finished(job) == "COMPLETED"
    log = job.log(400)
    assert "def train_step" in log and "self.model(x)" in log
    assert job.result()["config"]["parallel"] == "dp"
