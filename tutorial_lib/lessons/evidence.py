"""The evidence behind notebook 04's sentences, computed rather than typed: which rung of the eager ladder gains
most, whether the engine keeps up with a bare loop (measured in alternated pairs, so that other work on the
machine moves both), and whether a lower precision still learns (validation accuracy and images to a target
per seed, the seed spread beside them). Every verdict follows the one rule of `noise`: two figures differ when the
interval of their ratio excludes 1.
"""
from __future__ import annotations

import contextlib
import io
import math
import statistics

import torch

from . import bench, ladder, noise
from .. import engine, reference
from ..config import TrainConfig
from ..precision import cpu_bf16_native, cpu_bf16_note


def largest_gain(rows: list[dict], among: list[str] | None = None) -> tuple[str, float, str] | None:
    """(rung, x over the row it changes, verdict) of the rung with the largest gain among `among` (all measured
    rungs when None) that the rule calls faster; None when none is."""
    got = {r["rung"]: r for r in rows if not r["skipped"]}
    said = ladder.verdicts(rows)
    gains = [(got[k]["img_s"] / got[b]["img_s"], k) for k, b in ladder.compared_with(rows).items()
             if (among is None or k in among) and " faster " in said[k]]
    if not gains:
        return None
    ratio, rung = max(gains)
    return rung, ratio, said[rung]


def bf16_line(rows: list[dict]) -> str:
    """bf16 against fp32 and, where a row between them was measured (TF32 on a GPU), against the row it changes:
    on one GPU run bf16 can be far faster than fp32 and only a little faster than TF32, so each verdict names
    its baseline."""
    got = {r["rung"] for r in rows if not r["skipped"]}
    if not {"fp32", "bf16"} <= got:
        return "skipped here (its row says why)" if any(r["rung"] == "bf16" for r in rows) else "not measured"
    words = [ladder.against(rows, "bf16", "fp32")]
    base = ladder.compared_with(rows).get("bf16", "fp32")
    if base != "fp32":
        words.append(f"{ladder.against(rows, 'bf16', base)} (the row it changes)")
    return "; ".join(words)


def mean_step_ms(r: dict) -> float:
    """A measured row's mean step: its batch over its img/s (what the run's clock sees, data waits included)."""
    return 1000 * r["batch"] / r["img_s"]


def payback_lines(rows: list[dict], eager: str = "fused_adamw",
                  compiled: tuple[str, ...] = ("compile", "reduce_overhead", "step_graph")) -> list[str]:
    """For each compiled rung: its compile time, its mean step against the eager rung's, the verdict of the rule
    (ladder.against), and after how many steps the compile time is paid back. A pay-back is only stated for a
    gain the rule calls faster; otherwise the steps it would take are given as what the means say, not more.
    [] when the rows hold no compiled rung or no `eager` row (a CPU run)."""
    got = {r["rung"]: r for r in rows if not r["skipped"]}
    if eager not in got or not set(compiled) & set(got):
        return []
    base = mean_step_ms(got[eager])
    lines = []
    for name in [n for n in compiled if n in got]:
        r, said = got[name], ladder.against(rows, name, eager)
        verdict = noise.compare(ladder.figure(r), ladder.figure(got[eager])).verdict  # the one `said` words
        ms = mean_step_ms(r)
        steps = 1000 * r["compile_s"] / (base - ms) if base > ms else None
        if steps is None:
            pays = "its mean step is not shorter, so nothing pays the compile back"
        elif verdict == "higher":
            pays = f"pays back after {steps:,.0f} steps"
        else:
            gain = "within noise" if verdict == "equal" else "not settled"
            pays = f"the gain is {gain}, so no pay-back is shown (at these means: after {steps:,.0f} steps)"
        first = got.get("compile", {}).get("compile_s") or 0
        cached = (" (Inductor's on-disk cache already held most of its kernels, compiled for the rungs above: on a "
                  "fresh machine it pays the compile rung's time once)"
                  if name != "compile" and r["compile_s"] < 0.25 * first else "")
        lines.append(f"{name}: compiled in {r['compile_s']:.0f} s, mean step {ms:.2f} against {base:.2f} ms "
                     f"({said}): {pays}{cached}")
    return lines


