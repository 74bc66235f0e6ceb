"""Two GPU checks of the loop itself, as studies (notebooks 01 and 03 rest on them):

    python -m tutorial_lib study measure --reference    # one way to measure: train, bench and TensorBoard agree
    python -m tutorial_lib study spine                  # fp32 vs bf16 on one GPU, DDP on 1 and 2 GPUs
    python -m tutorial_lib study measure --small        # either one with tiny sizes on this machine

`measure`: the same loader-bound run (1 DataLoader worker) trained and benched, so that train's throughput_img_s
and bench's FULL can be compared, with the mean-based figure beside batch / median step; TensorBoard's
perf/img_per_s beside the run's throughput; a profiled run of 2 cycles that must warn nothing; and the bench's
verdict of loader=gpu_resident and of 8 workers. Its figures: the reference record `measure`.
`spine`: the CLI's first runs on a GPU node (fp32, then bf16 + channels_last, on one GPU; DDP through torchrun on
1 and 2 GPUs, on a CPU 2 gloo processes) in one table, with DDP's weak-scaling efficiency against the single-GPU
run without DDP (lessons.scaling: the same configuration, 8 DataLoader workers per process); no reference record.
"""
from __future__ import annotations

import contextlib
import io
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from . import bench, scaling
from .size import Size
from .. import engine
from ..config import TrainConfig, UserError
from ..results import Result, atomic_write_text


def _quiet_train(cfg: TrainConfig) -> Result:
    with contextlib.redirect_stdout(io.StringIO()):  # the run's own "step k/N loss" lines
        return engine.train(cfg)


# ------------------------------------------------------------------------------------------------ measure
def measure_base(size: Size, out: Path) -> TrainConfig:
    """ResNet-18 at batch 256 in bf16 + channels_last on a GPU; tiny, and in fp32 (bf16 is slow there), on a CPU."""
    return TrainConfig(dataset="shapes", model=size.pick("resnet18_imagenet", "resnet18"),
                       precision=size.pick("fp32", "bf16"), channels_last=True, batch_size=size.pick(8, 256),
                       train_size=size.pick(128, None), eval=False, progress=False, resume=False,
                       timing_warmup=size.pick(1, 20), log_every=size.pick(2, 20), out_dir=str(Path(out) / "runs"))


