"""Site profiles (tutorial_lib/sites/<name>.yaml: what a cluster's jobs must say and set up) and the checks
that keep every value a user gives out of the shell: Slurm words, names, paths, times; and the #SBATCH
lines of a job in the site's syntax (how it asks for GPUs, memory per GPU).

    site = tl.sites.load_site("generic")      # or the path of your own YAML file
    tl.sites.time_seconds("1-12:00:00")       # 129600

No torch here: jobs are rendered on login nodes.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from .config import UserError, check_one_line

SITES_DIR = Path(__file__).resolve().parent / "sites"
GPU_REQUESTS = ("gpus-per-node", "gres", "gpus")


def default_site() -> str:
    """The site profile used when none is named: $WORKBOOK_SITE, else `generic`."""
    return os.environ.get("WORKBOOK_SITE") or "generic"


# ---------------------------------------------------------------------------------------- validation
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
WORD_RE = re.compile(r"[A-Za-z0-9_.-]+")
WORDS_RE = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")  # a partition may be a list: gpu,gpu_long
CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.&|,*\[\]()-]+")  # Slurm's feature syntax, e.g. gpu&hbm80g
PATH_RE = re.compile(r"[A-Za-z0-9_./%-]+")
MEM_RE = re.compile(r"[0-9]+[KMGT]?")
ARRAY_RE = re.compile(r"[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[0-9]+)?")
TIME_RE = re.compile(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?")  # ASCII digits: what sbatch reads


def check_name(field_name: str, value: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise UserError(f"{field_name}={value!r}: use 1-64 letters, digits, '_', '.', '-' (starting with a letter "
                        "or digit), e.g. 01_single_gpu; no spaces, slashes or shell characters")
    return value


def check_pattern(field_name: str, value: Any, pattern: re.Pattern, allowed: str, fix: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UserError(f"{field_name}={value!r}: only {allowed} may appear (no spaces, newlines or shell "
                        f"characters); {fix}")
    return value


def time_seconds(value: str, field_name: str = "time") -> int:
    """Seconds in a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    m = TIME_RE.fullmatch(value) if isinstance(value, str) else None
    if not m:
        raise UserError(f"{field_name}={value!r} is not a Slurm time; write HH:MM:SS (e.g. 02:00:00), "
                        "minutes (e.g. 90) or D-HH:MM:SS (e.g. 1-12:00:00)")
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    if days is not None:
        h, mi, s = a, b or 0, c or 0  # D-HH, D-HH:MM, D-HH:MM:SS
    elif b is None:
        h, mi, s = 0, a, 0  # MM
    elif c is None:
        h, mi, s = 0, a, b  # MM:SS
    else:
        h, mi, s = a, b, c  # HH:MM:SS
    if s > 59 or (mi > 59 and (days is not None or c is not None)):
        raise UserError(f"{field_name}={value!r}: minutes and seconds go up to 59; write e.g. 01:30:00")
    total = (days or 0) * 86400 + h * 3600 + mi * 60 + s
    if total <= 0:
        raise UserError(f"{field_name}={value!r} is zero; give the job some time, e.g. 00:30:00")
    return total


# ---------------------------------------------------------------------------------------- site profiles
@dataclass(frozen=True)
class Site:
    """A cluster's profile (tutorial_lib/sites/<name>.yaml): what a job there must say and set up."""
    name: str
    description: str
    partition: str | None
    account: str | None
    account_required: bool
    qos: str | None
    constraint: str | None
    gpu_request: str
    gpus_per_node: int
    cpus_per_gpu: int
    mem_per_gpu: str | None
    max_nodes: int
    max_time: str
    default_time: str
    shell: str
    setup: str
    launcher: str
    charge_per_gpu_hour: float | None = None  # optional: what one GPU-hour costs here (the ledger's cost column)
    charge_unit: str = "GPU-hours"  # optional: the unit of that charge, e.g. EUR, "core-hours", "allocation units"
    compile_cache: str | None = None  # optional: the shared compile cache (make warm fills it; jobs export it)
    cpu_bind: str | None = None  # optional: srun --cpu-bind=VALUE on every srun line (e.g. cores); null: Slurm's default
    gpu_bind: str | None = None  # optional: srun --gpu-bind=VALUE where srun starts a task per GPU (e.g. closest)
    numa_binding: str | None = None  # optional: torchrun --numa-binding=VALUE (node, ...) where the node allows it
    interconnects: dict | None = None  # optional: {nvlink|pcie|network: bus GB/s}, over INTERCONNECTS' figures


