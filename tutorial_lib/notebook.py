"""What every notebook's first cell calls: work from the workbook root, pick the sizes for this machine."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from . import tensorboard
from .config import ROOT
from .lessons import size as sizes


@dataclass
class Session:
    device: str  # "cuda" or "cpu"
    gpus: int
    small: bool  # True: CPU-sized runs (CI, laptops); False: full sizes on a GPU

    def pick(self, small, full):
        """`small` on a CPU machine, `full` on a GPU: e.g. steps = s.pick(60, 2000)."""
        return small if self.small else full


def setup(quiet: bool = False) -> Session:
    """chdir to the workbook root (so runs/, data/ and jobs/ are where the README says) and print a banner.

    WORKBOOK_SIZE=small|full overrides the automatic choice (small without a GPU, full with one): the one
    size switch of the workbook, `lessons.size` (notebook 00 teaches it).
    """
    import torch

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
    s = Session("cuda" if gpus else "cpu", gpus, size.small)
    if not quiet:
        where = f"{gpus} GPU(s): {torch.cuda.get_device_name(0)}" if gpus else f"CPU only ({os.cpu_count()} cores)"
        print(f"workbook ready | torch {torch.__version__} | {where} | sizes: {size.name}")
        if s.small:
            print("** SMALL SIZES: no GPU here, so runs are shortened to finish in seconds on a CPU. "
                  "The numbers show the method, not GPU performance. **")
    return s
