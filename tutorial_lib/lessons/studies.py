"""The GPU studies behind the notebooks' reference figures, each one entry point:

    python -m tutorial_lib study --list                 # every study, its notebook and the GPUs it wants
    python -m tutorial_lib study NAME --small           # tiny sizes on this machine (CPU: gloo, 2 processes)
    python -m tutorial_lib study NAME --reference       # full sizes on a GPU node: notebooks/reference/*.json

A study is a function `study(size, out) -> {reference name: figures}` in a lessons module, registered in
STUDIES below. It measures with the workbook's own loop (engine.train / engine.launch, bench, scaling), writes
whatever tables and logs it likes under `out`, and returns its figures ({} when its tables are all it leaves);
this runner writes each as a reference record: into `out` always, and into notebooks/reference/ with
--reference (full sizes, a CUDA GPU visible). Its sizes come from the one switch, lessons.size. The small mode is
what `make test` runs for every study, so the code behind a notebook's GPU figures is tested; scripts/gpu/*.sh
are the launch lines of these studies on a GPU node.
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
    Study("spine", "checks:spine", "01", 2, "fp32 vs bf16 on one GPU, DDP on 1 and 2 GPUs: the CLI's first runs"),
    Study("measure", "checks:measure", "01", 1, "one way to measure: train, bench and TensorBoard agree; verdicts"),
    Study("traces", "traces:study", "02", 2, "profiled runs (fp32, bf16, DDP per rank) and the GPU trace fixture"),
    Study("data_loading", "data_loading:study", "03", 2, "IO / SYNTHETIC / FULL of every loader at batch 256 and 1024"),
    Study("ladder", "ladder:study", "04", 1, "the optimization ladder rung by rung, traces of its key rungs, and the "
          "bench at configs/optimized.yaml"),
    Study("baseline", "baseline:study", "01", 1, "the fp32 baseline step by hand and in the engine, short and long "
          "runs, beside the GPU's clock: why one configuration can read differently in 01, 02 and 04"),
    Study("dpddp", "dpddp:study", "05", 4, "DataParallel against DDP on 1, 2 and 4 GPUs, the trap, DDP's knobs"),
    Study("scaling", "scaling_study:study", "06", 4, "weak and strong scaling, the race to a target accuracy, the "
          "all-reduce's cost, notebook 01's baseline"),
    Study("ddp_probe", "ddp_probe:study", "05", 4, "DDP at batch 256 per GPU form by form, and its gap traced by kernel class"),
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
    import torch  # only here: `study --list` and a bad name answer without it

    if write_reference and (size.small or not torch.cuda.is_available()):
        raise UserError(f"study {name}: --reference records full-size GPU figures; run it on a GPU node without "
                        f"--small (now: {size.name} sizes, {size.why}; "
                        f"{'a' if torch.cuda.is_available() else 'no'} CUDA GPU visible)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count()
    card = torch.cuda.get_device_name(0) if gpus else "CPU"
    print(f"study {name} (notebook {study.notebook}): {size.name} sizes ({size.why}); torch {torch.__version__} | "
          f"{f'{gpus} x {card}' if gpus else 'no CUDA GPU'}", flush=True)
    started = time.time()
    figures_by_name = study.function()(size, out)
    script = f"python -m tutorial_lib study {name}"
    # the record in `out` names what ran: a GPU at full sizes as reference.write reads it, else the mode too
    mode = {} if gpus and not size.small else {"card": f"{card} ({'small mode' if size.small else 'full sizes'})",
                                               "gpus": gpus, "torch_version": torch.__version__}
    written = {}
    for ref_name, figures in figures_by_name.items():
        written[ref_name] = reference.write(ref_name, figures, script=script, folder=out, **mode)
        if write_reference:
            written[ref_name] = reference.write(ref_name, figures, script=script)
    nothing = "no reference record (this study's figures are its tables in " + str(out) + ")"
    print(f"study {name} ({size.name} sizes) done in {time.time() - started:.0f} s; "
          f"wrote {', '.join(str(p) for p in written.values()) or nothing}")
    return written
