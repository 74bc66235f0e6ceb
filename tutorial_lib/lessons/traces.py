"""Notebook 02 on a GPU, as one study: profiled runs and their offline summaries (tutorial_lib.trace_summary).

    python -m tutorial_lib study traces --out build/gpu    # 1-2 GPUs: about 2 minutes
    python -m tutorial_lib study traces --small            # the same runs, tiny, on this machine

1. the trace fixture of tests/test_profiling.py: a few steps of ResNet-18 at batch 32 in bf16, 2 of them
   recorded, without shapes (and without memory events when the file would be too big for the repository);
2. the runs of notebook 02 on one device: the fp32 baseline of notebook 01, then bf16 + channels_last (at small
   sizes the baseline alone: a CPU would run the second in fp32 too);
3. DDP on 2 GPUs (on a CPU: 2 gloo processes), one trace per rank, summarised side by side.
Every summary is checked as tests/test_profiling.py checks it (the parts add up to the step, on the GPU's clock
a GPU's kernels are found); a failed check ends the study with an error after its table. Writes into `out`:
fixtures/<device>_<model>_<precision>.pt.trace.json.gz (on a GPU: gpu_resnet18_bf16..., commit it as
tests/fixtures/gpu_resnet18_bf16.pt.trace.json.gz), figures/baseline_fp32.png and figures/ddp_2ranks.png,
traces.json (the figures of the table) and traces.md (the table). No reference record.
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from .size import Size
from .. import engine, profiling
from ..config import TrainConfig, UserError
from ..results import atomic_write_text, load_result
from ..values import count
from ..trace_summary import PARTS, summarize

FIXTURE_MAX_BYTES = 700_000  # a fixture bigger than this is recorded again without memory events
TOLERANCE = 0.01  # the parts of a step add up to the step within 1%


def base_config(size: Size, out: Path) -> TrainConfig:
    return TrainConfig(dataset="shapes", model=size.pick("resnet18_imagenet", "resnet18"), train_size=size.pick(128, 16384),
                       eval=False, profile=True, progress=False, tensorboard=True, timing_warmup=size.pick(1, 5),
                       out_dir=str(Path(out) / "runs"))


def study(size: Size, out: Path) -> dict:
    """The runs of the module's docstring, their summaries, checks, figures and table."""
    out, base = Path(out), base_config(size, out)
    runs = {"fixture": fixture(base, size, out)}
    schedule = dict(steps=size.pick(5, 11), profile_wait=size.pick(1, 5), profile_warmup=size.pick(1, 2),
                    profile_active=size.pick(2, 3), batch_size=size.pick(8, 256), num_workers=size.pick(0, 8))
    bf16 = {"precision": size.pick("fp32", "bf16"), "channels_last": True}  # bf16 autocast crawls on a CPU
    # small sizes: no second row, which on a CPU would be fp32 again
    for name, keys in (("baseline_fp32", {}), ("bf16_cl", bf16))[:size.pick(1, 2)]:
        runs[name] = _train(base.replace(out_dir=f"{base.out_dir}/{name}", **schedule, **keys))
    if torch.cuda.device_count() >= 2 or size.small:
        ddp = base.replace(out_dir=f"{base.out_dir}/ddp_2ranks", **{**schedule, "num_workers": size.pick(0, 4)}, **bf16)
        engine.launch(ddp, nproc=2, extra_env={"OMP_NUM_THREADS": "4"} if torch.cuda.is_available() else None)
        runs["ddp_2ranks"] = Path(ddp.out_dir)
    else:
        print(f"ddp_2ranks: skipped, only {torch.cuda.device_count()} GPU visible")
    record, failures = {}, []
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for name, path in runs.items():
        record[name] = summarise(name, path, failures, out / "figures")
    atomic_write_text(out / "traces.json", json.dumps(record, indent=1))
    text = table(record)
    atomic_write_text(out / "traces.md", text + "\n")
    print(text, "\nchecks:", "all passed" if not failures else "FAILED\n  " + "\n  ".join(failures))
    if failures:
        raise UserError(f"study traces: {count(len(failures), 'check')} failed (listed above; the table is in {out})")
    return {}


def _train(cfg: TrainConfig) -> Path:
    shutil.rmtree(cfg.out_dir, ignore_errors=True)  # one run's traces per folder: the summary reads the newest
    with contextlib.redirect_stdout(io.StringIO()):
        engine.train(cfg)
    return Path(cfg.out_dir)


