"""The one case runner of every GPU study (lessons/studies.py): a case is a name, a TrainConfig and the GPUs it
uses, run as the workbook's own command line in a fresh process:

    python -m tutorial_lib train key=value ...                        # one GPU, or DataParallel over `gpus`
    torchrun --standalone --nproc_per_node=N -m tutorial_lib train ...  # DDP: engine.torchrun_command, tl.launch's

Cases run one at a time, each with the node to itself (a baseline shares nothing with another run), its
output appended to one log, its result.json read back into a record. A study gives the runner a time budget:
a case whose estimate no longer fits is skipped, and its record says so. With a Selection (`python -m
tutorial_lib study NAME --only CASE,...`) only the cases named run; every other case keeps its record from the
existing reference record, if that record ran the configuration the study asks for now. On a GPU node NVML (tutorial_lib.nvml)
samples each case's GPUs (utilisation over every sample of the timed window, memory in MiB). Efficiency is
never computed here: the studies call tl.scaling.efficiency on the records' results.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import engine, nvml, trace_summary
from ..config import TrainConfig, UserError, given_gpus, usable_cpus
from ..nvml import window_figures
from ..values import count

KEEP = ("config", "device", "world_size", "steps", "global_batch", "throughput_img_s", "step_time_ms",
        "data_wait_ms", "val_accuracy", "peak_memory_mb", "wall_time_s", "torch_version", "compile_time_s",
        "mfu", "val_history", "host_parts_ms", "gpu_hours", "gpu_hours_to_target", "kwh_to_target", "energy_j",
        "joules_per_image", "energy_note")  # a result's fields a record keeps (not its loss curve)


@dataclass
class Case:
    name: str  # a file-safe label: its run folder and log heading (tables print `about`, not this)
    cfg: TrainConfig
    gpus: int = 1  # GPUs it uses: DDP's processes, DataParallel's GPUs, or 1
    about: str = ""  # what it is, in a learner's words
    command: str = "train"  # or "bench" (notebook 03's IO / SYNTHETIC / FULL)
    args: tuple = ()  # the bench's options, e.g. ("--steps", "60", "--window", "10")
    env: dict = field(default_factory=dict)  # extra environment variables
    estimate_s: float = 60.0  # the most it should take, start-up and compilation included

    def command_line(self) -> list[str]:
        cfg = self.cfg.replace(progress=False)
        if cfg.parallel == "ddp":
            return engine.torchrun_command(cfg, self.gpus, self.command, self.args)
        return [sys.executable, "-m", "tutorial_lib", self.command, *self.args, *cfg.to_overrides()]


def node_gpus(gpus_visible: int) -> int:
    """The GPUs a study sizes its cases to: the most of 1, 2 and 4 that the node has (8 GPUs: 4)."""
    return max(n for n in (1, 2, 4) if n <= max(gpus_visible, 1))


@dataclass
class Selection:
    """`--only`: the cases to run now, and the records of the existing reference record (by case name) that the
    others keep."""
    only: frozenset
    prior: dict

    def check(self, names: list[str]) -> None:
        """Refuse, before anything runs, a name that is no case of the study on this node."""
        unknown = sorted(self.only - set(names))
        if unknown:
            raise UserError(f"--only {','.join(unknown)}: no such case in this study on this node; its cases are: "
                            f"{', '.join(names)}")


IGNORED = ("out_dir", "resume", "progress", "data_dir")  # config keys that say where a run wrote, not what it ran
REWRITTEN = {"bench": ("steps",)}  # keys a command writes into its result's config (the bench: warm-up + timed steps)


def stale(prior: dict, case: Case) -> str | None:
    """Why a prior record does not hold what `case` runs now ('dataset=shapes_hard, now shapes_faint'), or None.
    The record's own copy of the case's config is compared (older records: its result's, less what the command
    rewrites there); keys that only one side has (a config key added since) are not compared."""
    old = prior.get("config") or {k: v for k, v in ((prior.get("result") or {}).get("config") or {}).items()
                                  if k not in REWRITTEN.get(prior.get("command", case.command), ())}
    new = case.cfg.to_dict()
    diff = [f"{k}={old[k]}, now {new[k]}" for k in new if k in old and k not in IGNORED and old[k] != new[k]]
    return "; ".join(diff) or None


class Runner:
    """Runs cases into <out>/runs/<name>, one at a time, within `budget_s` seconds; `records` by name."""

    def __init__(self, out: str | os.PathLike, budget_s: float, gpus_here: int, select: Selection | None = None):
        self.out = Path(out)
        self.runs = self.out / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.log_path = self.out / "cases.log"
        self.budget_s, self.gpus_here, self.t0 = budget_s, gpus_here, time.time()
        self.records: dict[str, dict] = {}
        self.select = select

    def left(self) -> float:
        return self.budget_s - (time.time() - self.t0)

    def with_dir(self, case: Case) -> Case:
        return Case(**{**case.__dict__, "cfg": case.cfg.replace(out_dir=str(self.runs / case.name), resume=False)})

    def run(self, case: Case) -> dict:
        """Run one case now, or record why not (the budget, too few GPUs); returns its record."""
        if self.select and case.name not in self.select.only:
            return self._kept(case)
        case = self.with_dir(case)
        rec = {"case": case.name, "about": case.about, "gpus": case.gpus, "command": case.command,
               "config": case.cfg.to_dict()}
        if self.gpus_here and case.gpus > self.gpus_here:
            return self._keep(rec, f"skipped: needs {case.gpus} GPUs, this node has {self.gpus_here}")
        if self.left() < case.estimate_s:
            rec["over_budget"] = True  # another call runs it: --only (studies.run names them)
            return self._keep(rec, f"skipped: {self.left():.0f} s of the study's budget left, the case needs "
                                   f"about {case.estimate_s:.0f} s")
        shutil.rmtree(case.cfg.out_dir, ignore_errors=True)
        monitor = Monitor(case.gpus) if self.gpus_here else None
        t = time.time()
        status, text = self._execute(case, timeout=max(2 * case.estimate_s, 60))
        rec["wall_s"] = round(time.time() - t, 1)
        result = Path(case.cfg.out_dir) / "result.json"
        if status == "ok" and result.is_file():
            r = json.loads(result.read_text())
            rec["result"] = {k: r.get(k) for k in KEEP}
            rec["replicas_identical"] = len(set(r.get("param_checksums") or [0])) == 1
            if monitor:
                rec["monitor"] = monitor.stop(result.stat().st_mtime, r["step_time_ms"].get("slowest_rank_total_s"))
            bench = Path(case.cfg.out_dir) / "bench.json"
            if bench.is_file():
                rec["bench"] = {m: {k: f[k] for k in ("img_s", "img_s_low", "img_s_high", "per_rank_img_s")}
                                for m, f in json.loads(bench.read_text())["figures"].items()}
        else:
            if monitor:
                monitor.stop(None, None)
            status = status if status != "ok" else "failed: no result.json"
            rec["last_words"] = text.strip().splitlines()[-12:]
        return self._keep(rec, status)

    def skip(self, case: Case, why: str) -> dict:
        """Record that `case` did not run, and why (a study's own reason: no race target, say)."""
        return self._keep({"case": case.name, "about": case.about, "gpus": case.gpus, "command": case.command},
                          f"skipped: {why}")

    def _kept(self, case: Case) -> dict:
        """A case --only left out: its prior record if that ran this configuration; otherwise a record saying so."""
        prior = self.select.prior.get(case.name)
        rec = {"case": case.name, "about": case.about, "gpus": case.gpus, "command": case.command}
        if prior is None:
            return self._keep(rec, f"skipped: not recorded yet (run it with --only {case.name})")
        why = stale(prior, case)
        if why:
            return self._keep(rec, f"skipped: its record ran another configuration ({why}); run it again with "
                                   f"--only {case.name}")
        self.records[case.name] = prior
        print(line(prior) + "  (kept)", flush=True)
        return prior

    def _execute(self, case: Case, timeout: float) -> tuple[str, str]:
        procs = case.gpus if case.cfg.parallel == "ddp" else 1
        if not self.gpus_here:  # on a CPU "one GPU" is the cores one of two ranks gets, for every case alike
            procs = max(procs, 2)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "KINETO_LOG_LEVEL": "99",
               "OMP_NUM_THREADS": str(max(1, usable_cpus() // procs)), **case.env}
        if self.gpus_here:  # the first of the GPUs this process was given (Slurm's, or CUDA_VISIBLE_DEVICES')
            given = given_gpus() or [str(i) for i in range(self.gpus_here)]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(given[:case.gpus])
        words, limit = case.command_line(), min(timeout, self.left() + 30)
        with open(self.log_path, "a") as log:
            log.write(f"\n===== {case.name}: {case.about}\n$ {' '.join(words[1:])}\n")
            log.flush()
            proc = subprocess.Popen(words, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                    start_new_session=True)  # its own process group: torchrun and its ranks
            timer = threading.Timer(limit, lambda: os.killpg(proc.pid, signal.SIGKILL))
            timer.start()
            text = proc.communicate()[0]
            timer.cancel()
            log.write(text)
        if proc.returncode == 0:
            return "ok", text
        if proc.returncode == -signal.SIGKILL:
            return f"failed: stopped after {limit:.0f} s (its time limit)", text
        return f"failed (exit {proc.returncode})", text

    def _keep(self, rec: dict, status: str) -> dict:
        rec["status"] = status
        self.records[rec["case"]] = rec
        print(line(rec), flush=True)
        return rec

    def result(self, name: str) -> dict | None:
        """The result of case `name`, or None when it was skipped or failed."""
        return self.records.get(name, {}).get("result")

    def save(self) -> Path:
        path = self.out / "cases.json"
        path.write_text(json.dumps(self.records, indent=1) + "\n")
        return path


def why_missing(rec: dict, node_gpus: int | None = None) -> str:
    """Why a record holds no figure for a case, in a learner's words (its status says it for the log)."""
    status = rec.get("status", "")
    if "needs" in status and "GPUs" in status:
        have = node_gpus or re.search(r"has (\d+)", status)[1]
        return f"the reference node had {have} GPUs, and this case wants {rec['gpus']}"
    if "budget" in status:
        return "the study's time budget ran out before it"
    if "another configuration" in status:
        return "its recorded run used another configuration (it waits to be run again)"
    if "not recorded yet" in status:
        return "not run yet"
    return status.removeprefix("skipped: ") or "not run"


def line(rec: dict) -> str:
    """One line per case for the study's log: its img/s and step time, or its status."""
    r, gpus = rec.get("result"), count(rec["gpus"], "GPU")
    if not r or r.get("throughput_img_s") is None:
        return f"{rec['case']:28s} {gpus:7s}  {rec['status']}"
    s = r["step_time_ms"]
    return (f"{rec['case']:28s} {gpus:7s}  {r['throughput_img_s']:>10,.0f} img/s  step {s['median']:.2f} ms "
            f"(p10 {s['p10']:.2f}, p90 {s['p90']:.2f})  {rec['wall_s']:.0f} s")


class Monitor:
    """NVML's figures of GPUs 0..gpus-1 every 200 ms while a case runs (nvml.Sampler). stop() keeps the samples of
    the timed window (the `seconds` before the result was written): the mean utilisation over every one of them
    (a sample at 0% counts) and the most memory used, in MiB; without NVML, a note saying why."""

    def __init__(self, gpus: int):
        self.gpus, self.sampler = gpus, nvml.Sampler(range(gpus), every_s=0.2).start()

    def stop(self, end: float | None, seconds: float | None) -> dict:
        samples = self.sampler.stop()
        if self.sampler.note:
            return {"note": self.sampler.note}
        return window_figures(samples, self.gpus, end, seconds)


def trace_figures(run_dir: str | os.PathLike) -> dict:
    """Per rank of a traced run (profile=true): its step cut into parts (ms, tl.trace_summary), and per profiled
    step the time its collective kernels ran (NCCL on GPUs; gloo has none), the all-reduce calls and every
    operator its host launched."""
    out = {}
    for t in trace_summary.summarize(run_dir):
        events = trace_summary.read_trace(trace_summary.find_traces(run_dir)[t.worker][-1]).get("traceEvents", [])
        steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#")) or 1
        nccl = [e for e in events if e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()]
        ops = [e for e in events if e.get("cat") == "cpu_op"]
        out[t.worker] = {"step_ms": round(t.step_ms, 3), "parts_ms": {k: round(v, 3) for k, v in t.parts_ms.items()},
                         "nccl_ms": round(sum(e.get("dur", 0) for e in nccl) / 1000 / steps, 3),
                         "allreduce_calls": sum(e.get("name") == "c10d::allreduce_" for e in ops) / steps,
                         "host_ops": round(len(ops) / steps, 1)}
    return out
