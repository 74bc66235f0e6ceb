"""The one switch between small and full sizes, for notebooks, the CLI and every GPU study.

    small: CPU-sized runs that finish in seconds (CI, laptops, a check of a GPU script on a CPU);
    full:  the sizes of the lesson on a GPU node.

Decided, first match wins: an explicit choice (`--small` on the command line), then `$WORKBOOK_SIZE`
(`small` or `full`), then the machine (small without a CUDA GPU, full with one).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..config import UserError

ENV = "WORKBOOK_SIZE"
CHOICES = ("small", "full")


@dataclass(frozen=True)
class Size:
    small: bool
    why: str  # how it was decided, for a banner or a log line

    @property
    def name(self) -> str:
        return "small" if self.small else "full"

    def pick(self, small, full):
        """`small` at small sizes, `full` at full sizes: e.g. steps = size.pick(8, 150)."""
        return small if self.small else full


def current(small: bool | None = None) -> Size:
    """The size of this run (see the module's docstring for the order)."""
    if small:
        return Size(True, "asked for (--small)")
    chosen = os.environ.get(ENV)
    if chosen is not None:
        if chosen not in CHOICES:
            raise UserError(f"{ENV}={chosen!r} is not one of {', '.join(CHOICES)}: set {ENV}=small or {ENV}=full, "
                            f"or unset it to choose by the machine")
        return Size(chosen == "small", f"${ENV}={chosen}")
    import torch  # only here: the choice by the machine needs to know whether there is a GPU

    if torch.cuda.is_available():
        return Size(False, "a CUDA GPU is visible")
    return Size(True, "no CUDA GPU is visible")
