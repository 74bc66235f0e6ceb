"""CPU binding and NUMA, checked (the doctor's `numa` line): each GPU's NUMA node and the CPUs near it (from
`nvidia-smi topo -m`, else from /sys), the CPUs this process may run on (its affinity, as srun --cpu-bind or
torchrun's NUMA binding left it) and the job's binding variables (SLURM_CPU_BIND*), and a warning when the
process runs on CPUs far from its GPU, or on every CPU of a node with several NUMA nodes (unbound): the input
pipeline and the kernel launches then cross the socket link, and throughput drops with no error.

No torch here: the facts come from text (nvidia-smi's, /sys's), so the tests read them from fixtures.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass
class GpuPlace:
    gpu: int  # nvidia-smi's index
    numa_node: int | None  # None: not reported (one NUMA node, or a VM that hides it)
    cpus: frozenset  # the CPUs near it


def cpu_list(text: str) -> frozenset:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11} (Linux's cpulist, nvidia-smi's CPU Affinity)."""
    cpus = set()
    for part in re.sub(r"\s", "", text).split(","):
        if re.fullmatch(r"\d+-\d+", part):
            a, b = map(int, part.split("-"))
            cpus.update(range(a, b + 1))
        elif part.isdigit():
            cpus.add(int(part))
    return frozenset(cpus)


def from_topo(text: str) -> list[GpuPlace]:
    """Each GPU's place from `nvidia-smi topo -m` (tab-separated: GPUn rows, 'CPU Affinity' and 'NUMA Affinity'
    columns)."""
    lines = [line for line in text.splitlines() if line.strip()]
    head = next((line.split("\t") for line in lines if "CPU Affinity" in line), None)
    if head is None:
        return []
    head = [h.strip() for h in head]
    if head[0]:  # the header's leading tab (above the row names) was stripped with the output
        head = ["", *head]
    cpu_col, numa_col = head.index("CPU Affinity"), head.index("NUMA Affinity") if "NUMA Affinity" in head else None
    places = []
    for line in lines:
        cells = [c.strip() for c in line.split("\t")]
        if re.fullmatch(r"GPU\d+", cells[0]) and len(cells) > cpu_col:
            numa = cells[numa_col] if numa_col is not None and len(cells) > numa_col else ""
            places.append(GpuPlace(int(cells[0][3:]), int(numa) if numa.isdigit() else None, cpu_list(cells[cpu_col])))
    return places


def from_sysfs(bus_ids: list[str], root: str | Path = "/sys") -> list[GpuPlace]:
    """Each GPU's place from /sys/bus/pci/devices/<bus id>/{numa_node,local_cpulist}; `bus_ids` as nvidia-smi
    gives them (pci.bus_id: 00000000:18:00.0), in GPU index order."""
    places = []
    for gpu, bus in enumerate(bus_ids):
        name = bus.strip().lower()
        name = name[4:] if re.fullmatch(r"[0-9a-f]{8}:.*", name) else name  # sysfs has a 4-digit domain
        device = Path(root) / "bus" / "pci" / "devices" / name
        try:
            node = int((device / "numa_node").read_text().strip())
            cpus = cpu_list((device / "local_cpulist").read_text())
        except (OSError, ValueError):
            continue
        places.append(GpuPlace(gpu, node if node >= 0 else None, cpus))
    return places


def my_gpu(environ=os.environ) -> int | None:
    """The GPU (nvidia-smi index) this process drives: its local rank's entry of CUDA_VISIBLE_DEVICES (torchrun:
    LOCAL_RANK, srun: SLURM_LOCALID), or the first visible GPU; None when the visible GPUs are given by UUID."""
    local = environ.get("LOCAL_RANK") or environ.get("SLURM_LOCALID") or "0"
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    local = int(local) if local.isdigit() else 0
    if not visible:
        return local
    pick = visible[local % len(visible)]
    return int(pick) if pick.isdigit() else None


def binding(environ=os.environ) -> str:
    """The job's binding as Slurm states it (SLURM_CPU_BIND_TYPE/LIST, SLURM_CPU_BIND) or 'none stated'."""
    said = [f"{k}={environ[k]}" for k in ("SLURM_CPU_BIND", "SLURM_CPU_BIND_TYPE", "SLURM_CPU_BIND_LIST")
            if environ.get(k)]
    return " ".join(said) or "none stated"


def verdict(places: list[GpuPlace], mine: frozenset, gpu: int | None, environ=os.environ) -> tuple[str, str, str]:
    """(status, message, fix) of the binding check: PASS when this process's CPUs all sit near its GPU (or the
    node has one NUMA node), WARN when they don't or when the process may run anywhere on a multi-NUMA node."""
    where = "; ".join(f"GPU {p.gpu}: NUMA node {'?' if p.numa_node is None else p.numa_node}, CPUs "
                      f"{_ranges(p.cpus)}" for p in places)
    nodes = {p.numa_node for p in places if p.numa_node is not None}
    text = f"{where}. This process: CPUs {_ranges(mine)}, binding {binding(environ)}"
    place = next((p for p in places if p.gpu == gpu), None)
    fix = ("bind each rank to its GPU's NUMA node: srun --cpu-bind=... as your site advises, or torchrun "
           "--numa-binding=node where your torch has it (torchrun --help lists it)")
    if not places:
        return "SKIP", "no GPU topology (no nvidia-smi topo -m, no /sys entry)", ""
    if len(nodes) <= 1:
        return "PASS", text + " (one NUMA node: nothing to bind)", ""
    if place is None or not place.cpus:
        return "SKIP", text + f" (GPU {gpu} is not in the topology: its place is unknown)", ""
    if mine <= place.cpus:
        return "PASS", text + f": all on GPU {gpu}'s NUMA node {place.numa_node}", ""
    far = mine - place.cpus
    if frozenset().union(*(p.cpus for p in places)) <= mine:
        return "WARN", text + f": not bound (it may run on any CPU, {len(far)} of them far from GPU {gpu})", fix
    return "WARN", text + f": {len(far)} of its CPUs are far from GPU {gpu} (NUMA node {place.numa_node})", fix


def check_numa(ctx):
    """The doctor's `numa` line (doctor.CHECKS): this process's binding against its GPU's NUMA node."""
    import shutil

    from .sitecheck import Check, run_command

    if shutil.which("nvidia-smi") is None:
        return Check("numa", "SKIP", "no nvidia-smi: no GPU to bind to")
    code, out = run_command(["nvidia-smi", "topo", "-m"], ctx.opts.timeout)
    places = from_topo(out) if code == 0 else []
    if not places:
        code, out = run_command(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], ctx.opts.timeout)
        places = from_sysfs(out.splitlines()) if code == 0 else []
    mine = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
    return Check("numa", *verdict(places, mine, my_gpu()))


def _ranges(cpus) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out) or "none"
