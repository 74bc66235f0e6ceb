"""tutorial_lib: the reusable half of the HPC training workbook.

    import tutorial_lib as tl
    cfg = tl.TrainConfig(dataset="shapes", model="resnet18", steps=100)
    result = tl.train(cfg)            # this process: one device or DataParallel
    result = tl.launch(cfg, nproc=2)  # DDP through torchrun, from a notebook cell
"""
import importlib
from pathlib import Path

from .config import ROOT, ConfigError, TrainConfig, UserError, load

__all__ = ["ConfigError", "ROOT", "TrainConfig", "UserError", "launch", "load", "load_result", "train"]


SUBMODULES = tuple(sorted(p.stem for p in Path(__file__).parent.glob("*.py") if not p.stem.startswith("_")))
# The lessons' modules (tutorial_lib/lessons/) keep their short names: tl.bench, tl.ladder, tl.scaling, ... (but
# tl.card is the card's function)
LESSONS = tuple(sorted(p.stem for p in (Path(__file__).parent / "lessons").glob("*.py") if not p.stem.startswith("_")))


def __getattr__(name):
    # torch is imported on first use, so `tutorial_lib.config` and `tutorial_lib.jobs` work without it
    if name in ("train", "launch"):
        from . import engine

        return getattr(engine, name)
    if name == "card":  # tl.card(model, batch, loss=None, **overrides): the function (its module: tl.lessons.card)
        from .lessons.card import card

        return card
    if name in ("load_result", "Result"):
        from . import results

        return getattr(results, name)
    if name in SUBMODULES or name in LESSONS:
        return importlib.import_module(f".{'lessons.' if name in LESSONS else ''}{name}", __name__)
    raise AttributeError(f"module 'tutorial_lib' has no attribute {name!r}")