def bench_reference_lines(records: list[dict]) -> list[str]:
    """The bench at the optimized recipe as each card's reference run stored it (figures.bench_optimized), judged
    again by today's rule (bench.verdict): from the windows a record keeps; a record made before they were kept
    holds single figures, which only the cross-process floor can judge, and the line says so."""
    lines = []
    for rec in records:
        for loader, b in rec["figures"].get("bench_optimized", {}).items():
            kept = b.get("windows") or {}
            figures = {m: bench.Measurement(m, b[m], min(kept.get(m) or [b[m]]), max(kept.get(m) or [b[m]]),
                                            len(kept.get(m) or []), 0, 0, [], kept.get(m) or [])
                       for m in bench.MEASURES if m in b}
            if "io" not in figures or "synthetic" not in figures:
                continue
            device = "cuda" if "CPU" not in b.get("device", rec.get("card", "")) else "cpu"
            text = bench.verdict(figures, TrainConfig(**(b.get("config") or {})), device, b.get("waited"))[1]
            head = text.splitlines()[0]
            single = "" if kept else " (single figures: this record kept no windows)"
            lines += [f"-- loader={loader} on {reference.where(rec)}: IO {b['io']:,.0f}, SYNTHETIC "
                      f"{b['synthetic']:,.0f}, FULL {b.get('full', float('nan')):,.0f} img/s", f"   {head}{single}"]
    return lines


# The pairs' own folder: in runs/04_ladder they would replace the gpu_resident rung that ladder.gather reads.
ENGINE_VS_BARE_DIR = "runs/04_engine_vs_bare"


def engine_vs_bare(sizes: ladder.Sizes, pairs: int = 3, timed: int = 6, overrides: dict | None = None,
                   threads: int | None = None) -> dict:
    """The last rung in the engine and in the bare loop, measured in `pairs` pairs in this process with the order
    alternating (engine first, then bare loop first, ...), each run with `timed` timed steps. Both runs of a pair
    see the same machine, so other work on it moves both. Each run counts by its fast steps (p10 step time): a
    loop's own cost is in every step, other work on the machine only in some. `threads`: PyTorch's CPU threads
    during the pairs (1 on a small shared CPU: every parallel operation waits for all its threads, so one thread
    that loses its core stalls the whole step, in whichever run it happens). Returns each pair's ratio (engine /
    bare loop, images per second of the p10 step) and the verdict of the rule on their mean (noise.of_runs against
    1; separate runs, so the floor applies). The runs write under ENGINE_VS_BARE_DIR unless overrides name an
    out_dir."""
    overrides = {"out_dir": ENGINE_VS_BARE_DIR, **(overrides or {})}
    plan = {rung.name: (rung, cfg) for rung, cfg, _ in ladder.configs(sizes, overrides, ladder.device_type(overrides))}
    (engine_rung, cfg), (bare_rung, _) = plan["gpu_resident"], plan["bare_loop"]
    cfg = cfg.replace(steps=cfg.timing_warmup + timed)
    ratios, device, before = [], None, torch.get_num_threads()
    try:
        if threads:
            torch.set_num_threads(threads)
        for i in range(pairs):
            order = [(engine_rung, "engine"), (bare_rung, "bare")][:: 1 if i % 2 == 0 else -1]
            got = {name: ladder.measure(rung, cfg) for rung, name in order}
            ratios.append(got["bare"]["step_ms_p10"] / got["engine"]["step_ms_p10"])
            device = got["engine"]["device"]
    finally:
        torch.set_num_threads(before)
    mean = noise.of_runs(ratios, "pairs")
    r = noise.compare(mean, noise.Figure.of(1.0))
    words = {"equal": "within noise: the engine runs as fast as the bare loop",
             "lower": "the engine is slower than the bare loop", "higher": "the engine is faster than the bare loop"}
    return {"ratios": ratios, "mean": mean.value, "low": r.low, "high": r.high, "device": device,
            "verdict": words.get(r.verdict) or f"engine against bare loop {r.words()}", "timed_steps": timed}


def race_precisions(precisions, device: str) -> tuple[tuple, str | None]:
    """The race's precisions that run at a CPU's pace on `device` ('cuda' or 'cpu'), and the line that says what
    was left out: bf16 on a CPU without bf16 instructions, which emulates it at many times fp32's time."""
    if device == "cuda" or "bf16" not in precisions or cpu_bf16_native():
        return tuple(precisions), None
    return tuple(p for p in precisions if p != "bf16"), cpu_bf16_note()


