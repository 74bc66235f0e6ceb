"""What a job asks Slurm for (the resources of tutorial_lib/jobs.py): the Resources a notebook or the command line
gives, checked and resolved against a site profile (its defaults and limits), and the launch mode they imply.
This module never imports torch: it runs on login nodes.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .config import UserError, suggest
from .sites import ARRAY_RE, PATH_RE, Site, check_name, check_pattern, check_slurm_words, time_seconds

MODES = ("auto", "single", "torchrun", "multinode", "srun")

# ---------------------------------------------------------------------------------------- resources
@dataclass
class Resources:
    """What the job asks Slurm for, and which optional pieces its script has. None: the site's default."""
    nodes: int = 1
    gpus_per_node: int = 1
    cpus_per_task: int | None = None  # default: the site's cpus_per_gpu x the GPUs one task drives
    mem: str | None = None  # per node, e.g. 64G; default: the site's mem_per_gpu x GPUs per node
    time: str | None = None  # Slurm time, e.g. 00:30:00; default: the site's default_time
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None  # e.g. a workshop's reservation (`scontrol show reservation` lists them)
    job_name: str | None = None  # default: the file's name
    array: str | None = None  # e.g. 0-7%2; a sweep sets it
    output: str | None = None  # default: jobs/logs/%x-%j.out (%x-%A_%a.out for arrays)
    error: str | None = None  # default: into the output file
    mode: str = "auto"  # auto | single | torchrun | multinode | srun
    gpu_monitor: int | None = None  # seconds between nvidia-smi samples; None: no monitor
    line_profile: bool | str = False  # kernprof -l; a string names what to profile (kernprof -p)
    nsys: bool = False  # nsys profile with NVTX ranges
    requeue: int | None = None  # seconds before the time limit to checkpoint and requeue

    def given(self) -> dict[str, Any]:
        """The fields that differ from the defaults (what the render record keeps)."""
        default = Resources()
        return {k: v for k, v in asdict(self).items() if v != getattr(default, k)}


SYNONYMS = {"gpus": "gpus_per_node", "gres": "gpus_per_node", "gpus_per_task": "gpus_per_node",
            "cpus": "cpus_per_task", "cpus_per_gpu": "cpus_per_task", "memory": "mem", "walltime": "time",
            "time_limit": "time", "name": "job_name", "queue": "partition", "project": "account",
            "features": "constraint", "signal": "requeue"}


def resources(**values: Any) -> Resources:
    known = [f.name for f in fields(Resources)]
    for key in values:
        if key not in known:
            hint = f" (did you mean {SYNONYMS[key]!r}?)" if key in SYNONYMS else suggest(key, known)
            raise UserError(f"unknown resource {key!r}{hint}; resources are {', '.join(known)}")
    return Resources(**values)


def resolve(r: Resources, site: Site, one_process: bool = False) -> Resources:
    """Check every field against the site and fill in the site's defaults; errors name the field and the fix.
    one_process: the program drives every GPU of its node from one process (DataParallel)."""
    r = replace(r, partition=r.partition if r.partition is not None else site.partition,
                account=r.account if r.account is not None else site.account,
                qos=r.qos if r.qos is not None else site.qos,
                constraint=r.constraint if r.constraint is not None else site.constraint,
                time=r.time or site.default_time)
    _check_counts(r, site)
    check_slurm_words(r)
    seconds = time_seconds(r.time)
    if seconds > time_seconds(site.max_time):
        raise UserError(f"time={r.time!r} is longer than site {site.name!r} allows ({site.max_time}); ask for at "
                        f"most {site.max_time} and use requeue=<seconds> to continue from a checkpoint")
    if site.account_required and not r.account:
        raise UserError(f"site {site.name!r} charges every job to a project: give account=<your project> "
                        "(`sacctmgr show assoc user=$USER format=account` lists yours)")
    for key in ("output", "error"):
        if getattr(r, key) is not None:
            check_pattern(key, getattr(r, key), PATH_RE, "letters, digits, '_', '.', '/', '-' and %-patterns",
                           "e.g. jobs/logs/%x-%j.out (%x job name, %j job id, %A_%a array job and task)")
    if r.array is not None:
        check_pattern("array", r.array, ARRAY_RE, "task ids like 0-7, 1,3,5 or 0-15%4", "e.g. array=0-3")
        for first, last in re.findall(r"([0-9]+)-([0-9]+)", r.array):
            if int(first) > int(last):
                raise UserError(f"array={r.array!r}: the range {first}-{last} runs backwards; write {last}-{first}")
    if r.requeue is not None and not (isinstance(r.requeue, int) and 10 <= r.requeue < min(seconds, 65536)):
        raise UserError(f"requeue={r.requeue!r}: give the seconds before the time limit ({r.time}, {seconds} s) "
                        "at which to checkpoint and requeue, at least 10 and less than the time limit, e.g. "
                        "requeue=300 for a job of a few hours")
    return replace(r, mode=_mode(r, one_process), job_name=check_name("job_name", r.job_name) if r.job_name else None)


def _check_counts(r: Resources, site: Site) -> None:
    for key in ("nodes", "gpus_per_node", "cpus_per_task", "gpu_monitor"):
        value = getattr(r, key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0
                                  or (value == 0 and key != "gpus_per_node")):
            raise UserError(f"{key}={value!r} must be a positive whole number")
    if r.gpus_per_node > site.gpus_per_node:
        raise UserError(f"gpus_per_node={r.gpus_per_node}: nodes of site {site.name!r} have {site.gpus_per_node} "
                        f"GPUs; ask for at most {site.gpus_per_node} per node and more nodes (nodes=N) for more")
    if r.nodes > site.max_nodes:
        raise UserError(f"nodes={r.nodes}: site {site.name!r} allows at most {site.max_nodes} nodes per job "
                        "(max_nodes in its profile)")
    if r.mode not in MODES:
        raise UserError(f"mode={r.mode!r} is not one of {', '.join(MODES)}")


def _mode(r: Resources, one_process: bool = False) -> str:
    mode = r.mode
    if mode == "auto":
        mode = "multinode" if r.nodes > 1 else "torchrun" if r.gpus_per_node > 1 and not one_process else "single"
    if mode == "single" and (r.nodes > 1 or (r.gpus_per_node > 1 and not one_process)):
        raise UserError(f"mode='single' runs one process, but nodes={r.nodes} gpus_per_node={r.gpus_per_node}; "
                        "use mode=torchrun (one node), multinode or srun for several GPUs (or parallel=dp: "
                        "DataParallel drives the GPUs of one node from one process)")
    if mode == "torchrun" and r.nodes > 1:
        raise UserError(f"mode='torchrun' runs on one node, but nodes={r.nodes}; use mode=multinode or srun")
    if mode in ("torchrun", "multinode", "srun") and r.gpus_per_node < 1:
        raise UserError(f"mode={mode!r} starts one process per GPU: set gpus_per_node (now 0)")
    if r.line_profile and mode != "single":
        raise UserError(f"line_profile profiles one process, but mode={mode!r} starts several; "
                        "profile a single-GPU job (nodes=1 gpus_per_node=1)")
    return mode


def procs_per_node(r: Resources) -> int:
    return 1 if r.mode == "single" else r.gpus_per_node


def procs_per_task(r: Resources) -> int:
    return r.gpus_per_node if r.mode in ("torchrun", "multinode") else 1
