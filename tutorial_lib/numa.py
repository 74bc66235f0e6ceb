"""CPU binding and NUMA, checked (the doctor's `numa` line): each GPU's NUMA node and the CPUs near it (from
`nvidia-smi topo -m`, else from /sys), the CPUs this process may run on (its affinity, as srun --cpu-bind or
torchrun's NUMA binding left it) and the job's binding variables (SLURM_CPU_BIND*), and a warning when the
process runs on CPUs far from its GPU, or on every CPU of a node with several NUMA nodes (unbound): the input
pipeline and the kernel launches then cross the socket link, and throughput drops with no error.

No torch at import: the facts come from text (nvidia-smi's, /sys's), so the tests read them from fixtures.
A job asks `python -m tutorial_lib.numa --torchrun-flag node` on its node whether its torchrun may bind each rank
there (`torchrun_binding`: torch's own binding, tried for every GPU; the job's template prints the answer).
Where torchrun can't bind (no numactl, an older torch), `torchrun --no-python ... python -m tutorial_lib.numa
--exec-bound python -m tutorial_lib train ...` binds each rank by hand (`bind_to_gpu`): the bound-against-unbound
measurement on a GPU node uses it.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import given_gpus


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
        if "CPU Affinity" in cells:  # the header: stripped of its leading tab it starts with 'GPU0' too
            continue
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
    visible = given_gpus(environ)
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
           "--numa-binding=node where your torch has it (torchrun --help lists it); the workbook's jobs bind as the site "
           "profile's numa_binding and cpu_bind say")
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


def gpu_places(timeout: float) -> list[GpuPlace]:
    """Every GPU's place on this node: `nvidia-smi topo -m`, else /sys from the GPUs' bus ids; [] without them."""
    from .sitecheck import run_command  # the doctor's bounded command runner

    if shutil.which("nvidia-smi") is None:
        return []
    code, out = run_command(["nvidia-smi", "topo", "-m"], timeout)
    places = from_topo(out) if code == 0 else []
    if not places:
        code, out = run_command(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], timeout)
        places = from_sysfs(out.splitlines()) if code == 0 else []
    return places


def check_numa(ctx):
    """The doctor's `numa` line (doctor.CHECKS): this process's binding against its GPU's NUMA node."""
    from .sitecheck import Check

    if shutil.which("nvidia-smi") is None:
        return Check("numa", "SKIP", "no nvidia-smi: no GPU to bind to")
    places = gpu_places(ctx.opts.timeout)
    mine = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
    return Check("numa", *verdict(places, mine, my_gpu()))


def bind_to_gpu(environ=os.environ, timeout: float = 30, exclusive: bool = False) -> str:
    """Pin this process to the CPUs near its GPU (its LOCAL_RANK's, as my_gpu finds it), among those it may use: a
    binding by hand that needs no numactl (`python -m tutorial_lib.numa --exec-bound [--exclusive] CMD ...`, which
    then runs CMD, bound: the affinity passes on). `exclusive`: only this rank's share of those CPUs (share), as
    torchrun's --numa-binding=exclusive gives each rank. One line saying what it did."""
    gpu, places = my_gpu(environ), gpu_places(timeout)
    place = next((p for p in places if p.gpu == gpu), None)
    if place is None or not place.cpus:
        return f"off: GPU {gpu} is not in this node's topology (nvidia-smi topo -m)"
    cpus = place.cpus & frozenset(os.sched_getaffinity(0))
    if exclusive:
        ranks = int(environ.get("LOCAL_WORLD_SIZE") or 1)
        used = [my_gpu({**environ, "LOCAL_RANK": str(i)}) for i in range(ranks)]
        cpus = share(cpus, [g for g in used if any(p.gpu == g and p.numa_node == place.numa_node for p in places)], gpu)
    if not cpus:
        return f"off: none of this process's CPUs is near GPU {gpu} (NUMA node {place.numa_node})"
    os.sched_setaffinity(0, cpus)
    return (f"rank {environ.get('RANK', '?')}: GPU {gpu}, CPUs {_ranges(cpus)} (NUMA node {place.numa_node}"
            + (", its share)" if exclusive else ")"))