def precision_runs(base: TrainConfig, precisions, seeds, out_dir: str = "runs/04_precisions") -> dict:
    """Train `base` once per precision and seed (the seed draws the weights, the data and its order); returns
    {precision: [Result per seed]}. `base` should validate along the way (eval_every) for images to target. A CPU
    that emulates bf16 leaves bf16 out, and a printed line says so (race_precisions)."""
    precisions, why = race_precisions(precisions, ladder.device_type({"device": base.device}))
    if why:
        print(why)
    runs = {}
    for precision in precisions:
        for seed in seeds:
            cfg = base.replace(precision=precision, seed=seed, resume=False,
                               out_dir=f"{out_dir}/{precision}_seed{seed}")
            with contextlib.redirect_stdout(io.StringIO()):  # the runs' own validation lines
                runs.setdefault(precision, []).append(engine.train(cfg))
    return runs


def images_to(result, target: float) -> int | None:
    """Training images until validation accuracy first reached `target` (its val_history), or None."""
    return next((step * result.global_batch for step, _, acc in result.val_history or [] if acc >= target), None)


def last_loss(result, tail: int = 5) -> float:
    """The mean training loss of the run's last `tail` steps (the end of its loss curve)."""
    losses = result.loss[-tail:]
    return sum(losses) / len(losses)


def _judge(values: dict, against: str, higher: str, lower: str, extra: float = 0.0) -> dict:
    """precision -> the rule's verdict on the mean of its seeds against `against`'s (noise.of_runs: the seeds
    are the samples, so no cross-process floor). `extra`: the relative standard error to use instead where the
    same seed moves more between runs than the seeds differ (`repeatability`): the larger of the two."""
    mean = {p: _widened(noise.of_runs(v, "seeds"), extra) for p, v in values.items()}
    said = {"equal": f"no difference from {against} shown", "higher": f"{higher} than {against}",
            "lower": f"{lower} than {against}"}
    out = {}
    for p, m in mean.items():
        r = noise.compare(m, mean[against], separate=False)
        out[p] = "the reference" if p == against else f"{r}, {said.get(r.verdict) or r.words()}"
    return out


def _widened(f: noise.Figure, extra: float) -> noise.Figure:
    return noise.Figure(f.value, max(f.se, extra), f.n, f.spread, f.unit) if extra else f


def repeatability(values: dict, record: dict | None) -> tuple[str | None, float]:
    """How far each precision's seeds moved between this race and a reference run of it on the same kind of card
    (the mean relative change at a fixed seed), against the yardstick of the race: how much its seeds differ (their
    relative standard deviation). Returns a line to print where a run-to-run change is the larger, and the relative
    standard error of a mean over the seeds with that change in place of the seeds' spread (0.0 where the seeds'
    spread is the larger everywhere, or there is no record): the verdicts then use the larger."""
    f = (record or {}).get("figures", {})
    worst = None
    for p, now in values.items():
        moves = [abs(a - b) / b for a, b in zip(now, f.get(f"{p}_accuracy") or []) if a is not None and b]
        if not moves or len(now) < 2:
            continue
        change, seeds = statistics.fmean(moves), noise.of_runs(now)
        stick = seeds.se * math.sqrt(seeds.n)
        if change > stick and (worst is None or change > worst[1]):
            worst = (p, change, stick, seeds.n)
    if worst is None:
        return None, 0.0
    p, change, stick, n = worst
    return (f"{p} moved {100 * change:.1f}% at a fixed seed since the reference, more than its seeds differ\n"
            f"({100 * stick:.1f}%): the verdicts above use the larger"), change / math.sqrt(n)


def precision_verdicts(runs: dict, target: float, against: str = "fp32", tail: int = 5, extra: float = 0.0) -> list[dict]:
    """Per precision: each seed's final validation accuracy, images to `target` and mean loss of the last `tail`
    steps, each judged against `against` by the seed spread: the seeds' ranges overlap -> no difference shown."""
    acc = {p: [r.val_accuracy for r in rs] for p, rs in runs.items()}
    loss = {p: [last_loss(r, tail) for r in rs] for p, rs in runs.items()}
    said_acc, said_loss = _judge(acc, against, "higher", "lower", extra), _judge(loss, against, "higher", "lower")
    return [{"precision": p, "accuracy": acc[p], "images_to_target": [images_to(r, target) for r in rs],
             "last_loss": loss[p], "accuracy_verdict": said_acc[p], "loss_verdict": said_loss[p],
             "skipped_steps": [r.fp16_skipped_steps for r in rs], "device": rs[0].device} for p, rs in runs.items()]


