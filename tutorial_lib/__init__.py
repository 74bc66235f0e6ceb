"""tutorial_lib: the reusable half of the HPC training workbook.

    import tutorial_lib as tl
    cfg = tl.TrainConfig(dataset="shapes", model="resnet18", steps=100)
    result = tl.train(cfg)            # this process: one device or DataParallel
    result = tl.launch(cfg, nproc=2)  # DDP through torchrun, from a notebook cell
"""
from .config import ROOT, ConfigError, TrainConfig, UserError, load

__all__ = ["ConfigError", "ROOT", "TrainConfig", "UserError", "launch", "load", "load_result", "train"]


SUBMODULES = ("bench", "config", "data", "distributed", "engine", "imagefolder", "jobs", "models", "notebook",
              "profiling", "reference", "report", "results", "scaling", "tensorboard", "trace_summary")


def __getattr__(name):
    # torch is imported on first use, so `tutorial_lib.config` and `tutorial_lib.jobs` work without it
    if name in ("train", "launch"):
        from . import engine

        return getattr(engine, name)
    if name in ("load_result", "Result"):
        from . import results

        return getattr(results, name)
    if name in SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tutorial_lib' has no attribute {name!r}")
