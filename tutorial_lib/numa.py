"""CPU binding and NUMA, checked (the doctor's `numa` line): each GPU's NUMA node and the CPUs near it (from
`nvidia-smi topo -m`, else from /sys), the CPUs this process may run on (its affinity, as srun --cpu-bind or
torchrun's NUMA binding left it) and the job's binding variables (SLURM_CPU_BIND*), and a warning when the
process runs on CPUs far from its GPU, or on every CPU of a node with several NUMA nodes (unbound): the input
pipeline and the kernel launches then cross the socket link, and throughput drops with no error.

No torch at import: the facts come from text (nvidia-smi's, /sys's), so the tests read them from fixtures.
A job asks `python -m tutorial_lib.numa --torchrun-flag node` on its node how its torchrun binds each rank there
(`torchrun_binding`), and the line it prints says which CPUs each local rank gets: torch's own binding
(`--numa-binding`) where torch's private binder has a signature this module knows and numactl is there; else the
workbook's binder (`bind_to_gpu`), each rank run through `python -m tutorial_lib.numa --exec-bound` by torchrun
--no-python (it needs no numactl); else unbound, with the reason. The bound-against-unbound measurement on a GPU
node uses the workbook's binder too.
"""
from __future__ import annotations

import inspect
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


def rank_cpus(environ, places: list[GpuPlace], mine: frozenset, exclusive: bool = False):
    """(GPU, its place or None, CPUs) for the rank of `environ` (its LOCAL_RANK's GPU, as my_gpu finds it): the CPUs
    near its GPU among `mine` (those it may use); `exclusive`: only its share of them (share). No CPUs: none fit."""
    gpu = my_gpu(environ)
    place = next((p for p in places if p.gpu == gpu and p.cpus), None)
    if place is None:
        return gpu, None, frozenset()
    cpus = place.cpus & mine
    if exclusive:
        ranks = int(environ.get("LOCAL_WORLD_SIZE") or 1)
        used = [my_gpu({**environ, "LOCAL_RANK": str(i)}) for i in range(ranks)]
        cpus = share(cpus, [g for g in used if any(p.gpu == g and p.numa_node == place.numa_node for p in places)], gpu)
    return gpu, place, cpus


def bind_to_gpu(environ=os.environ, timeout: float = 30, exclusive: bool = False) -> str:
    """Pin this process to the CPUs near its GPU (rank_cpus), among those it may use: a binding by hand that needs
    no numactl (`python -m tutorial_lib.numa --exec-bound [--exclusive] CMD ...`, which then runs CMD, bound: the
    affinity passes on). `exclusive`: only this rank's share of those CPUs, as torchrun's --numa-binding=exclusive
    gives each rank. One line saying what it did."""
    gpu, place, cpus = rank_cpus(environ, gpu_places(timeout), frozenset(os.sched_getaffinity(0)), exclusive)
    if place is None:
        return f"off: GPU {gpu} is not in this node's topology (nvidia-smi topo -m)"
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


PRIVATE = "_get_validated_logical_cpus_to_bind_to"  # what torchrun runs for each rank (torch.numa.binding)
DEVICE_KEYWORDS = ("device_index", "gpu_index")  # its GPU's keyword: torch 2.14's, 2.13's (older: other names)