def precision_reference(record: dict, extra: float = 0.0) -> list[dict]:
    """The precision race as a GPU reference run recorded it (notebook 04's race cell), as rows for
    precision_table: each precision judged again against fp32 by the spread of its seeds, as precision_verdicts
    does (the record keeps each seed's figures, so the words follow the rule of today's workbook)."""
    f = record["figures"]
    got = [p for p in ("fp32", "bf16", "fp16") if f"{p}_accuracy" in f]
    acc = {p: f[f"{p}_accuracy"] for p in got}
    loss = {p: f[f"{p}_last_loss"] for p in got}
    said_acc, said_loss = _judge(acc, "fp32", "higher", "lower", extra), _judge(loss, "fp32", "higher", "lower")
    return [{"precision": p, "accuracy": acc[p], "images_to_target": f[f"{p}_images_to_target"], "last_loss": loss[p],
             "accuracy_verdict": said_acc[p], "loss_verdict": said_loss[p],
             "skipped_steps": f.get(f"{p}_skipped_steps")} for p in got]


def same_race(verdicts: list[dict], record: dict | None) -> bool:
    """Whether a reference run of the race holds this run's figures seed for seed (the GPU run that records the
    reference shows its own run as the reference): then it is no second run to hold this one against."""
    f = (record or {}).get("figures", {})
    return bool(verdicts) and all(f.get(f"{v['precision']}_accuracy") == list(v["accuracy"])
                                  and f.get(f"{v['precision']}_last_loss") == list(v["last_loss"]) for v in verdicts)