def measure(size: Size, out: Path) -> dict[str, dict]:
    """The four checks of the module's docstring; their figures: the reference record `measure` (in `out`)."""
    base = measure_base(size, out)
    runs = Path(base.out_dir)
    figures = {"loader_bound": loader_bound(base.replace(num_workers=1, steps=size.pick(7, 220)), size)}
    figures["tensorboard"] = tensorboard_rate(runs / "train", figures["loader_bound"]["train_img_s"])
    print("== 3. profiling, 2 cycles: warnings", flush=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _quiet_train(base.replace(num_workers=size.pick(1, 2), steps=size.pick(9, 12), timing_warmup=1, profile=True,
                                  profile_repeat=2, profile_wait=1, profile_warmup=1, profile_active=2,
                                  out_dir=str(runs / "prof")))
    said = [str(w.message) for w in caught if "Profiler clears events" in str(w.message)]
    figures["profiler_clears_events_warnings"] = len(said)
    print("profiler warnings:", said or "none")
    print("== 4. bench verdicts", flush=True)
    figures["verdicts"] = {}
    for name, keys in (("gpu_resident", {"loader": "gpu_resident"}), ("8 workers", {"num_workers": size.pick(1, 8)})):
        v = bench.bench(base.replace(out_dir=str(runs / name.replace(" ", "_")), **keys), steps=size.pick(4, 200),
                        window=size.pick(2, 20))
        print(f"-- {name}\n{v.summary()}", flush=True)
        figures["verdicts"][name] = {"bound": v.bound, "verdict": v.verdict, **{m: v.img_s(m) for m in bench.MEASURES}}
    lb = figures["loader_bound"]
    print(f"train vs bench FULL: {100 * abs(lb['bench_full_img_s'] / lb['train_img_s'] - 1):.1f}% apart; "
          f"profiler warnings: {len(said)}")
    return {"measure": figures}


def loader_bound(cfg: TrainConfig, size: Size) -> dict:
    """1. The same loader-bound run trained (TensorBoard on) and benched (FULL only): the two figures agree."""
    print("== 1. train and bench on the same loader-bound run (1 worker)", flush=True)
    t0 = time.perf_counter()
    r = _quiet_train(cfg.replace(tensorboard=True, out_dir=f"{cfg.out_dir}/train"))
    b = bench.bench(cfg.replace(tensorboard=False, out_dir=f"{cfg.out_dir}/bench"), steps=cfg.steps - cfg.timing_warmup,
                    window=size.pick(2, 20), measures=("full",))
    print(r.summary(), f"\n{b.summary()}\n({time.perf_counter() - t0:.0f} s)", flush=True)
    t = r.step_time_ms
    return {"device": r.device, "train_img_s": r.throughput_img_s, "bench_full_img_s": b.img_s("full"),
            "bench_full_windows": [b.figures["full"].img_s_low, b.figures["full"].img_s_high],
            "by_median_img_s": r.global_batch / (t["median"] / 1000),
            "step_ms": {k: t[k] for k in ("mean", "median", "p10", "p90")}, "data_wait_ms": r.data_wait_ms,
            "data_wait_fraction": r.data_wait_fraction, "batch_size": cfg.batch_size}


def tensorboard_rate(run_dir: Path, run_img_s: float) -> dict:
    """2. TensorBoard's perf/img_per_s (the device's rate per log interval) beside the run's throughput."""
    print("== 2. TensorBoard perf/img_per_s (device rate per interval)", flush=True)
    rates = [e.value for e in EventAccumulator(str(run_dir / "tb")).Reload().Scalars("perf/img_per_s")]
    print(f"perf/img_per_s: median {statistics.median(rates):,.0f} over {len(rates)} points; run {run_img_s:,.0f} img/s")
    return {"median_img_per_s": statistics.median(rates), "points": len(rates), "run_img_s": run_img_s}


# ------------------------------------------------------------------------------------------------ spine
SPINE_COLUMNS = ("run", "device", "ranks", "img/s", "step ms", "wait ms", "peak MB", "val acc %", "in sync")


def spine(size: Size, out: Path) -> dict:
    """fp32 and bf16 + channels_last on one device, DDP on 1 and 2 GPUs (small sizes: fp32 + channels_last, and
    DDP on 2 gloo processes); the table in spine.md, the rows in spine.json."""
    base = TrainConfig(dataset="shapes", model=size.pick("resnet18_imagenet", "resnet18"),
                       batch_size=size.pick(8, 256), train_size=size.pick(64, None), val_size=size.pick(32, None),
                       num_workers=size.pick(0, 8), progress=False, log_every=size.pick(2, 50), resume=False,
                       timing_warmup=size.pick(1, 5), tensorboard=False)
    runs = Path(out) / "runs"
    bf16 = {"precision": size.pick("fp32", "bf16"), "channels_last": True}  # bf16 autocast crawls on a CPU
    fast = f"{bf16['precision']}_cl"
    results = {"fp32": _quiet_train(base.replace(steps=size.pick(3, 150), precision="fp32", out_dir=str(runs / "fp32"))),
               fast: _quiet_train(base.replace(steps=size.pick(3, 300), out_dir=str(runs / fast), **bf16))}
    if torch.cuda.device_count() >= 2 or size.small:
        for n in size.pick((2,), (1, 2)):  # small: 2 gloo processes (one process is the same code)
            ddp = base.replace(steps=size.pick(3, 300), out_dir=str(runs / f"ddp{n}"), **bf16)
            results[f"ddp{n}"] = engine.launch(ddp, nproc=n,
                                               extra_env={"OMP_NUM_THREADS": "4"} if torch.cuda.is_available() else None)
    rows = [spine_row(name, r) for name, r in results.items()]
    text = "\n".join([spine_table(rows), *(efficiency_line(results[n], results[fast]) for n in ("ddp1", "ddp2")
                                           if n in results)])
    print(text)
    atomic_write_text(Path(out) / "spine.json", json.dumps(rows, indent=1))
    atomic_write_text(Path(out) / "spine.md", text + "\n")
    return {}


def efficiency_line(run: Result, baseline: Result) -> str:
    """DDP's weak-scaling efficiency against the same run on one device without DDP (lessons.scaling)."""
    try:
        point = scaling.efficiency(run, baseline)
    except UserError as e:  # e.g. a CPU's thread count differs between the processes: the reason, no figure
        return f"DDP on {run.world_size}: no efficiency ({e})"
    return (f"DDP on {run.world_size}: {point.speedup:.2f}x the single-device run without DDP, weak-scaling "
            f"efficiency {point.efficiency:.3f}")


def spine_row(name: str, r: Result) -> dict:
    return {"run": name, "device": r.device, "ranks": r.world_size, "img/s": r.throughput_img_s,
            "step ms": r.step_time_ms["median"], "wait ms": r.data_wait_ms, "peak MB": r.peak_memory_mb,
            "val acc %": None if r.val_accuracy is None else 100 * r.val_accuracy, "in sync": len(set(r.param_checksums)) == 1}


def spine_table(rows: list[dict]) -> str:
    def cell(v):
        return "n/a" if v is None else f"{v:,.1f}" if isinstance(v, float) else str(v)
    return "\n".join(["| " + " | ".join(SPINE_COLUMNS) + " |", "|" + "---|" * len(SPINE_COLUMNS)] +
                     ["| " + " | ".join(cell(r[c]) for c in SPINE_COLUMNS) + " |" for r in rows])