def share(cpus: frozenset, gpus: list, gpu: int) -> frozenset:
    """The part of `cpus` (those of one NUMA node) that is `gpu`'s when the ranks of `gpus` (all on that node)
    divide them: contiguous runs in CPU order, as even as the count allows, in the order of the GPUs' indices."""
    peers = sorted(set(gpus) | {gpu})
    ordered, n = sorted(cpus), len(peers)
    k = peers.index(gpu)
    return frozenset(ordered[len(ordered) * k // n:len(ordered) * (k + 1) // n])


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


def torchrun_binding(mode: str) -> tuple[str | None, str]:
    """(torchrun's `--numa-binding=MODE`, or None, and why): whether a job's torchrun may bind each rank on this node.
    Off where this torchrun lacks the option (torch < 2.9), numactl is missing (torchrun binds through it), no GPU is
    visible, or torch's binding fails for a GPU (e.g. its NUMA node holds none of the job's CPUs): torchrun would
    stop that rank, so the job runs unbound instead and its log says why."""
    import torch  # a job's one question, on its node

    try:
        from torch.distributed.run import get_args_parser
        from torch.numa import binding
    except ImportError:
        binding = None
    if binding is None or "--numa-binding" not in get_args_parser().format_help():
        return None, f"torch {torch.__version__}'s torchrun has no --numa-binding (torch 2.9 or newer has it)"
    if shutil.which("numactl") is None:
        return None, "no numactl on this node: torchrun binds through it (ask your admins to install it)"
    if not torch.cuda.is_available():
        return None, "no GPU visible here: nothing to bind to"
    options = binding.NumaOptions(affinity_mode=binding.AffinityMode(mode))
    for gpu in range(torch.cuda.device_count()):
        try:  # what torchrun itself runs for the rank of this GPU (a private function: checked, not assumed)
            binding._get_validated_logical_cpus_to_bind_to(device_index=gpu, numa_options=options)
        except Exception as e:  # noqa: BLE001 -- any failure here would stop that rank under torchrun
            return None, f"torch's {mode} binding fails for GPU {gpu} ({type(e).__name__}: {e})"
    return f"--numa-binding={mode}", f"each rank on the CPUs of its GPU's NUMA node (--numa-binding={mode})"


USAGE = ("usage: python -m tutorial_lib.numa --torchrun-flag node|socket|exclusive|core-complex\n"
         "       python -m tutorial_lib.numa --exec-bound [--exclusive] COMMAND [ARG ...]\n"
         "       python -m tutorial_lib.numa --places")


def main(argv: list[str]) -> int:
    """`python -m tutorial_lib.numa --torchrun-flag MODE` (a job's line): the flag on stdout and exit 0, or exit 1;
    either way one line on stderr for the log, saying what was decided and why. `--places`: gpu_places as JSON.
    `--exec-bound [--exclusive] COMMAND ...`: this process bound to its GPU's CPUs (bind_to_gpu; --exclusive: its
    rank's share of them), then COMMAND in its place (torchrun --no-python starts it)."""
    if argv == ["--places"]:  # each GPU's NUMA node and nearby CPUs, as JSON (the study `cluster` records them)
        import json

        print(json.dumps([{"gpu": p.gpu, "numa_node": p.numa_node, "cpus": _ranges(p.cpus)} for p in gpu_places(30)]))
        return 0
    if len(argv) >= 2 and argv[0] == "--exec-bound":
        exclusive = argv[1] == "--exclusive"
        command = argv[2:] if exclusive else argv[1:]
        if not command:
            print(USAGE, file=sys.stderr)
            return 2
        print(f"CPU binding: {bind_to_gpu(exclusive=exclusive)}", file=sys.stderr, flush=True)
        os.execvp(command[0], command)
    if len(argv) != 2 or argv[0] != "--torchrun-flag" or argv[1] not in ("node", "socket", "exclusive", "core-complex"):
        print(USAGE, file=sys.stderr)
        return 2
    flag, why = torchrun_binding(argv[1])
    print(f"CPU binding: {'torchrun ' + flag if flag else 'off'}: {why}", file=sys.stderr)
    if flag:
        print(flag)
    return 0 if flag else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
