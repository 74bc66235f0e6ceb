"""An offline view of a torch.profiler trace: where a training step's time goes, with no browser and no internet.

    s = summarize("runs/02_profiling/baseline")  # a run folder, its tb/profile folder, or one trace file
    s                                             # per-step breakdown, top operators, top GPU kernels (tables)
    s.plot()                                      # the same as one matplotlib figure

It reads the Chrome-trace JSON that torch.profiler (kineto) writes: `ProfilerStep#N` annotations and `cpu_op`
operators on the host, `cuda_runtime` launches linked by a correlation id to the `kernel`, `gpu_memcpy` and
`gpu_memset` they started on the GPU, and the labels the engine puts around each phase of a step ("data wait",
"h2d copy", "forward", "backward", "optimizer"). It needs no torch, so a login node can read traces from a job.

Each step is cut into parts that add up to the step: every instant of the step gets the first label that
applies, in this order.
  GPU view (a trace with GPU activity): compute (a kernel launched in forward/backward runs), optimizer
    (a kernel launched in the optimizer step runs), copy (a memcpy/memset, or input preparation launched while
    the batch was copied), comm (a collective such as an NCCL all-reduce runs while no compute kernel does:
    communication that is not hidden), data (the GPU is idle while the host waits for the next batch), idle
    (the GPU is idle for any other reason: kernel launch overhead, Python, synchronisation).
  Host view (CPU-only traces; `view="host"` for any trace): what the training thread was doing: copy, data,
    optimizer, compute (an operator runs), comm (a collective runs while the thread runs no operator), compute
    again for the rest of forward/backward (Python between operators), idle (outside every operator and phase:
    logging, the loop itself).
"""
from __future__ import annotations

import gzip
import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .config import UserError
from .values import count, step_label

from .intervals import covers, partition, union

PARTS = ("data", "copy", "compute", "comm", "optimizer", "idle")
PART_LABELS = {"data": "waiting for data", "copy": "copies, input prep", "compute": "compute (fwd + bwd)",
               "comm": "communication", "optimizer": "optimizer step", "idle": "idle"}
PART_COLORS = {"data": "tab:red", "copy": "tab:orange", "compute": "tab:blue", "comm": "tab:purple",
               "optimizer": "tab:green", "idle": "lightgray"}
PHASE_LABELS = {"data wait": "data", "h2d copy": "copy", "forward": "compute", "backward": "compute",
                "optimizer": "optimizer"}  # the engine's ranges (profiling.nvtx_range)
FALLBACK_PHASES = (("enumerate(DataLoader)", "data"), ("Optimizer.step#", "optimizer"),
                   ("Optimizer.zero_grad#", "optimizer"))  # what torch labels itself, for other loops
HOST_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms")
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset",
               "memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "runtime")
TRACE_NAME = re.compile(r"^(?P<worker>.+?)\.(?P<stamp>\d+)\.pt\.trace\.json(\.gz)?$")


# ---------------------------------------------------------------------- finding and reading traces
def find_traces(path: str | os.PathLike, latest: bool = True) -> dict[str, list[Path]]:
    """Trace files under `path` by worker ("rank0", "rank1", ...). With latest=True only each worker's newest
    trace (a rerun into the same folder adds new files beside the old ones)."""
    p = Path(path)
    if p.is_file():
        return {_worker(p): [p]}
    folder = p / "tb" / "profile" if (p / "tb" / "profile").is_dir() else p
    files = sorted(folder.rglob("*.pt.trace.json*")) if folder.is_dir() else []
    files = [f for f in files if f.name.endswith((".json", ".json.gz"))]
    if not files:
        raise UserError(f"no torch.profiler trace (*.pt.trace.json[.gz]) under {str(path)!r}; record one with "
                        "profile=true, e.g. `python -m tutorial_lib train profile=true out_dir=runs/prof`")
    by_worker: dict[str, list[Path]] = defaultdict(list)
    for f in sorted(files, key=_stamp):
        by_worker[_worker(f)].append(f)
    ordered = sorted(by_worker, key=_natural)
    return {w: by_worker[w][-1:] if latest else by_worker[w] for w in ordered}


def _worker(f: Path) -> str:
    m = TRACE_NAME.match(f.name)
    return m["worker"] if m else f.name.split(".")[0]


def _stamp(f: Path) -> int:
    m = TRACE_NAME.match(f.name)
    return int(m["stamp"]) if m else int(f.stat().st_mtime_ns)


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def read_trace(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{str(path)!r} is not a readable Chrome trace ({e}); was the run killed while "
                        "writing it? Record it again") from None
    if isinstance(trace, list):  # a bare event list is valid Chrome-trace JSON too
        trace = {"traceEvents": trace}
    return trace