# The links a DDP job runs on, for the card's prediction on a node with fewer than 2 GPUs: (name, bus bandwidth in
# GB/s as nccl-tests reports an all-reduce's, GPUs the prediction is for). Typical figures of current clusters: a
# site profile's `interconnects` gives its own (the doctor's nccl line measures a node's).
INTERCONNECTS = {
    "nvlink": ("NVLink/NVSwitch, 8 GPUs of one node", 300.0, 8),
    "pcie": ("PCIe without NVLink, 4 GPUs of one node", 20.0, 4),
    "network": ("the network between 2 nodes of 8 GPUs (InfiniBand, 200 Gb/s per GPU)", 20.0, 16),
}


OPTIONAL_KEYS = ("charge_per_gpu_hour", "charge_unit", "compile_cache", "cpu_bind", "gpu_bind", "numa_binding",
                 "interconnects")
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")  # torchrun's --numa-binding (torch >= 2.9)
BIND_RE = re.compile(r"[A-Za-z0-9_:,]+")  # Slurm's --cpu-bind / --gpu-bind: cores, map_gpu:0,1, verbose,closest
CACHE_RE = re.compile(r"[A-Za-z0-9_./${}-]+")  # a path; $VARS expand in the job (e.g. $SCRATCH/compile-cache)


def site_names() -> list[str]:
    return sorted(p.stem for p in SITES_DIR.glob("*.yaml"))


def load_site(name: str | os.PathLike | None = None) -> Site:
    """A site profile by name (tutorial_lib/sites/NAME.yaml) or by the path of a YAML file."""
    name = default_site() if name is None else name
    check_one_line("site", str(name))  # --site, site= and $WORKBOOK_SITE alike: the name reaches the job file
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else SITES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"site {str(name)!r} has no profile ({path}); one of {', '.join(site_names())}, or the "
                        "path of your own YAML file (copy tutorial_lib/sites/generic.yaml to start)")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"site profile {path} is not valid YAML ({str(e).splitlines()[0]}); "
                        "quote values that contain ': ' or '#'") from None
    if not isinstance(values, dict):
        raise UserError(f"site profile {path} must be a mapping of `key: value` lines, not a "
                        f"{type(values).__name__}; compare it with tutorial_lib/sites/generic.yaml")
    known = {f.name for f in fields(Site)} - {"name"}
    unknown, missing = sorted(set(values) - known), sorted(known - set(values) - set(OPTIONAL_KEYS))
    if unknown or missing:
        raise UserError(f"site profile {path}: " + (f"unknown key {unknown[0]!r}; " if unknown else "")
                        + (f"missing {', '.join(missing)}; " if missing else "")
                        + "compare it with tutorial_lib/sites/generic.yaml")
    site = Site(name=path.stem, **{k: ("" if v is None and k in ("setup", "launcher") else v)
                                   for k, v in values.items()})
    return _check_site(site, path)