def torch_binder(binding):
    """torch's private PRIVATE as `cpus(gpu, options)`, and how it is called; or None and why, when its signature is
    not one this module knows (checked, never assumed: torch renames its keywords between releases)."""
    private = getattr(binding, PRIVATE, None)
    if private is None or not hasattr(binding, "NumaOptions") or not hasattr(binding, "AffinityMode"):
        return None, f"its torch.numa.binding has no {PRIVATE}"
    try:
        params = inspect.signature(private).parameters
    except (TypeError, ValueError):
        return None, f"the signature of its {PRIVATE} can't be read"
    keyword = next((k for k in DEVICE_KEYWORDS if k in params), None)
    needed = {n for n, p in params.items() if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    usable = keyword and "numa_options" in params and needed <= {keyword, "numa_options"} and all(
        params[k].kind in (params[k].KEYWORD_ONLY, params[k].POSITIONAL_OR_KEYWORD) for k in (keyword, "numa_options"))
    if not usable:
        return None, (f"its {PRIVATE}({', '.join(params)}) is not a signature this workbook knows (one of "
                      f"{', '.join(DEVICE_KEYWORDS)}, and numa_options)")
    return (lambda gpu, options: private(**{keyword: gpu, "numa_options": options})), f"{PRIVATE}({keyword}=...)"


def torch_plan(mode: str, gpus: int):
    """{local rank: CPUs} as torchrun's --numa-binding=MODE binds them on this node, and how that was found; or None
    and why torchrun can't bind: no such option (torch < 2.9), a private binder of unknown signature, no numactl
    (torchrun binds through it), or torch's binding fails for a GPU (torchrun would then stop that rank)."""
    import torch

    try:
        from torch.distributed.run import get_args_parser
        from torch.numa import binding
    except ImportError:
        binding = None
    version = torch.__version__
    if binding is None or "--numa-binding" not in get_args_parser().format_help():
        return None, f"torch {version}'s torchrun has no --numa-binding (torch 2.9 or newer has it)"
    cpus, how = torch_binder(binding)
    if cpus is None:
        return None, f"torch {version}: {how}"
    if shutil.which("numactl") is None:
        return None, "no numactl on this node: torchrun binds through it (ask your admins to install it)"
    options, plan = binding.NumaOptions(affinity_mode=binding.AffinityMode(mode)), {}
    for gpu in range(gpus):
        try:  # the call's signature is checked above: what fails here fails inside torch's binding
            plan[gpu] = frozenset(cpus(gpu, options))
        except Exception as e:  # noqa: BLE001 -- any failure here would stop that rank under torchrun
            return None, f"torch {version}'s {mode} binding fails for GPU {gpu} ({type(e).__name__}: {e})"
    return plan, f"torch {version}'s {how}"


def own_plan(mode: str, gpus: int, environ=os.environ, timeout: float = 30):
    """{local rank: CPUs} as the workbook's binder (rank_cpus, from nvidia-smi topo -m or /sys) binds them on this
    node, or None and why it can't."""
    if mode not in ("node", "exclusive"):
        return None, f"it binds to a NUMA node or a share of one (node, exclusive), not {mode}"
    places, mine, plan = gpu_places(timeout), frozenset(os.sched_getaffinity(0)), {}
    for rank in range(gpus):
        gpu, place, cpus = rank_cpus({**environ, "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(gpus)}, places,
                                     mine, mode == "exclusive")
        if not cpus:
            return None, (f"GPU {gpu} is not in this node's topology (nvidia-smi topo -m)" if place is None else
                          f"none of the job's CPUs is near GPU {gpu} (NUMA node {place.numa_node})")
        plan[rank] = cpus
    return plan, "the workbook's binder, python -m tutorial_lib.numa --exec-bound"


def plan_text(plan: dict) -> str:
    """{0: {0, 1}, 1: {0, 1}, 2: {4}} -> 'local ranks 0-1 on CPUs 0-1; local rank 2 on CPUs 4'."""
    ranks: dict = {}
    for rank, cpus in sorted(plan.items()):
        ranks.setdefault(frozenset(cpus), []).append(rank)
    return "; ".join(f"local rank{'s' * (len(r) > 1)} {_ranges(r)} on CPUs {_ranges(c)}" for c, r in ranks.items())


def torchrun_binding(mode: str, python: bool = True) -> tuple[list | None, str]:
    """(the words torchrun takes before the program to bind each rank on this node, or None, and the log's line).
    torch's own binding where torch_plan finds it usable, else the workbook's (torchrun --no-python runs each rank
    through --exec-bound; `python`: the program is python's arguments, so python follows), else None: the job then
    runs unbound and its log says why."""
    import torch  # a job's one question, on its node

    if not torch.cuda.is_available():
        return None, NO_GPU
    gpus = torch.cuda.device_count()
    plan, how = torch_plan(mode, gpus)
    if plan is not None:
        return [f"--numa-binding={mode}"], f"torchrun --numa-binding={mode}, by {how}: {plan_text(plan)}"
    ours, why_not = own_plan(mode, gpus)
    if ours is None:
        return None, f"torchrun can't bind ({how}), nor the workbook's binder ({why_not})"
    words = ["--no-python", sys.executable, "-m", "tutorial_lib.numa", "--exec-bound"]
    words += (["--exclusive"] if mode == "exclusive" else []) + ([sys.executable] if python else [])
    return words, f"{why_not}, as torchrun can't bind here ({how}): {plan_text(ours)}"


NO_GPU = "no GPU visible here: nothing to bind to"
DEV = Path("/dev")


def no_gpu_here() -> bool:
    """Before torch is imported (3.5 s and 650 MB at the start of every job, on every node): no NVIDIA or AMD
    device file and no nvidia-smi, so torch could see no GPU either."""
    devices = [*DEV.glob("nvidia[0-9]*"), *DEV.glob("kfd")]
    return not devices and shutil.which("nvidia-smi") is None


USAGE = ("usage: python -m tutorial_lib.numa --torchrun-flag node|socket|exclusive|core-complex [--no-python]\n"
         "       python -m tutorial_lib.numa --exec-bound [--exclusive] COMMAND [ARG ...]\n"
         "       python -m tutorial_lib.numa --places")
MODES = ("node", "socket", "exclusive", "core-complex")


def main(argv: list[str]) -> int:
    """`python -m tutorial_lib.numa --torchrun-flag MODE [--no-python]` (a job's line): torchrun's binding words on
    stdout, one a line, and exit 0, or exit 1 (--no-python: the job's program is not python's arguments); either
    way one line on stderr for the log, saying which CPUs each local rank gets, or why none is bound.
    `--places`: gpu_places as JSON. `--exec-bound [--exclusive] COMMAND ...`: this process bound to its GPU's CPUs
    (bind_to_gpu; --exclusive: its rank's share of them), then COMMAND in its place (torchrun --no-python starts it)."""
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
    python = argv[2:] != ["--no-python"]
    if len(argv) < 2 or argv[0] != "--torchrun-flag" or argv[1] not in MODES or argv[2:] not in ([], ["--no-python"]):
        print(USAGE, file=sys.stderr)
        return 2
    words, why = (None, NO_GPU) if no_gpu_here() else torchrun_binding(argv[1], python)
    print(f"CPU binding: {why if words else 'off: ' + why}", file=sys.stderr)
    if words:
        print("\n".join(words))
    return 0 if words else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