# ---------------------------------------------------------------------- what one trace says
@dataclass
class StepTime:
    """One profiled step: its duration (host clock, or the GPU's in the GPU view) and its parts (milliseconds)."""
    name: str
    step_ms: float
    parts_ms: dict


@dataclass
class TraceSummary:
    """What one rank's trace says. Times are milliseconds per profiled step, measured on `device`."""
    worker: str
    path: Path
    device: str
    view: str  # "gpu" or "host"
    steps: list[StepTime]
    top_ops: list[dict]
    top_kernels: list[dict]
    peak_memory_mb: dict = field(default_factory=dict)

    @property
    def step_ms(self) -> float:
        return sum(s.step_ms for s in self.steps) / len(self.steps)

    @property
    def parts_ms(self) -> dict:
        """The mean of each part over the profiled steps."""
        return {p: sum(s.parts_ms[p] for s in self.steps) / len(self.steps) for p in PARTS}

    @property
    def bottleneck(self) -> str:
        """The largest part of the step."""
        parts = self.parts_ms
        return max(parts, key=parts.get)

    def header(self) -> str:
        n = len(self.steps)
        return (f"{self.worker} on {self.device}: {count(n, 'profiled step')}, "
                f"{self.step_ms:.1f} ms per step, {self.view} view ({self.path.name})")

    def breakdown_table(self) -> str:
        parts, step = self.parts_ms, self.step_ms
        rows = [[PART_LABELS[p], f"{parts[p]:.2f}", f"{100 * parts[p] / step:.1f}%"] for p in PARTS]
        rows.append(["step time (sum)", f"{sum(parts.values()):.2f}", f"{100 * sum(parts.values()) / step:.1f}%"])
        return table(["part of the step", "ms/step", "share"], rows)

    def ops_table(self, top: int = 10) -> str:
        gpu = bool(self.top_kernels)
        rows = [[_short(o["name"], 48), f"{o['calls']:g}", f"{o['self_cpu_ms']:.2f}"]
                + ([f"{o['device_ms']:.2f}"] if gpu else []) for o in self.top_ops[:top]]
        return table(["operator", "calls/step", "self CPU ms/step"] + (["GPU ms/step"] if gpu else []), rows)

    def kernels_table(self, top: int = 10) -> str:
        if not self.top_kernels:
            return "(no GPU kernels in this trace: it was recorded on a CPU)"
        busy = sum(k["ms"] for k in self.top_kernels) or 1.0
        rows = [[_short(k["name"], 56), f"{k['calls']:g}", f"{k['ms']:.3f}", f"{1000 * k['ms'] / k['calls']:.1f}",
                 f"{100 * k['ms'] / busy:.1f}%"] for k in self.top_kernels[:top]]
        return table(["GPU kernel", "calls/step", "ms/step", "us/call", "of GPU busy"], rows)

    def memory_line(self) -> str:
        if not self.peak_memory_mb:
            return "peak memory: not recorded (profile_memory=false)"
        return "peak memory allocated while profiling: " + ", ".join(
            f"{dev} {mb:,.1f} MiB" for dev, mb in self.peak_memory_mb.items())  # 2**20 bytes

    def report(self, top: int = 10) -> str:
        return "\n\n".join([self.header(), self.breakdown_table(), self.memory_line(),
                            f"top operators by {'GPU' if self.top_kernels else 'self CPU'} time",
                            self.ops_table(top), "top GPU kernels", self.kernels_table(top)])


def summarize_trace(path: Path, worker: str | None = None, view: str | None = None, top: int = 15) -> TraceSummary:
    trace = read_trace(path)
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict)]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat") != "Trace"]
    device_events = [e for e in spans if e.get("cat", "").lower() in DEVICE_CATS]
    if view not in (None, "gpu", "host"):
        raise UserError(f"view={view!r} is not one of gpu, host")
    view = view or ("gpu" if device_events else "host")
    if view == "gpu" and not device_events:
        raise UserError(f"view='gpu' but {path.name} has no GPU activity (recorded on a CPU); use view='host'")
    main, steps = _main_thread_and_steps(spans)
    phases = _phases(spans, main)
    launches = _launch_times(spans)
    profiled = _launched_in(device_events, launches, steps)
    if view == "gpu":
        steps = _gpu_step_windows(steps, device_events, launches)
        ordered = _gpu_parts(spans, device_events, phases)
    else:
        ordered = _host_parts(spans, main, phases)
    step_times = [StepTime(name, (e - s) / 1000, _parts_ms(partition((s, e), ordered))) for name, s, e in steps]
    top_ops, top_kernels = _top_ops_and_kernels(spans, profiled, main[0], len(steps))
    return TraceSummary(worker or _worker(path), path, _device_name(trace, device_events), view, step_times,
                        top_ops[:top], top_kernels[:top], _peak_memory(events))