def _check_site(site: Site, path: Path) -> Site:
    where = f"site profile {path}: "
    try:
        for key in ("description", "shell", "launcher"):
            if not isinstance(getattr(site, key), str):
                raise UserError(f"{key}={getattr(site, key)!r} must be text (quote it)")
            check_one_line(key, getattr(site, key))
        if not isinstance(site.setup, str):  # shell lines by design, pasted into the job as they are
            raise UserError(f"setup={site.setup!r} must be text: write its shell lines as a YAML block "
                            "(setup: | and the lines indented below it)")
        _check_charge(site)
        _check_binding(site)
        interconnects(site)
        if site.gpu_request not in GPU_REQUESTS:
            raise UserError(f"gpu_request={site.gpu_request!r} is not one of {', '.join(GPU_REQUESTS)}")
        for key in ("gpus_per_node", "cpus_per_gpu", "max_nodes"):
            value = getattr(site, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"{key}={value!r} must be a positive integer")
        if not isinstance(site.account_required, bool):
            raise UserError(f"account_required={site.account_required!r} must be true or false")
        for key in ("max_time", "default_time"):
            value = getattr(site, key)
            if isinstance(value, int) and not isinstance(value, bool):  # YAML 1.1 reads 48:00:00 as 172800
                hms = f"{value // 3600:02d}:{value // 60 % 60:02d}:{value % 60:02d}"
                raise UserError(f"{key} was read as the number {value}: YAML takes an unquoted time for a number "
                                f"in base 60; quote it: {key}: \"{hms}\"")
            time_seconds(value, key)
        check_slurm_words(site)
    except UserError as e:
        raise UserError(where + str(e)) from None
    return site


def interconnects(site: Site) -> list[dict]:
    """The links of INTERCONNECTS with the site's own bus bandwidths where its profile gives them: each {key, name,
    bus_gb_s, gpus, source}."""
    own = site.interconnects or {}
    if not isinstance(own, dict) or any(k not in INTERCONNECTS for k in own) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in own.values()):
        raise UserError(f"interconnects={own!r} must map some of {', '.join(INTERCONNECTS)} to a bus bandwidth in "
                        "GB/s above 0, e.g. interconnects: {network: 25}")
    return [{"key": k, "name": name, "bus_gb_s": float(own.get(k, gb_s)), "gpus": gpus,
             "source": f"site profile {site.name}" if k in own else "typical"}
            for k, (name, gb_s, gpus) in INTERCONNECTS.items()]


def _check_charge(site: Site) -> None:
    charge = site.charge_per_gpu_hour
    if charge is not None and (isinstance(charge, bool) or not isinstance(charge, (int, float)) or charge < 0):
        raise UserError(f"charge_per_gpu_hour={charge!r} must be a number >= 0 (what one GPU-hour costs, in "
                        "charge_unit), or null")
    if not isinstance(site.charge_unit, str) or not site.charge_unit.strip():
        raise UserError(f"charge_unit={site.charge_unit!r} must be text, e.g. EUR or \"allocation units\"")
    check_one_line("charge_unit", site.charge_unit)


def _check_binding(site: Site) -> None:
    """The binding keys and the compile cache: words srun and torchrun read, a path the job exports."""
    for key in ("cpu_bind", "gpu_bind"):
        if getattr(site, key) is not None:
            check_pattern(key, getattr(site, key), BIND_RE, "letters, digits, '_', ':' and ','",
                          f"e.g. {key}: {'cores' if key == 'cpu_bind' else 'closest'} (`srun --{key.replace('_', '-')}"
                          "=help` lists what your Slurm takes), or null")
    if site.numa_binding is not None and site.numa_binding not in NUMA_BINDINGS:
        raise UserError(f"numa_binding={site.numa_binding!r} is not one of {', '.join(NUMA_BINDINGS)} (torchrun's "
                        "--numa-binding), or null")
    if site.compile_cache is not None:
        check_pattern("compile_cache", site.compile_cache, CACHE_RE, "letters, digits, '_', '.', '/', '-' and $VARS",
                      "e.g. compile_cache: /shared/workshop/compile-cache or $SCRATCH/compile-cache, or null")


def check_slurm_words(r) -> None:
    """Partition, account, qos, constraint and memory of a Site or Resources: nothing a shell would read."""
    if r.partition is not None:
        check_pattern("partition", r.partition, WORDS_RE, "letters, digits, '_', '.', '-' and ',' between names",
                       "`sinfo -s` lists the partitions of your cluster")
    if r.account is not None:
        check_pattern("account", r.account, WORD_RE, "letters, digits, '_', '.', '-'",
                       "`sacctmgr show assoc user=$USER format=account` lists yours")
    if r.qos is not None:
        check_pattern("qos", r.qos, WORD_RE, "letters, digits, '_', '.', '-'",
                       "`sacctmgr show assoc user=$USER format=qos` lists yours")
    if r.constraint is not None:
        check_pattern("constraint", r.constraint, CONSTRAINT_RE,
                       "feature names with Slurm's operators & | , * [ ] ( )",
                       "e.g. constraint=gpu or constraint='gpu&hbm80g'; `sinfo -o '%N %f'` lists node features")
    mem = getattr(r, "mem", None) or getattr(r, "mem_per_gpu", None)
    if mem is not None:
        check_pattern("mem", mem, MEM_RE, "a number with an optional unit K, M, G or T", "e.g. mem=64G")


