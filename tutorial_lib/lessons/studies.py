"""The GPU studies behind the notebooks' reference figures, each one entry point:

    python -m tutorial_lib study --list                 # every study, its notebook and the GPUs it wants
    python -m tutorial_lib study NAME --small           # tiny sizes on this machine (CPU: gloo, 2 processes)
    python -m tutorial_lib study NAME --reference       # full sizes on a GPU node: notebooks/reference/*.json

A study is a function `run(size, out) -> {reference name: figures}` in a lessons module, registered in
STUDIES below. It measures with the workbook's own loop (engine.train / engine.launch, bench, scaling), writes
whatever tables and logs it likes under `out`, and returns its figures; this runner writes each as a reference
record: into `out` always, and into notebooks/reference/ with --reference (full sizes, a CUDA GPU visible).
The small mode is what `make test` runs for every study, so the code behind a notebook's GPU figures is tested.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path

from .. import reference
from ..config import UserError
from .size import Size


@dataclass(frozen=True)
class Study:
    name: str
    target: str  # "module:function" inside tutorial_lib.lessons
    notebook: str  # the notebook that shows its figures
    gpus: int  # GPUs its full size wants (it runs on fewer, saying so)
    about: str  # one line: what it measures

    def function(self):
        module, func = self.target.split(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), func)


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("ladder", "ladder:study", "04", 1, "the optimization ladder rung by rung, and traces of its key rungs"),
)}


def get(name: str) -> Study:
    if name not in STUDIES:
        raise UserError(f"no study named {name!r}; the studies are: {', '.join(sorted(STUDIES)) or '(none)'} "
                        "(python -m tutorial_lib study --list)")
    return STUDIES[name]


def listing() -> str:
    width = max((len(n) for n in STUDIES), default=0)
    return "\n".join(f"{s.name:<{width}}  notebook {s.notebook}, {s.gpus} GPU(s) at full size: {s.about}"
                     for s in sorted(STUDIES.values(), key=lambda s: (s.notebook, s.name)))


def run(name: str, size: Size, out: str | Path, write_reference: bool = False) -> dict[str, Path]:
    """Run study `name` at `size` into `out`; returns where each reference record went."""
    study = get(name)
    if write_reference and size.small:
        raise UserError(f"study {name}: --reference records full-size GPU figures; drop --small (sizes now: "
                        f"small, {size.why})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    figures_by_name = study.function()(size, out)
    script = f"python -m tutorial_lib study {name}"
    written = {}
    for ref_name, figures in figures_by_name.items():
        small = {"card": "CPU (small mode)", "gpus": 0, "torch_version": _torch_version()} if size.small else {}
        written[ref_name] = reference.write(ref_name, figures, script=script, folder=out, **small)
        if write_reference:
            written[ref_name] = reference.write(ref_name, figures, script=script)
    print(f"study {name} ({size.name} sizes) done in {time.time() - started:.0f} s; "
          f"wrote {', '.join(str(p) for p in written.values()) or 'no reference record'}")
    return written


def _torch_version() -> str:
    import torch

    return torch.__version__
