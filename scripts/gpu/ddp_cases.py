"""Run training cases through the workbook CLI and collect their result.json: what scripts/gpu/ddp_probe.py and
scripts/gpu/dp_vs_ddp.py share. A case is a name, a number of GPUs (processes under torchrun for DDP, or one
process for DataParallel / a single GPU) and key=value overrides; every case runs with a time limit, its output
goes to one log, and a case that would overrun the script's budget is skipped (and said so).

CPU=1 in the environment: the same cases with tiny sizes on the CPU (DDP on gloo, 2 processes), to test a
script before it meets a GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CPU = os.environ.get("CPU", "0") not in ("", "0")
OUT = Path(os.environ.get("OUT", "build/gpu"))
GPU_BASE = dict(dataset="shapes", model="resnet18", precision="bf16", channels_last=True, loader="gpu_resident",
                batch_size=256, steps=250, timing_warmup=60, eval=False, tensorboard=False, progress=False,
                resume=False)
CPU_BASE = dict(dataset="shapes", model="resnet18_imagenet", precision="fp32", loader="gpu_resident",
                device="cpu", train_size=512, batch_size=8, steps=8, timing_warmup=2, eval=False,
                tensorboard=False, progress=False, resume=False, log_every=2)
BASE = CPU_BASE if CPU else GPU_BASE
CPU_SIZES = {"batch_size": {256: 8, 1024: 16, 128: 8, 512: 16}, "steps": lambda n: 8, "timing_warmup": lambda n: 2,
             "profile_wait": lambda n: 2, "train_size": lambda n: 512}


def words(overrides: dict) -> list[str]:
    return [f"{k}={'true' if v is True else 'false' if v is False else v}" for k, v in overrides.items()]


def cpu_sized(overrides: dict) -> dict:
    """The GPU case's overrides with CPU-mode sizes (batch 256 -> 8, 1024 -> 16, a few steps)."""
    out = dict(overrides)
    for key, rule in CPU_SIZES.items():
        if key in out:
            out[key] = rule[out[key]] if isinstance(rule, dict) else rule(out[key])
    for key in ("precision", "channels_last", "cudnn_benchmark", "sync_batchnorm"):
        out.pop(key, None)  # fp32 on CPU; SyncBatchNorm has no CPU kernel
    return out