# ---------------------------------------------------------------------------------------- #SBATCH lines
def directives(r, site: Site, n_points: int) -> list[str]:
    # r: a resolved jobs.Resources (not imported: jobs sits above this module)
    """The #SBATCH lines, each with a comment where its meaning is not obvious."""
    tasks = r.gpus_per_node if r.mode == "srun" else 1
    task_note = {"single": "one process", "torchrun": "one torchrun, which starts a process per GPU",
                 "multinode": "one torchrun per node, which starts a process per GPU",
                 "srun": "one process per GPU"}[r.mode]
    rows = [(f"--job-name={r.job_name}", "")]
    rows += [(f"--partition={r.partition}", "")] if r.partition else []
    rows += [(f"--account={r.account}", "the project charged for the hours")] if r.account else []
    rows += [(f"--qos={r.qos}", "quality of service: priority and limits")] if r.qos else []
    rows += [(f"--constraint={r.constraint}", "node features this job needs")] if r.constraint else []
    if r.reservation is not None:
        check_pattern("reservation", r.reservation, WORD_RE, "letters, digits, '_', '.', '-'",
                       "`scontrol show reservation` lists the reservations of your cluster")
        rows.append((f"--reservation={r.reservation}", "nodes set aside for this group (e.g. a workshop)"))
    rows += [(f"--nodes={r.nodes}", ""), (f"--ntasks-per-node={tasks}", task_note)]
    rows += _gpu_rows(r, site)
    rows.append((f"--cpus-per-task={r.cpus_per_task}", "for each task: its processes and DataLoader workers"))
    mem = r.mem or _mem(site.mem_per_gpu, max(r.gpus_per_node, 1))
    rows += [(f"--mem={mem}", "per node")] if mem else []
    rows.append((f"--time={r.time}", "the job is stopped after this"))
    if n_points:
        rows.append((f"--array=0-{n_points - 1}", "one task per point of the sweep"))
    elif r.array:
        rows.append((f"--array={r.array}", "task ids, in $SLURM_ARRAY_TASK_ID"))
    patterns = "%x job name, %A_%a array job and task" if (n_points or r.array) else "%x job name, %j job id"
    rows.append((f"--output={r.output}", f"{patterns}; the folder must exist"))
    rows += [(f"--error={r.error}", "")] if r.error else []
    if r.requeue:
        rows += [(f"--signal=B:USR1@{r.requeue}", f"USR1 to this script {r.requeue} s before the time limit"),
                 ("--requeue", "the job may go back to the queue (see the USR1 handler)"),
                 ("--open-mode=append", "a requeued run appends to the same log")]
    width = max(len(opt) for opt, _ in rows)
    return [f"#SBATCH {opt:<{width}}  # {note}".rstrip(" #") if note else f"#SBATCH {opt}" for opt, note in rows]


def _gpu_rows(r, site: Site) -> list[tuple[str, str]]:
    if r.gpus_per_node == 0:
        return []
    if site.gpu_request == "gres":
        return [(f"--gres=gpu:{r.gpus_per_node}", "GPUs per node")]
    if site.gpu_request == "gpus":
        return [(f"--gpus={r.gpus_per_node * r.nodes}", f"GPUs in all: {r.gpus_per_node} on each node")]
    return [(f"--gpus-per-node={r.gpus_per_node}", "")]


def _mem(per_gpu: str | None, gpus: int) -> str | None:
    if not per_gpu:
        return None
    number, unit = re.fullmatch(r"([0-9]+)([KMGT]?)", per_gpu).groups()
    return f"{int(number) * gpus}{unit}"
