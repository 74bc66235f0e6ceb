"""Notebook 08's pictures: where the memory goes (stacked bars), a snapshot's timeline, and the memory per GPU of
DDP and FSDP. Every figure comes in as data; nothing is measured here."""
from __future__ import annotations

from . import memory

MiB, GiB = memory.MiB, memory.GiB
COLORS = {"parameters": "tab:blue", "gradients": "tab:orange", "optimizer state": "tab:green",
          "activations": "tab:red", "gradients and temporaries": "tab:orange", "allocator cache": "lightgray"}


def measured_parts(m: dict) -> dict:
    """A measure's stack: what the peak holds, part by part, and on top what the allocator reserved beyond it."""
    return {"parameters": m["parameters"], "optimizer state": m["optimizer state"], "activations": m["activations"],
            "gradients and temporaries": memory.beyond(m), "allocator cache": max(0, m["reserved"] - m["peak"])}


def stacked(rows: list[tuple[str, dict]], title: str, unit: int = MiB, line: tuple[str, float] | None = None):
    """Horizontal stacked bars, one per (label, {part: bytes}); `line`: (label, bytes) drawn as a dashed limit."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.4))
    seen = set()
    for i, (label, parts) in enumerate(rows[::-1]):
        left = 0.0
        for part, value in parts.items():
            ax.barh(i, value / unit, left=left, color=COLORS.get(part, "tab:purple"),
                    label=None if part in seen else part)
            seen.add(part)
            left += value / unit
        ax.text(left, i, f" {left:,.0f}", va="center", fontsize=7)
    if line:
        ax.axvline(line[1] / unit, color="black", ls="--", lw=1)
        ax.text(line[1] / unit, len(rows) - 0.4, f" {line[0]}", fontsize=7, va="top")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows[::-1]], fontsize=8)
    ax.set_xlabel("MiB" if unit == MiB else "GiB")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    plt.tight_layout()
    plt.show()


def timeline(s: dict, title: str):
    """The allocated memory after each event of a snapshot, with its peak marked."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 2.8))
    ax.plot(s["timeline_mib"], color="tab:blue")
    ax.axhline(s["peak_mib"], color="tab:red", ls="--", lw=1)
    ax.text(0, s["peak_mib"], f"peak {s['peak_mib']:,.0f} MiB", fontsize=7, va="bottom", color="tab:red")
    ax.set_xlabel(f"allocator events (of {s['events']:,}, in order)")
    ax.set_ylabel("allocated, MiB")
    ax.set_title(title, fontsize=9)
    plt.tight_layout()
    plt.show()