def _launched_in(device_events, launches, steps):
    """The device events launched inside the profiled steps: a GPU that runs behind the host is still busy
    with the steps before the first one (the profiler's warm-up) when the trace starts, and their kernels,
    recorded too, are not the profiled steps' work (per-step kernel times would count them)."""
    if len(steps) == 1 and steps[0][0] == "whole trace":
        return device_events
    lo, hi = steps[0][1], steps[-1][2]

    def inside(e) -> bool:
        corr = e.get("args", {}).get("correlation")
        if corr is None:
            return True  # nothing says where it came from
        t = launches.get(corr)  # None: its launch came before the trace recorded host calls (the warm-up)
        return t is not None and lo <= t <= hi
    return [e for e in device_events if inside(e)]


def _parts_ms(parts_us: dict[str, float]) -> dict[str, float]:
    """Every part of PARTS, in milliseconds (parts absent from this view count 0)."""
    return {p: parts_us.get(p, 0.0) / 1000 for p in PARTS}


def _main_thread_and_steps(spans):
    """The training thread (the one with ProfilerStep#N) and each step's (name, start, end) in microseconds."""
    steps = [e for e in spans if e["name"].startswith("ProfilerStep#")]
    if steps:
        main = (steps[0]["pid"], steps[0]["tid"])
        steps = sorted((e for e in steps if (e["pid"], e["tid"]) == main), key=lambda e: e["ts"])
        return main, [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in steps]
    ops = [e for e in spans if e.get("cat") in ("cpu_op", "operator", "user_annotation")]
    if not ops:
        raise UserError("this trace holds no host operators; was it recorded with ProfilerActivity.CPU?")
    count = defaultdict(int)
    for e in ops:
        count[(e["pid"], e["tid"])] += 1
    main = max(count, key=count.get)  # no schedule was used: the whole trace is one "step"
    start = min(e["ts"] for e in spans)
    return main, [("whole trace", start, max(e["ts"] + e["dur"] for e in spans))]


def _phases(spans, main) -> dict[str, list]:
    """Intervals of the training thread by phase ("data", "copy", "compute", "optimizer"), from the engine's
    labels and from what torch labels itself (DataLoader, Optimizer.step)."""
    found = defaultdict(list)
    for e in spans:
        if (e["pid"], e["tid"]) != main or e.get("cat") != "user_annotation":
            continue
        part = PHASE_LABELS.get(e["name"]) or next((p for pre, p in FALLBACK_PHASES if e["name"].startswith(pre)), None)
        if part:
            found[part].append((e["ts"], e["ts"] + e["dur"]))
    return {p: union(found[p]) for p in ("data", "copy", "compute", "optimizer")}


def _is_host_comm(e) -> bool:
    return e["name"].startswith(HOST_COMM_PREFIXES)


def _host_parts(spans, main, phases):
    pid = main[0]
    busy, comm = [], []
    for e in spans:
        if e.get("cat") not in ("cpu_op", "operator", "user_annotation") or e["pid"] != pid:
            continue
        iv = (e["ts"], e["ts"] + e["dur"])
        if _is_host_comm(e):
            comm.append(iv)
        elif (e["pid"], e["tid"]) == main and e.get("cat") != "user_annotation":
            busy.append(iv)
    return [("copy", phases["copy"]), ("data", phases["data"]), ("optimizer", phases["optimizer"]),
            ("compute", union(busy)), ("comm", union(comm)), ("compute", phases["compute"])]


def _launch_times(spans) -> dict:
    """correlation id -> host time of the launch (cudaLaunchKernel, cudaMemcpyAsync, ...)."""
    return {e["args"]["correlation"]: e["ts"] for e in spans
            if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}


BACKLOG_US = 100  # a kernel that starts this long after its launch found the GPU still busy with earlier work


