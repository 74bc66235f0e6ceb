"""What every notebook's first cell calls: work from the workbook root, pick the sizes for this machine."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import tensorboard
from .config import ROOT
from .values import count
from .lessons import size as sizes


@dataclass(frozen=True)
class Session(sizes.Size):
    """The notebook's size (`small`, `pick(small, full)`: the one size switch, lessons.size) and its devices."""
    device: str = "cpu"  # "cuda" or "cpu"
    gpus: int = 0
    banners: set = field(default_factory=set, compare=False, repr=False)  # the GPU counts gpus_for has said it needs


def setup(quiet: bool = False) -> Session:
    """chdir to the workbook root (so runs/, data/ and jobs/ are where the README says) and print a banner.

    WORKBOOK_SIZE=small|full overrides the automatic choice (small without a GPU, full with one): the one
    size switch of the workbook, `lessons.size` (notebook 00 teaches it).
    """
    import torch  # the face loads torch when a notebook starts, not at import

    os.chdir(ROOT)
    os.environ.setdefault("KINETO_LOG_LEVEL", "99")
    # for `%tensorboard`: the venv's bin/ on PATH, and Jupyter's proxy address for its iframe when it has one
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):  # running the cell again adds nothing
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    proxy = tensorboard.proxy_prefix()
    if proxy:
        os.environ.setdefault("TENSORBOARD_PROXY_URL", proxy + "%PORT%/")
    gpus = torch.cuda.device_count()
    size = sizes.current()
    s = Session(size.small, size.why, "cuda" if gpus else "cpu", gpus)
    if not quiet:
        where = (f"{count(gpus, 'GPU')}: {torch.cuda.get_device_name(0)}" if gpus
                 else f"CPU only ({os.cpu_count()} cores)")
        print(f"workbook ready | torch {torch.__version__} | {where} | sizes: {s.name}")
        if s.small and not gpus:
            print("** SMALL SIZES: no GPU here, so runs are shortened to finish in seconds on a CPU. "
                  "The numbers show the method, not GPU performance. **")
        elif s.small:
            print(f"** SMALL SIZES ({s.why}): runs are shortened to finish in seconds. The numbers show the method, "
                  "not what this GPU can do. **")
    return s


def gpus_for(session: Session, need: int, what: str, on_cpu: int = 2,
             instead: str = "the figures below come from the reference run") -> int:
    """How many GPUs a cell that needs at least `need` uses here: every GPU of a server that has enough; on a CPU,
    `on_cpu` processes standing in for GPUs (gloo; 0: the cell means nothing without GPUs). Otherwise 0, after a
    banner that says what the cell needs, what this server has, and what the notebook does `instead`: once per
    notebook (session), so a later cell that needs no more GPUs than an earlier banner said returns 0 quietly."""
    if session.device == "cpu" and on_cpu:
        return on_cpu
    if session.gpus >= need:
        return session.gpus
    if need > max(session.banners, default=0):
        session.banners.add(need)
        have = count(session.gpus, "GPU") if session.gpus else "no GPU"
        print(f"** {what} needs {need} GPUs; this server has {have}: {instead}. **")
    return 0