class Cases:
    """Runs cases in order within `budget_s` seconds; `records` holds one dict per case."""

    def __init__(self, name: str, budget_s: float, log: Path):
        self.name, self.budget_s, self.t0 = name, budget_s, time.time()
        self.log = open(log, "a")
        self.records: list[dict] = []
        self.cpus = sorted(os.sched_getaffinity(0))

    def left(self) -> float:
        return self.budget_s - (time.time() - self.t0)

    def command(self, gpus: int, overrides: dict, runner: list[str] | None = None) -> list[str]:
        """`python -m tutorial_lib train key=value ...` (under torchrun for DDP); `runner` replaces
        `-m tutorial_lib` (e.g. `-c CODE` that changes something, then calls the CLI's main)."""
        cli = [*(runner or ["-m", "tutorial_lib"]), "train", *words({**BASE, **overrides})]
        if overrides.get("parallel") == "ddp":
            return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}", *cli]
        return [sys.executable, *cli]

    def env(self, gpus: int, overrides: dict, first_gpu: int = 0, extra: dict | None = None) -> dict:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}
        procs = gpus if overrides.get("parallel") == "ddp" else 1
        env["OMP_NUM_THREADS"] = str(max(1, len(self.cpus) // max(procs, 4 if not CPU else 2)))
        if not CPU:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first_gpu + i) for i in range(gpus))
        if overrides.get("compile"):
            env.setdefault("TORCH_LOGS", "perf_hints,recompiles,graph_breaks")
            if CPU:  # the test mode checks the plumbing (Dynamo, DDP's graph cuts, AOTAutograd), not Inductor's
                env.setdefault("TORCH_COMPILE_OVERRIDE_BACKENDS", ">=0:aot_eager")  # C++ builds: minutes on 2 cores
        return env

    def start(self, case: str, gpus: int, overrides: dict, first_gpu: int = 0, cpus: list[int] | None = None,
              extra_env: dict | None = None, runner: list[str] | None = None):
        if CPU:
            overrides = cpu_sized(overrides)
            gpus = min(gpus, 2)
        out_dir = f"runs/gpu/{self.name}/{case}"
        overrides = {**overrides, "out_dir": out_dir}
        cmd = self.command(gpus, overrides, runner)
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self.env(gpus, overrides, first_gpu, extra_env), preexec_fn=pin)
        return {"case": case, "gpus": gpus, "overrides": overrides, "out_dir": out_dir, "proc": proc,
                "t0": time.time(), "cmd": " ".join(cmd[1:])}

    def finish(self, job: dict, timeout: float) -> dict:
        """Wait for a started case (at most `timeout` s after its start), log its output, read its result."""
        try:
            text, _ = job["proc"].communicate(timeout=max(1, job["t0"] + timeout - time.time()))
            status = "ok" if job["proc"].returncode == 0 else f"failed (exit {job['proc'].returncode})"
        except subprocess.TimeoutExpired:
            job["proc"].kill()
            text, _ = job["proc"].communicate()
            status = f"timed out after {timeout:.0f} s"
        wall = time.time() - job["t0"]
        self.log.write(f"\n===== {job['case']} ({wall:.0f} s, {status})\n$ {job['cmd']}\n{text}")
        self.log.flush()
        rec = {k: job[k] for k in ("case", "gpus", "overrides")}
        rec.update(status=status, wall_s=round(wall, 1), hints=hints(text))
        result = Path(job["out_dir"]) / "result.json"
        if status == "ok" and result.is_file():
            r = json.loads(result.read_text())
            rec.update(img_s=r["throughput_img_s"], step_ms=r["step_time_ms"], world_size=r["world_size"],
                       global_batch=r["global_batch"], peak_memory_mb=r["peak_memory_mb"], device=r["device"],
                       checksums_equal=len(set(r["param_checksums"])) == 1, host_parts_ms=r.get("host_parts_ms"))
        elif status == "ok":
            rec["status"] = "no result.json"
        print(line(rec), flush=True)
        self.records.append(rec)
        return rec

    def run(self, case: str, gpus: int, overrides: dict, estimate_s: float, **kw) -> dict | None:
        """Run one case now, unless `estimate_s` would overrun the budget (then record it as skipped)."""
        if self.left() < estimate_s:
            rec = {"case": case, "gpus": gpus, "overrides": overrides,
                   "status": f"skipped: {self.left():.0f} s of the budget left, needs ~{estimate_s:.0f} s"}
            print(line(rec), flush=True)
            self.records.append(rec)
            return None
        return self.finish(self.start(case, gpus, overrides, **kw), timeout=min(self.left() + 30, 240))

    def run_together(self, cases: list[tuple[str, int, dict]], estimate_s: float, monitor=None) -> list[dict]:
        """Cases at the same time on disjoint GPUs (in order: the first takes GPUs 0.., the next the ones after),
        each pinned to its share of the CPUs. `monitor` (started before, stopped here) gives each case the
        utilisation and memory of its own GPUs."""
        if self.left() < estimate_s:
            for case, gpus, overrides in cases:
                rec = {"case": case, "gpus": gpus, "overrides": overrides,
                       "status": f"skipped: {self.left():.0f} s of the budget left, needs ~{estimate_s:.0f} s"}
                print(line(rec), flush=True)
                self.records.append(rec)
            if monitor:
                monitor.stop()
            return []
        total = sum(g for _, g, _ in cases)
        jobs, first = [], 0
        for case, gpus, overrides in cases:
            share = len(self.cpus) * gpus // total
            cpus = self.cpus[len(self.cpus) * first // total:][:max(1, share)]
            jobs.append((first, self.start(case, gpus, overrides, first_gpu=first, cpus=cpus)))
            first += gpus
        recs = [self.finish(job, timeout=min(self.left() + 30, 300)) for _, job in jobs]
        seen = monitor.stop() if monitor else {}
        for (first, _), rec in zip(jobs, recs):
            for key, values in seen.items():
                if "img_s" in rec and len(values) >= first + rec["gpus"]:
                    rec[key] = values[first:first + rec["gpus"]]
        return recs

    def get(self, case: str) -> dict:
        return next((r for r in self.records if r["case"] == case), {})


def hints(text: str) -> list[str]:
    """The compiler's own remarks worth keeping (TORCH_LOGS): skipped CUDA graphs, recompilations and why,
    why graphs broke; and errors. Each once, without the log prefix."""
    import re

    keep = ("skipping cudagraphs", "Recompiling function", "guard failure", "Graph Break Reason",
            "Explanation:", "Error", "error:")
    seen: list[str] = []
    for raw in text.splitlines():
        s = re.sub(r"^(\[rank\d+\]:)?[VWI]\d{4} [\d:.]+ \d+ \S+\] (\[[^\]]*\] )*", "", raw).strip()
        if any(k in s for k in keep) and s[:240] not in seen:
            seen.append(s[:240])
    return seen[:16]


def line(rec: dict) -> str:
    if "img_s" not in rec:
        return f"{rec['case']:28s} {rec['gpus']} GPU  {rec['status']}"
    s = rec["step_ms"]
    return (f"{rec['case']:28s} {rec['gpus']} GPU  {rec['img_s']:>10,.0f} img/s  step {s['median']:.2f} ms "
            f"(p10 {s['p10']:.2f}, p90 {s['p90']:.2f})  {rec['wall_s']:.0f} s")


def efficiency(rec: dict, single: float | None) -> float | None:
    """Weak-scaling efficiency: img/s on N GPUs over N x the single-GPU img/s at the same per-GPU batch."""
    if not single or "img_s" not in rec:
        return None
    return rec["img_s"] / (rec["gpus"] * single)


def table(records: list[dict], singles: dict[int, float], device: str) -> str:
    """One row per case: img/s, step time, efficiency against the best single-GPU run at its per-GPU batch."""
    head = (f"img/s and median step time on {device}; efficiency = img/s / (GPUs x best 1-GPU img/s at the same "
            "per-GPU batch)\n")
    rows = [f"{'case':28s} {'GPUs':>4s} {'batch/GPU':>9s} {'img/s':>10s} {'step ms':>8s} {'p90 ms':>7s} "
            f"{'eff.':>5s} {'mem MB':>7s} {'wall s':>6s}  status"]
    for r in records:
        b = r["overrides"].get("batch_size", BASE["batch_size"])
        b = b // r["gpus"] if r["overrides"].get("parallel") == "dp" else b  # DataParallel splits its batch
        if "img_s" in r:
            eff = efficiency(r, singles.get(b))
            mem = f"{r['peak_memory_mb']:,.0f}" if r.get("peak_memory_mb") else "-"
            rows.append(f"{r['case']:28s} {r['gpus']:>4d} {b:>9d} {r['img_s']:>10,.0f} {r['step_ms']['median']:>8.2f} "
                        f"{r['step_ms']['p90']:>7.2f} {eff if eff is not None else float('nan'):>5.2f} {mem:>7s} "
                        f"{r['wall_s']:>6.0f}  {r['status']}")
        else:
            rows.append(f"{r['case']:28s} {r['gpus']:>4d} {b:>9d} {'-':>10s} {'-':>8s} {'-':>7s} {'-':>5s} {'-':>7s} "
                        f"{'-':>6s}  {r['status']}")
    return head + "\n".join(rows)


def best_singles(records: list[dict]) -> dict[int, float]:
    """per-GPU batch -> the best img/s of any single-GPU case at that batch."""
    best: dict[int, float] = {}
    for r in records:
        if r["gpus"] == 1 and "img_s" in r:
            b = r["overrides"].get("batch_size", BASE["batch_size"])
            best[b] = max(best.get(b, 0.0), r["img_s"])
    return best


def summarize_traces(out_dirs: list[str], path: Path) -> list[dict]:
    """tl.trace_summary of every rank's trace in each folder, as text into `path`; returns per-rank figures
    (step ms, its parts, NCCL kernels per step)."""
    from tutorial_lib import trace_summary

    texts, figures = [], []
    for d in out_dirs:
        try:
            s = trace_summary.summarize(d)
        except Exception as e:  # a case that was skipped or failed has no trace: say so and go on
            texts.append(f"== {d}: no summary ({type(e).__name__}: {e})")
            continue
        texts.append(f"== {d}\n{s.side_by_side()}\n\n{s.report(top=12)}")
        counts = nccl_counts(d)
        for t in s:
            calls, ms, host, ops = counts.get(t.worker, (0, 0.0, 0, 0))
            figures.append({"run": d, "worker": t.worker, "step_ms": t.step_ms, "parts_ms": t.parts_ms,
                            "allreduce_calls_per_step": host, "host_ops_per_step": ops,
                            "nccl_calls_per_step": calls, "nccl_ms_per_step": ms,
                            "nccl_hidden_ms_per_step": max(0.0, ms - t.parts_ms["comm"])})
    path.write_text("\n\n".join(texts) + "\n")
    return figures


def nccl_counts(run_dir: str) -> dict[str, tuple[float, float, float, float]]:
    """worker -> (NCCL kernels per profiled step, their GPU ms per step, c10d::allreduce_ calls per step, host
    operators per step), from each rank's latest trace."""
    from tutorial_lib import trace_summary

    out = {}
    for worker, files in trace_summary.find_traces(run_dir).items():
        events = trace_summary.read_trace(files[-1]).get("traceEvents", [])
        steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#")) or 1
        nccl = [e for e in events if e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()]
        host = sum(1 for e in events if e.get("cat") == "cpu_op" and e.get("name") == "c10d::allreduce_")
        ops = sum(1 for e in events if e.get("cat") == "cpu_op")  # every operator the host ran (nested too)
        out[worker] = (len(nccl) / steps, sum(e.get("dur", 0) for e in nccl) / 1000 / steps, host / steps,
                       ops / steps)
    return out


def pack_traces(out_dirs: list[str], path: Path) -> None:
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for d in out_dirs:
            prof = Path(d) / "tb" / "profile"
            if prof.is_dir():
                tar.add(prof, arcname=d.replace("/", "_"))