def precision_table(rows: list[dict], target: float) -> str:
    """The comparison as a Markdown table: one row per precision, the seeds' values side by side."""
    def seeds(values, fmt):
        return ", ".join("not reached" if v is None else format(v, fmt) for v in values)

    lines = [f"| precision | validation accuracy per seed | against fp32 | images to {100 * target:.0f}% | "
             "loss of the last steps | against fp32 |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        accuracy = seeds([100 * a for a in r["accuracy"]], ".1f")
        lines.append(f"| {r['precision']} | {accuracy} % | {r['accuracy_verdict']} "
                     f"| {seeds(r['images_to_target'], ',')} | {seeds(r['last_loss'], '.3f')} | {r['loss_verdict']} |")
    return "\n".join(lines)


# What each notebook's run of the baseline configuration (configs/baseline.yaml) does besides the step itself.
BASELINE_RUNS = (
    ("01_baseline", "notebook 01: 1,500 steps, DataLoader workers, TensorBoard, validation at the end"),
    ("02_step_breakdown", "notebook 02, unprofiled: 60 steps, DataLoader workers, TensorBoard, no validation"),
    ("04_ladder", "notebook 04, rung fp32: 150 timed steps, DataLoader workers, foreach AdamW, no TensorBoard"),
)


def baseline_runs(folder=None) -> list[dict]:
    """The fp32 baseline step as each notebook's GPU reference run measured it: card, date, img/s with the
    interval of its mean (noise.of_steps; notebook 02 keeps only a median), and what that run does besides."""
    out = []
    for name, what in BASELINE_RUNS:
        rec = reference.load(name, folder)
        if rec is None:
            continue
        f = rec["figures"]
        if name == "01_baseline":
            batch, median, p10, p90, img_s = (f["batch"], f["step_median_ms"], f["step_p10_ms"], f["step_p90_ms"],
                                              f["throughput_img_s"])
            steps = f.get("steps", 0)
        elif name == "02_step_breakdown":
            batch = 256  # notebook 02's GPU size, that of notebook 01
            median = p10 = p90 = f["fp32_unprofiled_step_ms"]
            img_s, steps = 1000 * batch / median, 0  # a median alone: a single figure
        else:
            row = next(r for r in f["rows"] if r["rung"] == "fp32")
            batch, median, p10, p90 = row["batch"], row["step_ms"], row["step_ms_p10"], row["step_ms_p90"]
            img_s, steps = row["img_s"], row.get("steps", 0)
        out.append({"name": name, "what": what, "card": rec["card"], "date": rec["date"], "torch": rec["torch"],
                    "median_ms": median, "figure": noise.of_steps(img_s, median, p10, p90, steps, None, batch)})
    return out


def baseline_lines(runs: list[dict]) -> list[str]:
    """One line per run, and per card whether the runs agree: within noise of the first run on that card, or
    not (then the runs differ in what they do besides the step, or in when they ran: see 01_baseline_check)."""
    lines = []
    for card in dict.fromkeys(r["card"] for r in runs):
        same = [r for r in runs if r["card"] == card]
        first = same[0]
        lines.append(f"{card}, torch {', '.join(dict.fromkeys(r['torch'] for r in same))}:")
        for r in same:
            f = r["figure"]
            said = "" if r is first else "  " + noise.versus(f, first["figure"]).replace(
                "faster", f"faster than {first['name']}").replace("slower", f"slower than {first['name']}").replace(
                "within noise", f"within noise of {first['name']}")
            lines.append(f"  {r['name']:18s} median step {r['median_ms']:5.1f} ms, {noise.shown(f)} img/s, "
                         f"{r['date']}{said}  | {r['what']}")
    return lines


def window_lines(windows: list[float], new_epoch: list[int] | None) -> list[str]:
    """The long run's windows: the first and last of those that begin no epoch (does it slow down as the card
    heats up?), and those that begin a new pass over the DataLoader (its workers start again, unless persistent)
    against the others."""
    if not windows:
        return []
    begins = set(new_epoch or ())
    starts = [w for i, w in enumerate(windows) if i in begins]
    others = [w for i, w in enumerate(windows) if i not in begins]
    steady = others or windows
    lines = [f"  the 1,500-step run window by window: first {steady[0]:.1f} ms, last {steady[-1]:.1f} ms per step"
             + (" (of the windows that begin no epoch)" if starts and others else "")]
    if starts and others:
        lines.append(f"  windows that begin an epoch (new DataLoader workers) {statistics.mean(starts):.1f} ms per "
                     f"step, the others {statistics.mean(others):.1f} ms ({len(starts)} and {len(others)} windows)")
    return lines


def baseline_check_lines(folder=None) -> list[str]:
    """What the baseline study (python -m tutorial_lib study baseline) measured on one card, or how to run it."""
    rec = reference.load("01_baseline_check", folder)
    if rec is None:
        return ["(the study that measures these differences on one card has not run on a GPU yet: "
                "python -m tutorial_lib study baseline --reference)"]
    f = rec["figures"]
    lines = [f"On {reference.where(rec)} (python -m tutorial_lib study baseline):",
             f"  by hand, cuDNN autotuner on {f['by_hand_benchmark_on_ms']:.1f} ms per step; in a fresh process "
             f"with it off {f['by_hand_benchmark_off_ms']:.1f} ms"]
    if "by_hand_benchmark_on_after_off_ms" in f:
        lines.append(f"  ... and there, switched on after those steps: {f['by_hand_benchmark_on_after_off_ms']:.1f} ms "
                     "(the convolutions keep the algorithms chosen first)")
    for name, what in (("engine_60", "60 steps"), ("engine_rung", "04's rung"), ("engine_long", "1,500 steps")):
        windows = [1000 * f["batch"] / w for w in f.get(f"{name}_window_ms") or [] if w]  # each window's img/s
        band = noise.of_windows(windows, f[f"{name}_img_s"]) if len(windows) > 1 else noise.of_steps(
            f[f"{name}_img_s"], f[f"{name}_median_ms"], f[f"{name}_p10_ms"], f[f"{name}_p90_ms"],
            f.get(f"{name}_steps", 0), None, f.get("batch"))
        lines.append(f"  engine, {what:12s} median step {f[f'{name}_median_ms']:.1f} ms, {noise.shown(band)} img/s")
    lines += window_lines(f.get("engine_long_window_ms") or [], f.get("engine_long_new_epoch_windows"))
    if "engine_long_start_sm_clock_mhz" in f:
        lines.append(f"  its GPU: SM clock {f['engine_long_start_sm_clock_mhz']:.0f} -> "
                     f"{f['engine_long_end_sm_clock_mhz']:.0f} "
                     f"MHz, power {f['engine_long_start_power_w']:.0f} -> {f['engine_long_end_power_w']:.0f} W, "
                     f"{f['engine_long_start_temperature_c']:.0f} -> {f['engine_long_end_temperature_c']:.0f} C")
    return lines