def _gpu_step_windows(steps, device_events, launches):
    """Each step on the GPU's clock. The GPU runs behind the host when it is the bottleneck, so the host's
    ProfilerStep windows would cut GPU work in the wrong places: a step ends when both its host part and the
    GPU work it launched have ended, and starts where the previous one ended."""
    if len(steps) == 1 and steps[0][0] == "whole trace":
        return steps
    ends, firsts = {}, {}
    for e in device_events:
        launched = launches.get(e.get("args", {}).get("correlation"))
        i = _step_index(steps, launched)
        if i is None:
            continue
        ends[i] = max(ends.get(i, 0), e["ts"] + e["dur"])
        if i not in firsts or e["ts"] < firsts[i][0]:
            firsts[i] = (e["ts"], launched)
    windows, start = [], steps[0][1]
    if 0 in firsts and firsts[0][0] - firsts[0][1] > BACKLOG_US:
        start = firsts[0][0]  # before its first kernel the GPU was busy with steps that were not recorded
    for i, (name, _, host_end) in enumerate(steps):
        end = max(host_end, ends.get(i, host_end), start)
        windows.append((name, start, end))
        start = end
    return windows


def _step_index(steps, t):
    if t is None:
        return None
    for i, (_, s, e) in enumerate(steps):
        if s <= t <= e:
            return i
    return None


def _gpu_parts(spans, device_events, phases):
    launches = _launch_times(spans)
    by_part = defaultdict(list)
    for e in device_events:
        iv = (e["ts"], e["ts"] + e["dur"])
        kind = DEVICE_CATS[e["cat"].lower()]
        if kind != "kernel":
            by_part["copy"].append(iv)
        elif "nccl" in e["name"].lower():
            by_part["comm"].append(iv)
        else:
            by_part[_phase_at(launches.get(e.get("args", {}).get("correlation")), phases)].append(iv)
    waiting = union(phases["data"] + phases["copy"])  # the GPU idles while the host fetches a batch
    return [("compute", union(by_part["compute"])), ("optimizer", union(by_part["optimizer"])),
            ("copy", union(by_part["copy"])), ("comm", union(by_part["comm"])), ("data", waiting)]


def _phase_at(t, phases) -> str:
    """The phase the training thread was in when it launched a kernel at host time t."""
    if t is not None:
        for part in ("copy", "data", "optimizer"):
            if covers(phases[part], t):
                return "copy" if part == "data" else part  # kernels launched while fetching: input prep
    return "compute"


def _top_ops_and_kernels(spans, device_events, pid, n_steps):
    """Operators by self CPU time (and the GPU time of the kernels each launched), kernels by GPU time."""
    per_thread = defaultdict(list)
    for e in spans:
        if e["pid"] == pid and e.get("cat") in ("cpu_op", "operator"):
            per_thread[e["tid"]].append((e["ts"], 0, -e["dur"], e))
        elif e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {}):
            per_thread[e["tid"]].append((e["ts"], 1, 0, e))
    ops = defaultdict(lambda: {"calls": 0, "self_us": 0.0, "device_us": 0.0})
    owner = {}  # correlation id -> name of the innermost operator that launched it
    for items in per_thread.values():
        stack = []  # [end, event, child time]
        for ts, is_launch, _, e in sorted(items, key=lambda x: x[:3]):
            while stack and stack[-1][0] <= ts:
                _, done, child = stack.pop()
                ops[done["name"]]["self_us"] += done["dur"] - child
            if is_launch:
                if stack:
                    owner[e["args"]["correlation"]] = stack[-1][1]["name"]
                continue
            if stack:
                stack[-1][2] += e["dur"]
            ops[e["name"]]["calls"] += 1
            stack.append([ts + e["dur"], e, 0.0])
        for _, done, child in stack:
            ops[done["name"]]["self_us"] += done["dur"] - child
    kernels = defaultdict(lambda: {"calls": 0, "us": 0.0})
    for e in device_events:
        name = owner.get(e.get("args", {}).get("correlation"))
        if name:
            ops[name]["device_us"] += e["dur"]
        if DEVICE_CATS[e["cat"].lower()] == "kernel":
            kernels[e["name"]]["calls"] += 1
            kernels[e["name"]]["us"] += e["dur"]
    n = max(1, n_steps)
    op_rows = [{"name": k, "calls": v["calls"] / n, "self_cpu_ms": v["self_us"] / n / 1000,
                "device_ms": v["device_us"] / n / 1000} for k, v in ops.items()]
    op_rows.sort(key=lambda o: (o["device_ms"], o["self_cpu_ms"]) if device_events else o["self_cpu_ms"],
                 reverse=True)
    kernel_rows = sorted(({"name": k, "calls": v["calls"] / n, "ms": v["us"] / n / 1000} for k, v in kernels.items()),
                         key=lambda k: k["ms"], reverse=True)
    return op_rows, kernel_rows


def _peak_memory(events) -> dict:
    peak = {}
    for e in events:
        if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {}):
            a = e["args"]
            dev = "CPU" if a.get("Device Type", 0) == 0 else f"GPU {a.get('Device Id', 0)}"
            peak[dev] = max(peak.get(dev, 0.0), a["Total Allocated"] / 2**20)
    return peak


