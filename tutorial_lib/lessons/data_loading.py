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
                     f"{resident_ratio(rec):.3f} | {rec['full_data_wait_ms']:.2f} | {rec['bound']} |")
    lines += ["", *(f"{rec['case']}: {rec['verdict']}" for rec in records), "", check_line(records)]
    return "\n".join(lines)


def resident_ratio(rec: dict) -> float:
    return rec["figures"]["full"]["img_s"] / rec["figures"]["synthetic"]["img_s"]


def check_line(records: list[dict]) -> str:
    """The check of a GPU run, by the workbook's rule for a difference (noise.compare): FULL of every
    gpu_resident row is not slower than SYNTHETIC. On a CPU the input and the step share the cores, so it proves
    nothing there."""
    rows = [rec for rec in records if "gpu_resident" in rec["case"]]
    below = [rec["case"] for rec in rows if noise.compare(
        *(bench.figure(bench.Measurement(**rec["figures"][m])) for m in ("full", "synthetic")), separate=False).verdict
        == "lower"]
    cpu = " (a check for a GPU: on a CPU the input and the step share the cores)" if records[0]["device"].startswith(
        "CPU") else ""
    ratios = ", ".join(f"{rec['case']} {resident_ratio(rec):.3f}" for rec in rows)
    verdict = f"FAIL: slower in {', '.join(below)}" if below else "PASS"
    return f"gpu_resident FULL not slower than SYNTHETIC ({ratios}): {verdict}{cpu}"


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
