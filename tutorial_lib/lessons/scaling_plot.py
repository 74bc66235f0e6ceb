"""Notebook 06's pictures: the reference run's weak and strong curves with the ideal line beside this server's
own points, and the race's wall time as stacked bars (what a person waits, part by part).

    tl.scaling_plot.curves(F, here_weak, here_strong, here_label, gpu_point)   # F: the reference record's figures
    tl.scaling_plot.wait_bars(tl.scaling_study.race_rows(F))
"""
from __future__ import annotations

from . import scaling, scaling_study


def _curve(ax, points, style, label):
    ax.plot([p.gpus for p in points], [p.img_s for p in points], style, label=label)
    for p in points[1:]:
        ax.annotate(f"{100 * p.efficiency:.0f}%", (p.gpus, p.img_s), textcoords="offset points", xytext=(4, -12),
                    fontsize=8)


def _ideal(ax, one_img_s, counts):
    ax.plot(counts, [one_img_s * n for n in counts], "--", color="gray", label="ideal: N x one")


def curves(fig: dict | None, weak: list, strong: list, here: str, gpu_point=None, where: str = "the reference run"):
    """Two axes. Left: the reference run's weak and strong img/s against GPUs, the ideal line, and `gpu_point`
    (this server's one-GPU result, a star) where there is one. Right: this server's own `weak` and `strong`
    points (tl.scaling.Point lists, the first the baseline), labelled `here` (e.g. 'CPU processes (gloo)')."""
    import matplotlib.pyplot as plt

    f, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    if fig:
        w, s = scaling_study.points(fig, "weak"), scaling_study.points(fig, "strong")
        _ideal(left, w[0].img_s, fig["counts"])
        _curve(left, w, "o-", f"weak, {fig['batch_per_gpu']} per GPU")
        _curve(left, s, "s-", f"strong, global batch {s[0].global_batch}")
        if gpu_point is not None:
            r = scaling.as_dict(gpu_point)
            left.plot([1], [r["throughput_img_s"]], "*", ms=12, color="C3", label=f"your GPU ({r['device']})")
        left.set_xticks(fig["counts"])
    left.set_title(where, fontsize=9)
    left.set_xlabel("GPUs")
    if weak:
        counts = sorted({p.gpus for p in weak + strong})
        _ideal(right, weak[0].img_s, counts)
        _curve(right, weak, "o-", "weak")
        if strong:
            _curve(right, strong, "s-", "strong")
        right.set_xticks(counts)
    right.set_title(f"here: {here}", fontsize=9)
    right.set_xlabel(here.split(" (")[0])
    for ax in (left, right):
        ax.set_ylabel("images/s")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    f.tight_layout()
    return f


PARTS = (("seconds_to_target", "training"), ("start_s", "start-up"), ("compile_s", "first step (compile)"),
         ("validation_to_target_s", "validation"))


def wait_bars(rows: list[dict], ax=None):
    """The race's wall time to the target as stacked horizontal bars, one per run (tl.scaling_study.race_rows):
    training, start-up, the first step with its compilation, validation. Each bar ends with the wait and how many
    times sooner than one GPU it is, waiting and training."""
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("wait_s")]
    ax = ax or plt.subplots(figsize=(9, 1.0 + 0.45 * len(rows)), layout="constrained")[1]
    labels = [r["about"] + (f", {r['global_batch']} per GPU" if r["gpus"] == 1 else "") for r in rows]
    left = [0.0] * len(rows)
    for i, (key, name) in enumerate(PARTS):
        widths = [r.get(key) or 0.0 for r in rows]
        ax.barh(labels, widths, left=left, color=f"C{i}", label=name)
        left = [a + b for a, b in zip(left, widths)]
    for y, r in enumerate(rows):
        text = f" {r['wait_s']:.0f} s" + (f": {r['sooner_waiting']:.2f}x sooner waiting, {r['sooner']:.2f}x training"
                                            if r.get("sooner_waiting") and y else "")
        ax.text(r["wait_s"], y, text, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.6 * max(left))
    ax.set_xlabel("seconds to the target (wall time)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=len(PARTS), frameon=False)
    return ax