def _device_name(trace, device_events) -> str:
    if not device_events:
        return "CPU"
    props = trace.get("deviceProperties") or []
    used = {e.get("args", {}).get("device", e.get("pid")) for e in device_events}
    names = [p.get("name", "GPU") for p in props if p.get("id") in used] or [p.get("name", "GPU") for p in props[:1]]
    return ", ".join(sorted(set(names))) or "GPU"


# ---------------------------------------------------------------------- all ranks together
@dataclass
class Summary:
    """Every rank's TraceSummary; shows as text tables in a cell, `plot()` draws them."""
    traces: list[TraceSummary]

    def __getitem__(self, i) -> TraceSummary:
        return self.traces[i]

    def __len__(self) -> int:
        return len(self.traces)

    def side_by_side(self) -> str:
        """The breakdown of every rank in one table (ms per step)."""
        rows = [[PART_LABELS[p]] + [f"{t.parts_ms[p]:.2f}" for t in self.traces] for p in PARTS]
        rows.append(["step time"] + [f"{t.step_ms:.2f}" for t in self.traces])
        return table(["ms/step"] + [t.worker for t in self.traces], rows)

    def report(self, top: int = 10) -> str:
        if len(self.traces) == 1:
            return self.traces[0].report(top)
        first = self.traces[0]
        return "\n\n".join([*(t.header() for t in self.traces), self.side_by_side(),
                            f"{first.worker}: top operators", first.ops_table(top),
                            f"{first.worker}: top GPU kernels", first.kernels_table(top)])

    def __str__(self) -> str:
        return self.report()

    def __repr__(self) -> str:
        return self.report()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.report())

    def plot(self, top: int = 8):
        """One figure: each step's parts for every rank (left), the top kernels or operators of the first
        rank (right). Returns the matplotlib Figure."""
        import matplotlib.pyplot as plt  # most of a second to import: only plots need it

        fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [1.1, 1]})
        labels, bottoms = [], []
        for t in self.traces:
            for i, s in enumerate(t.steps):
                labels.append(f"{t.worker}\n{step_label(s.name)}")
        bottoms = [0.0] * len(labels)
        for p in PARTS:
            heights = [s.parts_ms[p] for t in self.traces for s in t.steps]
            left.bar(range(len(labels)), heights, bottom=bottoms, color=PART_COLORS[p], label=PART_LABELS[p])
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        left.set_xticks(range(len(labels)), labels, fontsize=8)
        left.set_ylabel("ms")
        first = self.traces[0]
        left.set_title(f"where each step's time goes ({first.view} view, {first.device})", fontsize=10)
        left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
        if first.top_kernels:
            items = [(_short(k["name"], 40), k["ms"]) for k in first.top_kernels[:top]]
            right.set_title(f"{first.worker}: top GPU kernels (ms per step)", fontsize=10)
        else:
            items = [(_short(o["name"], 40), o["self_cpu_ms"]) for o in first.top_ops[:top]]
            right.set_title(f"{first.worker}: top operators by self CPU time (ms per step)", fontsize=10)
        right.barh([n for n, _ in items][::-1], [v for _, v in items][::-1], color="tab:blue")
        right.tick_params(axis="y", labelsize=8)
        right.set_xlabel("ms per step")
        fig.tight_layout()
        return fig


def summarize(path: str | os.PathLike, view: str | None = None, top: int = 15, latest: bool = True) -> Summary:
    """Summarise the traces of a run: `path` is its out_dir, its tb/profile folder, or one trace file.

    One TraceSummary per rank (each rank's newest trace unless latest=False). view: "gpu" (the default for
    traces with GPU activity) or "host" (the default on CPU). (Notebook 02 teaches it.)"""
    traces = []
    for worker, files in find_traces(path, latest).items():
        for f in files:
            traces.append(summarize_trace(f, worker if len(files) == 1 else f"{worker}:{_stamp(f)}", view, top))
    return Summary(traces)


# ---------------------------------------------------------------------- text tables
def table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)])


def _short(name: str, width: int) -> str:
    """A kernel or operator name cut to fit a table: no return type, template arguments or parameters."""
    s = re.sub(r"^void ", "", name)
    while re.search(r"<[^<>]*>", s):  # innermost template arguments first
        s = re.sub(r"<[^<>]*>", "\x01", s)
    s = re.sub(r"\(.*\)$", "", s).replace("\x01", "<>") or name
    return s if len(s) <= width else s[: width - 1] + "~"
