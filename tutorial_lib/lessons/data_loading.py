"""Notebook 03 on a GPU, as one study: is the GPU waiting for data?

    python -m tutorial_lib study data_loading --out build/gpu     # a GPU node: about 2-3 minutes
    python -m tutorial_lib study data_loading --small             # the same cases, tiny, on this machine

The CIFAR-stem ResNet-18 in bf16 + channels_last on the generated `shapes` set (CIFAR's shape and size, no
download): IO / SYNTHETIC / FULL (lessons.bench) of the CPU DataLoader, the prefetcher, the imagefolder PNG
files and loader=gpu_resident, at batch 256 and 1024; with 2 or more GPUs (on a CPU: 2 gloo processes) also the
bench under torchrun, where every rank measures. Writes data_loading.json (every bench) and data_loading.md (the
table) into `out`. The check: on a GPU every gpu_resident row's FULL reaches SYNTHETIC within the windows' spread
(the input costs the step nothing measurable).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from . import bench, noise
from .size import Size
from .. import data, engine, imagefolder
from ..config import TrainConfig
from ..results import atomic_write_text

CASES = (  # name, the keys it changes, big batch (fewer timed steps at batch 1024)
    ("dataloader", {}, False),
    ("prefetcher", {"loader": "prefetcher"}, False),
    ("imagefolder", {"dataset": "imagefolder"}, False),
    ("gpu_resident", {"loader": "gpu_resident"}, False),
    ("dataloader", {}, True),
    ("gpu_resident", {"loader": "gpu_resident"}, True),
)


@dataclasses.dataclass(frozen=True)
class Sizes:
    batch: int
    big_batch: int
    steps: int  # timed steps per measure at `batch`, in windows of `window` steps
    window: int
    big_steps: int  # at `big_batch`
    big_window: int
    model: str
    precision: str
    train_size: int | None
    workers: int  # DataLoader workers of the DataLoader, prefetcher and imagefolder rows
    warmup: int  # untimed steps before each measure
    big_cases: bool  # also the cases at `big_batch` (small sizes: every loader once is the same code)


GPU = Sizes(256, 1024, 200, 20, 60, 6, "resnet18", "bf16", None, 8, 5, True)
SMALL = Sizes(8, 16, 4, 2, 2, 2, "resnet18_imagenet", "fp32", 64, 1, 1, False)  # fp32: bf16 autocast crawls on a CPU


def base_config(sizes: Sizes, out: Path) -> TrainConfig:
    return TrainConfig(dataset="shapes", model=sizes.model, precision=sizes.precision, channels_last=True,
                       num_workers=sizes.workers, train_size=sizes.train_size, timing_warmup=sizes.warmup,
                       tensorboard=False, progress=False, out_dir=str(out / "runs"))


def study(size: Size, out: Path) -> dict:
    """Every case of CASES through the bench, the table, and the bench under torchrun; no reference record
    (notebook 03's own GPU figures come from its cells: notebooks/reference/03_*.json)."""
    sizes, out = size.pick(SMALL, GPU), Path(out)
    base = base_config(sizes, out).replace(data_dir=str(_imagefolder(sizes, out)))
    records = []
    for name, keys, big in (case for case in CASES if sizes.big_cases or not case[2]):
        batch = sizes.big_batch if big else sizes.batch
        label = f"b{batch} {name}"
        t0 = time.perf_counter()
        r = bench.bench(base.replace(batch_size=batch, out_dir=f"{base.out_dir}/b{batch}_{name}", **keys),
                        steps=sizes.big_steps if big else sizes.steps, window=sizes.big_window if big else sizes.window)
        print(f"-- {label} ({time.perf_counter() - t0:.0f} s)\n{r.summary()}", flush=True)
        records.append({"case": label, **dataclasses.asdict(r)})
    atomic_write_text(out / "data_loading.json", json.dumps(records, indent=1))
    text = table(records)
    atomic_write_text(out / "data_loading.md", text + "\n")
    print(text)
    if torch.cuda.device_count() >= 2 or size.small:
        ranks(base.replace(batch_size=sizes.batch, loader="gpu_resident", out_dir=f"{base.out_dir}/ddp2"), sizes)
    return {}


def _imagefolder(sizes: Sizes, out: Path) -> Path:
    """Where the PNG files are: data/ (staged by `make data`, else written now: 60,000 files, about a minute),
    or at small sizes a few of them under `out`."""
    if sizes.train_size is not None:
        imagefolder.write_imagefolder(out / "data" / "imagefolder", sizes.train_size, val_size=8)
        return out / "data"
    if not data.staged("data")["imagefolder"]:
        t0 = time.perf_counter()
        data.fetch("imagefolder", "data")
        print(f"imagefolder: 60,000 PNG files written into data/ in {time.perf_counter() - t0:.0f} s", flush=True)
    return Path("data")


def table(records: list[dict]) -> str:
    """IO / SYNTHETIC / FULL of every case, FULL's spread and FULL / SYNTHETIC, and the gpu_resident check."""
    lines = [f"IO / SYNTHETIC / FULL in img/s on {records[0]['device']} (slowest rank; FULL's windows beside it)", "",
             "| case | IO | SYNTHETIC | FULL | FULL windows | FULL / SYNTHETIC | wait ms | bound |",
             "|---|---|---|---|---|---|---|---|"]
    for rec in records:
        f = rec["figures"]
        lines.append(f"| {rec['case']} | {f['io']['img_s']:,.0f} | {f['synthetic']['img_s']:,.0f} | "
                     f"{f['full']['img_s']:,.0f} | {f['full']['img_s_low']:,.0f}-{f['full']['img_s_high']:,.0f} | "
                     f"{resident_ratio(rec)} | {rec['full_data_wait_ms']:.2f} | {bench.LABELS.get(rec['bound'], rec['bound'])} |")
    lines += ["", *(f"{rec['case']}:\n{rec['verdict']}" for rec in records), "", check_line(records)]
    return "\n".join(lines)


def resident_ratio(rec: dict) -> str:
    """FULL / SYNTHETIC of a record, with its interval (bench.behind)."""
    figures = {m: bench.Measurement(**{"per_rank_img_s": [], **rec["figures"][m]}) for m in ("full", "synthetic")}
    return str(bench._cmp(figures["full"], figures["synthetic"]))


def check_line(records: list[dict]) -> str:
    """The check of a GPU run: with loader=gpu_resident the input is no longer the limit, by the rule of the
    verdicts (bench.bound: no gpu_resident row input-bound, steadily or in bursts). On a CPU the input and the
    step share the cores, so it proves nothing there."""
    rows = [rec for rec in records if "gpu_resident" in rec["case"]]
    judged = {rec["case"]: bench.bound({m: bench.Measurement(**{"per_rank_img_s": [], **f})
                                        for m, f in rec["figures"].items()}) for rec in rows}
    below = [case for case, kind in judged.items() if kind in ("input", "bursts")]
    cpu = " (a check for a GPU: on a CPU the input and the step share the cores)" if records[0]["device"].startswith(
        "CPU") else ""
    ratios = ", ".join(f"{rec['case']} {resident_ratio(rec)}" for rec in rows)
    verdict = f"FAIL: input-bound in {', '.join(below)}" if below else "PASS"
    return f"gpu_resident: the input is not the limit (FULL/SYNTHETIC {ratios}): {verdict}{cpu}"


def keeps_up(row: dict) -> str:
    """What one pipeline's IO / SYNTHETIC / FULL (bench Measurements, e.g. bench.from_reference) say of its loader,
    for notebook 03's GPU summary, by the rule of the verdicts (bench.bound): the loader keeps up when its slowest
    window stays above SYNTHETIC; FULL against SYNTHETIC is the ratio of their means with its interval."""
    io_, syn = row["io"], row["synthetic"]
    kind = bench.bound(row)
    full = f"FULL/SYNTHETIC {bench.behind(row, 'bursts')}".replace("FULL/SYNTHETIC FULL/SYNTHETIC", "FULL/SYNTHETIC")
    if kind == "contended":
        return f"IO keeps up in every window, yet {full}: the input and the step slow each other."
    dip = f"IO's slowest window ({io_.img_s_low:,.0f} img/s) is below SYNTHETIC ({syn.img_s:,.0f})"
    if kind == "bursts":
        return f"{dip}: the loader delivers in bursts, and the step waits in the slow ones ({full})."
    if kind == "input":
        return f"IO ({io_.img_s:,.0f} img/s) is below SYNTHETIC ({syn.img_s:,.0f}): the loader is the limit."
    if io_.img_s_low >= syn.img_s:
        return (f"IO's slowest window ({io_.img_s_low:,.0f} img/s) is above SYNTHETIC ({syn.img_s:,.0f}): "
                "the loader keeps up on this card at this batch.")
    return f"{dip}, but the batches queued bridged it: {full}, so the loader keeps up on average."


def ranks(cfg: TrainConfig, sizes: Sizes) -> dict:
    """The bench under torchrun on 2 processes (GPUs, or gloo on a CPU): every rank measures, the job's figure
    is its slowest rank's. Returns bench.json's figures."""
    print("-- DDP on 2 processes, loader=gpu_resident: every rank measures, the job's figure is the slowest")
    engine.launch(cfg, nproc=2, command="bench", args=("--steps", str(sizes.steps), "--window", str(sizes.window)),
                  extra_env={"OMP_NUM_THREADS": "4"} if torch.cuda.is_available() else None)
    figures = json.loads((Path(cfg.out_dir) / "bench.json").read_text())["figures"]
    print({m: [round(x) for x in f["per_rank_img_s"]] for m, f in figures.items()}, "img/s per rank", flush=True)
    return figures


# ---------------------------------------------------------------------------------------- notebook 03's cells
# The lesson stays on the screen; the record-keeping of its cells lives here.
def measurer(rows: list, steps: int, window: int, folder: str = "runs/03_data_loading"):
    """measure(label, config): bench `config`, print its lines, keep (label, result) in `rows` for the summary."""
    def measure(label: str, config: TrainConfig, measures=bench.MEASURES):
        out_dir = f"{folder}/" + label.split(":")[0].replace(" ", "_")
        result = bench.bench(config.replace(out_dir=out_dir), steps=steps, window=window, measures=measures)
        print(result.summary())
        rows.append((label, result))
        return result
    return measure


def ladder_figures(key: str, label: str, result) -> dict:
    """The figures of one step of the lesson, named for the reference file 03_loader_ladder."""
    out = {f"{key}_label": label, f"{key}_bound": result.bound, f"{key}_wait_ms": result.full_data_wait_ms}
    for m, f in result.figures.items():
        out.update({f"{key}_{m}": f.img_s, f"{key}_{m}_low": f.img_s_low, f"{key}_{m}_high": f.img_s_high})
    return out


def sweep_lines(sweep: dict, base) -> list[str]:
    """Each row of the num_workers sweep judged against the baseline's SYNTHETIC (the sweep does not measure the
    step), then what the sweep's last step changed."""
    lines = []
    for w, r in sweep.items():
        row = {**r.figures, "synthetic": base.figures["synthetic"]}
        vs = noise.versus(bench.figure(row["full"]), bench.figure(row["synthetic"]))
        lines.append(f"num_workers={w}:  IO {r.img_s('io'):>9,.0f}   FULL {r.img_s('full'):>9,.0f} img/s   "
                     f"FULL against SYNTHETIC {vs}; bound: {bench.bound_label(row)}")
    (a, ra), (b, rb) = list(sweep.items())[-2:]
    grew = {m: noise.relation(bench.figure(rb.figures[m]), bench.figure(ra.figures[m])) for m in ("io", "full")}
    said = {m: noise.versus(bench.figure(rb.figures[m]), bench.figure(ra.figures[m])) for m in ("io", "full")}
    held = grew["full"] == "≈" and grew["io"] == ">"
    lines.append(f"From {a} to {b} workers: IO {said['io']}, FULL {said['full']}"
                 + (": FULL stopped rising while IO still grew; the last row's bound says what holds it." if held
                    else "."))
    return lines


def plot_sweep(sweep: dict, base, title: str):
    import matplotlib.pyplot as plt  # most of a second to import: only plots need it

    workers = list(sweep)
    fig = plt.figure(figsize=(6.5, 3.2))
    plt.plot(workers, [sweep[w].img_s("io") for w in workers], "o-", label="IO: the loader alone")
    plt.plot(workers, [sweep[w].img_s("full") for w in workers], "s-", label="FULL: training")
    plt.axhline(base.img_s("synthetic"), color="gray", ls="--", label="SYNTHETIC: the step alone")
    plt.yscale("log"); plt.xticks(workers)
    plt.xlabel("num_workers"); plt.ylabel("images/s"); plt.title(title, fontsize=9)
    plt.legend(fontsize=8); plt.tight_layout(); plt.show()
    return fig


def first_batches(cfg: TrainConfig, workers: int, epochs: int = 5) -> dict[bool, list[float]]:
    """persistent_workers -> ms to the first batch of each of `epochs` epochs of two batches each."""
    first = {}
    for persistent in (False, True):
        inp = data.build_input(cfg.replace(num_workers=workers, persistent_workers=persistent,
                                           train_size=2 * cfg.batch_size), "train")
        first[persistent] = []
        for epoch in range(epochs):
            t0 = time.perf_counter()
            batches = inp.epoch(epoch)
            next(batches)
            first[persistent].append(1e3 * (time.perf_counter() - t0))
            for _ in batches:  # the rest of the epoch, untimed: only a finished epoch hands its workers on
                pass
    return first


def first_batch_lines(first: dict[bool, list[float]], workers: str) -> list[str]:
    """The first batch of every epoch with and without persistent workers, and epochs 1+ by the noise rule."""
    n = len(first[True])
    lines = [f"persistent_workers={p!s:5s}  first batch of epochs 0-{n - 1}: " + ", ".join(f"{ms:.0f}" for ms in v)
             + " ms" for p, v in first.items()]
    later = {p: noise.of_runs(ms[1:], "epochs") for p, ms in first.items()}  # the mean of epochs 1+
    lines.append(f"Epochs 1-{n - 1}: first batch after {later[True].value:.0f} ms with persistent workers, "
                 f"{later[False].value:.0f} ms without: " + (
                     f"only epoch 0 paid the start-up of {workers}."
                     if noise.relation(later[True], later[False]) == "<" else
                     f"no difference beyond the epochs' spread: starting {workers} costs little here."))
    return lines


def plot_ladder(rows: list[tuple[str, dict]], title: str):
    """One row per step of the lesson: IO, SYNTHETIC and FULL each as a range from its slowest to its fastest
    window, a dot at its mean; where FULL's range sits below SYNTHETIC's, the step waited."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.55 * len(rows) + 1.2))
    for i, (label, m) in enumerate(rows):
        for k, (name, color) in enumerate((("io", "tab:orange"), ("synthetic", "0.5"), ("full", "tab:blue"))):
            if name in m:
                f, y = m[name], i + (k - 1) * 0.22
                ax.plot([f.img_s_low, f.img_s_high], [y, y], color=color, lw=3, solid_capstyle="butt",
                        label=name.upper() if i == 0 else None)
                ax.plot([f.img_s], [y], "o", color=color, ms=4)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis(); ax.set_xscale("log"); ax.set_xlabel("images/s (slowest to fastest window, dot: mean)")
    ax.set_title(title, fontsize=9); ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    plt.tight_layout(); plt.show()
    return fig
