"""Command line: python -m tutorial_lib {train,data,jobs,bench} ...

    python -m tutorial_lib train dataset=shapes model=resnet18 steps=40 batch_size=32 out_dir=runs/demo
    torchrun --nproc_per_node=2 -m tutorial_lib train parallel=ddp ...
    python -m tutorial_lib data fetch cifar10
    python -m tutorial_lib jobs render --site generic --name demo steps=100
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .config import TrainConfig, UserError, load


def _train(argv: list[str]) -> int:
    from dataclasses import fields

    p = argparse.ArgumentParser(prog="python -m tutorial_lib train",
                                description="Train with the workbook's engine; writes <out_dir>/result.json.",
                                epilog="keys: " + ", ".join(f.name for f in fields(TrainConfig)))
    p.add_argument("--config", help="YAML file of TrainConfig fields")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    cfg = load(args.config, args.overrides)  # bad input fails here, before torch is imported
    from . import engine

    try:
        result = engine.train(cfg)
    except engine.Preempted:
        return engine.EXIT_PREEMPTED
    if result.config and _is_main():
        print(result.summary())
        print(f"wrote {cfg.out_dir}/result.json")
    return 0


def _is_main() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"


def _data(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tutorial_lib data")
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download a dataset into data/ (on a login node with internet)")
    f.add_argument("name", nargs="+")
    f.add_argument("--data-dir", default="data")
    s = sub.add_parser("status", help="which datasets are staged")
    s.add_argument("--data-dir", default="data")
    args = p.parse_args(argv)
    from . import data

    if args.cmd == "fetch":
        for name in args.name:
            print(f"staged {name} in {data.fetch(name, args.data_dir)}")
    else:
        for name, ok in data.staged(args.data_dir).items():
            print(f"{name:12s} {'staged' if ok else 'missing: python -m tutorial_lib data fetch ' + name}")
    return 0


def _doctor(argv: list[str]) -> int:
    from . import doctor

    return doctor.cli(argv)


COMMANDS = {"train": _train, "data": _data, "doctor": _doctor}
PLUGINS = {"jobs": "tutorial_lib.jobs", "bench": "tutorial_lib.bench"}  # modules with cli(argv) -> int


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    names = sorted([*COMMANDS, *PLUGINS])
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd in COMMANDS:
            return COMMANDS[cmd](rest)
        if cmd in PLUGINS:
            return importlib.import_module(PLUGINS[cmd]).cli(rest)
        raise UserError(f"unknown command {cmd!r}; one of {', '.join(names)}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
