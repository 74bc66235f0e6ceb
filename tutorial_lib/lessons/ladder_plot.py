"""Notebook 04's pictures of the ladder, each drawn from rows (`ladder.run`'s, or a reference file's):

    tl.ladder_plot.bars([("here: CPU ...", rows), ("reference: NVIDIA H200, ...", ref_rows)])
    tl.ladder_plot.payback([("here: ...", rows), ("reference: ...", ref_rows)])

`bars`: each rung's speed-up over the fp32 row of its own run, and its MFU against the dense peak of the row's
precision (each peak named in the legend; a CPU has none, so no MFU). `payback`: the time since the start
against the steps, the eager rung from zero and each compiled rung from its compile time, the pay-back marked
where the rule (lessons.noise) calls the compiled rung faster.
"""
from __future__ import annotations

from . import ladder, noise
from ..config import UserError

PRECISION_COLORS = {"fp32": "tab:gray", "tf32": "tab:green", "bf16": "tab:purple", "fp16": "tab:orange"}
HATCHES = ("", "//", "..", "xx")  # one per source of rows


def measured(rows: list[dict]) -> dict[str, dict]:
    return {r["rung"]: r for r in rows if not r.get("skipped")}


def _order(panels: list[tuple[str, list[dict]]]) -> list[str]:
    """The rungs measured in any of the panels, in the ladder's order."""
    got = [measured(rows) for _, rows in panels]
    names = [r.name for r in ladder.rungs(ladder.GPU) if any(r.name in g for g in got)]
    if not names:
        raise UserError("no measured rung in these rows: nothing to draw (tl.ladder.run measures them)")
    return names


def draw_bars(panels: list[tuple[str, list[dict]]]):
    """The speed-up and MFU bars of `bars`, drawn onto a new figure; returns (figure, left axes, right axes)."""
    import matplotlib.pyplot as plt  # most of a second to import: only plots need it

    names = _order(panels)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.34 * len(names) * len(panels) + 1.8), sharey=True)
    h, ys = 0.8 / len(panels), range(len(names))
    no_peak = []
    for k, (label, rows) in enumerate(panels):
        got, at = measured(rows), [y - 0.4 + h * (k + 0.5) for y in ys]
        speed = [(y, got[n]["speedup"]) for y, n in zip(at, names) if n in got and got[n].get("speedup")]
        left.barh([y for y, _ in speed], [s for _, s in speed], height=h, color=f"C{k}", label=label)
        for y, s in speed:
            left.text(s, y, f" x{s:.2f}", va="center", fontsize=7)
        mfus = [(y, n, got[n]) for y, n in zip(at, names) if n in got and got[n].get("mfu")]
        if not mfus:
            no_peak.append(label)
        for y, n, r in mfus:
            precision, peak = ladder.peak_of(r)
            right.barh(y, 100 * r["mfu"], height=h, color=PRECISION_COLORS.get(precision, "tab:blue"),
                       hatch=HATCHES[k % len(HATCHES)], edgecolor="white",
                       label=f"{label.split(', torch')[0]}: {precision}, of its dense peak {peak:,.1f} TFLOP/s")
            right.text(100 * r["mfu"], y, f" {100 * r['mfu']:.0f}%", va="center", fontsize=7)
    top = max([r.get("mfu") or 0 for _, rows in panels for r in measured(rows).values()] + [0.01])
    right.set_xlim(0, 200 * top)  # the bars in the left half, the legend in the right one
    left.set_yticks(list(ys), names, fontsize=8)
    left.invert_yaxis()
    left.axvline(1, color="black", lw=0.6)
    left.set_xlabel("speed-up over the fp32 row of the same run (x)", fontsize=8)
    left.legend(fontsize=7, loc="lower right")
    right.set_xlabel("MFU (%): model FLOP/s over the dense peak of the row's precision", fontsize=8)
    handles, labels = right.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    for label in no_peak:
        unique[f"{label.split(', torch')[0]}: no datasheet peak, so no MFU"] = plt.Rectangle((0, 0), 0, 0, fill=False, lw=0)
    right.legend(unique.values(), unique.keys(), fontsize=7, loc="lower right")
    return fig, left, right


