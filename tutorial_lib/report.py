"""The environment report of notebook 00: what this machine offers the workbook."""
from __future__ import annotations

import os
import platform
import shutil
import sys
from importlib import metadata

from .config import usable_cpus
from .values import count


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "missing"


def gpus() -> list[dict]:
    import torch  # the face loads torch when its report runs, not at import

    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count})
    return out


def slurm() -> dict:
    tools = {cmd: shutil.which(cmd) is not None for cmd in ("sbatch", "srun", "squeue", "sinfo", "scontrol")}
    job = {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_PARTITION", "SLURM_CPUS_PER_TASK",
                                      "SLURM_GPUS_ON_NODE") if k in os.environ}
    return {"commands": tools, "in_job": job}


def env_report(data_dir: str = "data") -> dict:
    """Python, packages, CUDA, GPUs, CPUs, Slurm and staged datasets, as a dict. (Notebook 00 teaches it.)"""
    import torch  # the face loads torch when its report runs, not at import

    from .data import staged  # imports torch, as above

    return {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "packages": {p: _version(p) for p in ("torch", "torchvision", "tensorboard", "torch-tb-profiler",
                                              "line_profiler", "jupyterlab")},
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpus": gpus(),
        "cpus_usable": usable_cpus(),
        "slurm": slurm(),
        "datasets": {"shapes": True, **staged(data_dir)},
        "executable": sys.executable,
    }


def print_report(r: dict) -> None:
    print(f"Python {r['python']} on {r['platform']}, {r['cpus_usable']} usable CPU cores")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in r["packages"].items()))
    if r["cuda_available"]:
        print(f"CUDA {r['cuda_version']}, cuDNN {r['cudnn']}, {count(len(r['gpus']), 'GPU')}:")
        for g in r["gpus"]:
            print(f"  GPU {g['index']}: {g['name']}, {g['memory_gib']} GiB, compute capability {g['capability']}")
    else:
        print("no CUDA GPU visible: the notebooks run with small sizes on the CPU")
    s = r["slurm"]
    have = [c for c, ok in s["commands"].items() if ok]
    print(f"Slurm commands: {', '.join(have) if have else 'none (jobs can be written here, submitted elsewhere)'}")
    if s["in_job"]:
        print("inside Slurm job: " + ", ".join(f"{k}={v}" for k, v in s["in_job"].items()))
    said = {True: "staged", False: "missing"}
    print("datasets: " + ", ".join("shapes (generated in memory, nothing to stage)" if k == "shapes" else
                                   f"{k} {said[ok]}" for k, ok in r["datasets"].items()))