def fixture(base: TrainConfig, size: Size, out: Path) -> Path:
    """The trace fixture: recorded again without memory events when too big for the repository."""
    cfg = base.replace(precision=size.pick("fp32", "bf16"), channels_last=True, batch_size=size.pick(8, 32),
                       num_workers=size.pick(0, 2), steps=size.pick(5, 7), profile_wait=size.pick(1, 3),
                       profile_warmup=1, profile_active=2, profile_record_shapes=False, out_dir=f"{base.out_dir}/fixture")
    trace = newest_trace(_train(cfg))
    if trace.stat().st_size > FIXTURE_MAX_BYTES:
        trace = newest_trace(_train(cfg.replace(profile_memory=False)))
    kind = "gpu" if torch.cuda.is_available() else "cpu"
    dest = out / "fixtures" / f"{kind}_{cfg.model}_{cfg.precision}.pt.trace.json.gz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(trace, dest)
    print(f"fixture: {dest.stat().st_size:,} bytes -> {dest}", flush=True)
    return dest


def newest_trace(run_dir: Path) -> Path:
    return sorted(profiling.trace_dir(run_dir).glob("rank0.*.pt.trace.json.gz"), key=lambda p: p.stat().st_mtime)[-1]


def summarise(name: str, path: Path, failures: list[str], figures: Path) -> dict:
    """One run's summary in both views, checked; its figures for the table (and a plot of two of them)."""
    s, host = summarize(path), summarize(path, view="host")
    print(f"\n================ {name}\n{s}" + (f"\n{s.side_by_side()}" if len(s) > 1 else ""), flush=True)
    for t in s:
        failures += check(name, t)
    for t in host:
        failures += [f"{name} {t.worker}: host view: {f}" for f in parts_add_up(t)]
    result = load_result(path) if path.is_dir() else None
    if name in ("baseline_fp32", "ddp_2ranks"):
        fig = s.plot()
        fig.savefig(figures / f"{name}.png", dpi=110)
        plt.close(fig)
    return {"device": s[0].device, "ranks": len(s), "file_kb": round(sum(t.path.stat().st_size for t in s) / 1024),
            "step_ms": [round(t.step_ms, 3) for t in s],
            "parts_ms": [{p: round(t.parts_ms[p], 3) for p in PARTS} for t in s],
            "host_parts_ms": [{p: round(t.parts_ms[p], 3) for p in PARTS} for t in host],
            "bottleneck": [t.bottleneck for t in s], "top_kernels": [k["name"][:100] for k in s[0].top_kernels[:3]],
            "peak_memory_mb_trace": s[0].peak_memory_mb,
            "peak_memory_mb_run": result.peak_memory_mb if result else None,
            "throughput_img_s_run": round(result.throughput_img_s) if result else None}


def parts_add_up(t) -> list[str]:
    return [f"{s.name}: parts {sum(s.parts_ms.values()):.3f} ms != step {s.step_ms:.3f} ms" for s in t.steps
            if abs(sum(s.parts_ms.values()) - s.step_ms) > TOLERANCE * s.step_ms]


def check(name: str, t) -> list[str]:
    """What tests/test_profiling.py checks of a trace: its parts add up to each step; a GPU's trace is read on the
    GPU's clock and finds its kernels' time; a CPU's on the host's, with compute in it."""
    out = [f"{name} {t.worker} {f}" for f in parts_add_up(t)]
    if t.device.startswith("CPU") and (t.view != "host" or t.parts_ms["compute"] <= 0):
        out.append(f"{name} {t.worker}: no compute on the host's clock (view {t.view})")
    elif not t.device.startswith("CPU") and (t.view != "gpu" or not t.top_kernels or t.top_kernels[0]["ms"] <= 0
                                               or t.parts_ms["compute"] <= 0):
        out.append(f"{name} {t.worker}: no GPU kernel time (view {t.view})")
    return out


def table(record: dict) -> str:
    """ms per profiled step of every run and rank, part by part (they add up to the step), and the trace's size."""
    head = ["run", "rank", "step", *PARTS, "largest", "trace KB", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in record.items():
        for i in range(r["ranks"]):
            peak = next(iter(r["peak_memory_mb_trace"].values()), None) if i == 0 else None
            lines.append("| " + " | ".join([name, f"rank{i}", f"{r['step_ms'][i]:.2f}",
                                            *(f"{r['parts_ms'][i][p]:.2f}" for p in PARTS), r["bottleneck"][i],
                                            str(r["file_kb"]), "n/a" if peak is None else f"{peak:.0f}"]) + " |")
    return f"ms per profiled step on {record['fixture']['device']}\n\n" + "\n".join(lines)