def bars(panels: list[tuple[str, list[dict]]]):
    """The ladder as a picture (the module's docstring); `panels`: (label, rows) per source, e.g. this machine
    and a reference run. Shows it inline and returns the figure."""
    import matplotlib.pyplot as plt

    fig, _, _ = draw_bars(panels)
    fig.suptitle("each rung on top of the one above: speed-up and MFU", fontsize=9)
    fig.tight_layout()
    plt.show()
    return fig


def payback_points(rows: list[dict], eager: str = "fused_adamw",
                   compiled: tuple[str, ...] = ("compile", "reduce_overhead")) -> list[dict]:
    """Per compiled rung of `rows` (with the `eager` row measured beside it): its compile time, its mean step and
    the eager one (the batch over img/s: what the run's clock sees), the rule's verdict against the eager row and
    the steps after which the compile is paid back (`steps`: only where the verdict is 'higher'; `at_means`: what
    the two means alone say, None where the compiled step is not shorter). [] without such rows."""
    got = measured(rows)
    if eager not in got:
        return []
    base = 1000 * got[eager]["batch"] / got[eager]["img_s"]
    out = []
    for name in [n for n in compiled if n in got and got[n].get("compile_s")]:
        r = got[name]
        ms = 1000 * r["batch"] / r["img_s"]
        verdict = noise.compare(ladder.figure(r), ladder.figure(got[eager])).verdict
        at_means = 1000 * r["compile_s"] / (base - ms) if base > ms else None
        out.append({"rung": name, "eager": eager, "compile_s": r["compile_s"], "step_ms": ms, "eager_ms": base,
                    "verdict": verdict, "said": ladder.against(rows, name, eager),
                    "steps": at_means if verdict == "higher" else None, "at_means": at_means})
    return out


def payback_axes(ax, label: str, points: list[dict]) -> None:
    """One panel of `payback`: cumulative seconds against steps, the eager line from 0, each compiled line from
    its compile time, a dot where a compiled rung the rule calls faster has paid its compile back."""
    decided = [p["steps"] for p in points if p["steps"]]
    last = min(max(2_000.0, 1.3 * max(decided)), 100_000.0) if decided else 2_000.0
    xs = [last * i / 100 for i in range(101)]
    eager_ms = points[0]["eager_ms"]
    ax.plot(xs, [x * eager_ms / 1000 for x in xs], color="black",
            label=f"{points[0]['eager']} (eager): {eager_ms:.2f} ms a step")
    for k, p in enumerate(points):
        ax.plot(xs, [p["compile_s"] + x * p["step_ms"] / 1000 for x in xs], color=f"C{k + 1}",
                label=f"{p['rung']}: {p['compile_s']:.0f} s to compile, then {p['step_ms']:.2f} ms a step")
        if p["steps"]:
            y = p["compile_s"] + p["steps"] * p["step_ms"] / 1000
            ax.plot(p["steps"], y, "o", color=f"C{k + 1}")
            ax.annotate(f"pays back after {p['steps']:,.0f} steps", (p["steps"], y), fontsize=7,
                        xytext=(4, -10), textcoords="offset points")
    ax.set_xlabel("training steps", fontsize=8)
    ax.set_ylabel("seconds since the start", fontsize=8)
    ax.set_title(label, fontsize=8)
    ax.legend(fontsize=7, loc="upper left")


def payback(panels: list[tuple[str, list[dict]]]):
    """Compile's pay-back as a picture, one panel per source of rows that holds a compiled rung beside the eager
    one; returns the figure, or None (and says why) where no source does."""
    import matplotlib.pyplot as plt

    drawn = [(label, payback_points(rows)) for label, rows in panels]
    for label, points in drawn:
        if not points:
            print(f"{label}: no compiled rung measured beside fused_adamw, so no pay-back to draw")
    drawn = [(label, points) for label, points in drawn if points]
    if not drawn:
        return None
    fig, axes = plt.subplots(1, len(drawn), figsize=(5.6 * len(drawn), 3.4), squeeze=False)
    for ax, (label, points) in zip(axes[0], drawn):
        payback_axes(ax, label, points)
    fig.tight_layout()
    plt.show()
    return fig
