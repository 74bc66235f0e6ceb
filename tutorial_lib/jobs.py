"""Slurm batch jobs from the notebooks: render an sbatch file from a site profile, the resources and a
TrainConfig (or any command); submit it, follow it and collect its result.json (see `slurm.py`).

    import tutorial_lib as tl
    path = tl.jobs.write("01_single_gpu", cfg, gpus_per_node=1, time="00:30:00")  # jobs/01_single_gpu.sbatch
    job = tl.jobs.submit(path)               # a Job: .id, .state(), .wait(), .log(), .result()

    python -m tutorial_lib jobs render --site generic --name demo --gpus-per-node 2 steps=100 parallel=ddp
    python -m tutorial_lib jobs submit jobs/demo.sbatch --wait

Launch modes: `single` (one process), `torchrun` (one node, torchrun --standalone, a process per GPU),
`multinode` (one srun task per node, each a torchrun agent; c10d rendezvous on the first node) and `srun`
(one srun task per GPU; RANK etc. from SLURM_PROCID etc.). Site profiles live in tutorial_lib/sites/*.yaml.
This module never imports torch: it runs on login nodes.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shlex
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .config import ConfigError, TrainConfig, UserError, format_value, load
from .results import result_line  # noqa: F401  (tl.jobs.result_line)
from .slurm import Job, SubmitError, submit  # noqa: F401  (tl.jobs.submit, tl.jobs.Job)
from .slurm import available as slurm_available  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]  # the workbook: jobs are submitted from here
JOBS_DIR = ROOT / "jobs"
SITES_DIR = Path(__file__).resolve().parent / "sites"
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
MODES = ("auto", "single", "torchrun", "multinode", "srun")
GPU_REQUESTS = ("gpus-per-node", "gres", "gpus")
RENDER_MARK = "# workbook-render: "
ALWAYS_SHOWN = ("dataset", "model", "batch_size", "steps", "epochs")  # in every job file, even at their default
DEFAULT_LINE_PROFILE = "tutorial_lib.engine.Run.fit,tutorial_lib.engine.Run.train_step"


def default_site() -> str:
    """The site profile used when none is named: $WORKBOOK_SITE, else `generic`."""
    return os.environ.get("WORKBOOK_SITE") or "generic"


# ---------------------------------------------------------------------------------------- validation
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_WORD = re.compile(r"[A-Za-z0-9_.-]+")
_WORDS = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")  # a partition may be a list: gpu,gpu_long
_CONSTRAINT = re.compile(r"[A-Za-z0-9_.&|,*\[\]()-]+")  # Slurm's feature syntax, e.g. gpu&hbm80g
_PATH = re.compile(r"[A-Za-z0-9_./%-]+")
_MEM = re.compile(r"[0-9]+[KMGT]?")
_ARRAY = re.compile(r"[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[0-9]+)?")
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def check_name(field_name: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise UserError(f"{field_name}={value!r}: use 1-64 letters, digits, '_', '.', '-' (starting with a letter "
                        "or digit), e.g. 01_single_gpu; no spaces, slashes or shell characters")
    return value


def _check_pattern(field_name: str, value: Any, pattern: re.Pattern, allowed: str, fix: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise UserError(f"{field_name}={value!r}: only {allowed} may appear (no spaces, newlines or shell "
                        f"characters); {fix}")
    return value


def time_seconds(value: str, field_name: str = "time") -> int:
    """Seconds in a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    m = _TIME.fullmatch(value) if isinstance(value, str) else None
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


def site_names() -> list[str]:
    return sorted(p.stem for p in SITES_DIR.glob("*.yaml"))


def load_site(name: str | os.PathLike | None = None) -> Site:
    """A site profile by name (tutorial_lib/sites/NAME.yaml) or by the path of a YAML file."""
    import yaml

    name = default_site() if name is None else name
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else SITES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"site {str(name)!r} has no profile ({path}); one of {', '.join(site_names())}, or the "
                        "path of your own YAML file (copy tutorial_lib/sites/generic.yaml to start)")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"site profile {path} is not valid YAML ({str(e).splitlines()[0]}); "
                        "quote values that contain ': ' or '#'") from None
    known = {f.name for f in fields(Site)} - {"name"}
    unknown, missing = sorted(set(values) - known), sorted(known - set(values))
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
        if site.gpu_request not in GPU_REQUESTS:
            raise UserError(f"gpu_request={site.gpu_request!r} is not one of {', '.join(GPU_REQUESTS)}")
        for key in ("gpus_per_node", "cpus_per_gpu", "max_nodes"):
            if not isinstance(getattr(site, key), int) or getattr(site, key) < 1:
                raise UserError(f"{key}={getattr(site, key)!r} must be a positive integer")
        time_seconds(site.max_time, "max_time")
        time_seconds(site.default_time, "default_time")
        _check_slurm_words(site)
    except UserError as e:
        raise UserError(where + str(e)) from None
    return site


def _check_slurm_words(r) -> None:
    """Partition, account, qos, constraint and memory of a Site or Resources: nothing a shell would read."""
    if r.partition is not None:
        _check_pattern("partition", r.partition, _WORDS, "letters, digits, '_', '.', '-' and ',' between names",
                       "`sinfo -s` lists the partitions of your cluster")
    if r.account is not None:
        _check_pattern("account", r.account, _WORD, "letters, digits, '_', '.', '-'",
                       "`sacctmgr show assoc user=$USER format=account` lists yours")
    if r.qos is not None:
        _check_pattern("qos", r.qos, _WORD, "letters, digits, '_', '.', '-'",
                       "`sacctmgr show assoc user=$USER format=qos` lists yours")
    if r.constraint is not None:
        _check_pattern("constraint", r.constraint, _CONSTRAINT,
                       "feature names with Slurm's operators & | , * [ ] ( )",
                       "e.g. constraint=gpu or constraint='gpu&hbm80g'; `sinfo -o '%N %f'` lists node features")
    mem = getattr(r, "mem", None) or getattr(r, "mem_per_gpu", None)
    if mem is not None:
        _check_pattern("mem", mem, _MEM, "a number with an optional unit K, M, G or T", "e.g. mem=64G")


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
            import difflib

            close = SYNONYMS.get(key) or next(iter(difflib.get_close_matches(key, known, n=1, cutoff=0.6)), None)
            hint = f" (did you mean {close!r}?)" if close else ""
            raise UserError(f"unknown resource {key!r}{hint}; resources are {', '.join(known)}")
    return Resources(**values)


def resolve(r: Resources, site: Site) -> Resources:
    """Check every field against the site and fill in the site's defaults; errors name the field and the fix."""
    r = replace(r, partition=r.partition if r.partition is not None else site.partition,
                account=r.account if r.account is not None else site.account,
                qos=r.qos if r.qos is not None else site.qos,
                constraint=r.constraint if r.constraint is not None else site.constraint,
                time=r.time or site.default_time)
    _check_counts(r, site)
    _check_slurm_words(r)
    seconds = time_seconds(r.time)
    if seconds > time_seconds(site.max_time):
        raise UserError(f"time={r.time!r} is longer than site {site.name!r} allows ({site.max_time}); ask for at "
                        f"most {site.max_time} and use requeue=<seconds> to continue from a checkpoint")
    if site.account_required and not r.account:
        raise UserError(f"site {site.name!r} charges every job to a project: give account=<your project> "
                        "(`sacctmgr show assoc user=$USER format=account` lists yours)")
    for key in ("output", "error"):
        if getattr(r, key) is not None:
            _check_pattern(key, getattr(r, key), _PATH, "letters, digits, '_', '.', '/', '-' and %-patterns",
                           "e.g. jobs/logs/%x-%j.out (%x job name, %j job id, %A_%a array job and task)")
    if r.array is not None:
        _check_pattern("array", r.array, _ARRAY, "task ids like 0-7, 1,3,5 or 0-15%4", "e.g. array=0-3")
    if r.requeue is not None and not (isinstance(r.requeue, int) and 10 <= r.requeue < min(seconds, 65536)):
        raise UserError(f"requeue={r.requeue!r}: give the seconds before the time limit ({r.time}, {seconds} s) "
                        "at which to checkpoint and requeue, at least 10 and less than the time limit, e.g. "
                        "requeue=300 for a job of a few hours")
    return replace(r, mode=_mode(r), job_name=check_name("job_name", r.job_name) if r.job_name else None)


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


def _mode(r: Resources) -> str:
    mode = r.mode
    if mode == "auto":
        mode = "multinode" if r.nodes > 1 else "torchrun" if r.gpus_per_node > 1 else "single"
    if mode == "single" and (r.nodes > 1 or r.gpus_per_node > 1):
        raise UserError(f"mode='single' runs one process, but nodes={r.nodes} gpus_per_node={r.gpus_per_node}; "
                        "use mode=torchrun (one node), multinode or srun for several GPUs")
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


# ---------------------------------------------------------------------------------------- what runs
@dataclass
class Program:
    """The words of the `program=(...)` array and what they are."""
    words: list[str]  # shell words, quoted
    training: bool  # `-m tutorial_lib train ...`
    python: bool  # the words are arguments of python (so torchrun can run them directly)
    overrides: list[str] = field(default_factory=list)  # the training's key=value (render record)
    out_dir: str | None = None


def _training(cfg: TrainConfig, name: str, world_size: int, swept: set[str] = frozenset()) -> Program:
    if world_size > 1 and cfg.parallel != "ddp":
        raise UserError(f"this job starts {world_size} processes, but parallel={cfg.parallel!r}: add "
                        "parallel=ddp so that they train together (or ask for one GPU)")
    if world_size == 1 and cfg.parallel == "ddp":
        raise UserError("parallel='ddp' needs several processes, but this job starts one; ask for more GPUs "
                        "(gpus_per_node=N) or use parallel=none")
    default = TrainConfig()
    if cfg.out_dir == default.out_dir:
        cfg = cfg.replace(out_dir=f"runs/{name}")  # each job its own folder
    if cfg.progress:
        cfg = cfg.replace(progress=False)  # a log file is not a terminal: step lines instead of a bar
    shown = set(ALWAYS_SHOWN) - {"epochs" if cfg.steps is not None else "steps"}
    changed = {o.split("=", 1)[0] for o in cfg.to_overrides()}
    overrides = [o for o in cfg.to_overrides(only_changed=False) if o.split("=", 1)[0] in changed | shown]
    for item in overrides:
        if "\n" in item or "\r" in item:
            raise UserError(f"{item.split('=')[0]} contains a line break; give it on one line")
    words = ["-m tutorial_lib train"]
    words += [shlex.quote(o) for o in overrides if not o.startswith("out_dir=")]
    if "num_workers" not in swept and not any(o.startswith("num_workers=") for o in overrides):
        words.append('"num_workers=$cpus_per_process"  # one DataLoader worker per CPU of the process')
    return Program(words, True, True, overrides, cfg.out_dir)


def _command(command: str | list[str]) -> Program:
    argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    if not argv:
        raise UserError("command is empty; give the program and its arguments, e.g. command='python train.py'")
    if any("\n" in a for a in argv):
        raise UserError("command contains a line break; give it on one line")
    python = os.path.basename(argv[0]) in ("python", "python3")
    words = [shlex.quote(a) for a in (argv[1:] if python else argv)]
    return Program(words or ["-c", "pass"], False, python, argv)


def sweep_points(sweep: dict[str, list] | list[dict] | None) -> list[dict[str, str]]:
    """A grid {key: [values]} or a list of points [{key: value}], as points of key -> value strings."""
    if not sweep:
        return []
    if isinstance(sweep, dict):
        keys = list(sweep)
        for key in keys:
            if not isinstance(sweep[key], (list, tuple)) or not sweep[key]:
                raise UserError(f"sweep[{key!r}] must be a non-empty list of values, e.g. {{'{key}': [32, 64]}}")
        sweep = [dict(zip(keys, values)) for values in itertools.product(*(sweep[k] for k in keys))]
    points = [{str(k): format_value(v) for k, v in point.items()} for point in sweep]
    if len(points) > 1000:
        raise UserError(f"the sweep has {len(points)} points; a job array of at most 1000 tasks, please")
    return points


def _sweep_words(cfg: TrainConfig, points: list[dict[str, str]], base_out: str) -> list[dict]:
    rendered = []
    for point in points:
        try:
            load(None, [*cfg.to_overrides(), *(f"{k}={v}" for k, v in point.items())])
        except ConfigError as e:
            raise UserError(f"sweep point {point}: {e}") from None
        label = "_".join(f"{k}-{re.sub(r'[^A-Za-z0-9.]+', '-', v)}" for k, v in point.items() if k != "out_dir")
        out_dir = point.get("out_dir") or f"{base_out}/{label}"
        words = [shlex.quote(f"{k}={v}") for k, v in point.items() if k != "out_dir"]
        rendered.append({"out_dir": out_dir, "words": words})
    return rendered


# ---------------------------------------------------------------------------------------- rendering
def render(name: str, cfg: TrainConfig | None = None, *, site: str | None = None, command: str | list | None = None,
           sweep: dict | list | None = None, description: str | None = None, **resource_values: Any) -> str:
    """The text of jobs/<name>.sbatch: `cfg` trained (or `command` run) with the given resources.

    resource_values are the fields of `Resources` (nodes, gpus_per_node, time, partition, requeue, ...);
    `sweep` ({key: [values]} or [{key: value}, ...]) turns the job into an array, one task per point.
    """
    check_name("name", name)
    if (cfg is None) == (command is None):
        raise UserError("give a TrainConfig (cfg) or a command, not both or neither")
    if sweep and cfg is None:
        raise UserError("sweep varies TrainConfig fields; for a command use array=0-N and $SLURM_ARRAY_TASK_ID")
    prof = load_site(site)
    r = resolve(resources(**resource_values), prof)
    points = sweep_points(sweep)
    if points and r.array is not None:
        raise UserError(f"array={r.array!r} and a sweep both set the array; leave array out (the sweep sets it)")
    world = r.nodes * procs_per_node(r)
    if cfg is not None and r.nsys and not cfg.nvtx:
        cfg = cfg.replace(nvtx=True)  # the training marks forward, backward, optimizer... as NVTX ranges
    swept = {key for point in points for key in point}
    program = _training(cfg, name, world, swept) if cfg is not None else _command(command)
    if r.line_profile and not program.training:
        raise UserError("line_profile profiles the training (-m tutorial_lib train); for a command of your own, "
                        "put kernprof -l in the command itself")
    context = _context(name, prof, r, program, points, cfg, description)
    own_file = site is not None and str(site).endswith((".yaml", ".yml"))  # a profile outside tutorial_lib/sites
    record = {"name": name, "site": str(site) if own_file else prof.name, "description": description,
              "resources": resources_record(resource_values),
              "overrides": program.overrides if program.training else None,
              "command": None if program.training else program.overrides, "sweep": points or None}
    context["render_json"] = json.dumps(record, separators=(",", ":"))
    context["render_command"] = render_command(record)
    return _environment().get_template("job.sbatch.j2").render(context)


def resources_record(values: dict[str, Any]) -> dict[str, Any]:
    return resources(**values).given()


def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
                             autoescape=False)
    env.filters["q"] = shlex.quote
    return env


def _context(name, site, r, program, points, cfg, description) -> dict[str, Any]:
    per_task = procs_per_task(r)
    cpus = r.cpus_per_task or site.cpus_per_gpu * max(1, r.gpus_per_node if per_task > 1 else 1)
    if cpus < per_task:
        raise UserError(f"cpus_per_task={cpus} is fewer than the {per_task} processes of each task; give at least "
                        f"cpus_per_task={per_task}")
    r = replace(r, cpus_per_task=cpus, job_name=r.job_name or name,
                output=r.output or ("jobs/logs/%x-%A_%a.out" if points or r.array else "jobs/logs/%x-%j.out"))
    sweep = _sweep_words(cfg, points, program.out_dir) if points else []
    background = " &" if r.requeue else ""
    runner = _runner(r, program, site)
    return {
        "name": name, "site": site, "mode": r.mode, "gpus": r.gpus_per_node, "procs_per_task": per_task,
        "description": description or _describe(program, cfg), "layout": _layout(r, points),
        "directives": directives(r, site, len(points)), "output": _log_name(r.output, r.job_name),
        "program": program,
        "out_dir": program.out_dir, "sweep": sweep, "gpu_monitor": r.gpu_monitor, "requeue": r.requeue,
        "monitor_csv": _monitor_csv(program), "line_profile": bool(r.line_profile), "background": background,
        "launcher": f"{site.launcher} " if site.launcher else "", "command": runner, "nsys": r.nsys,
    }


def _runner(r: Resources, program: Program, site: Site) -> str:
    """What stands before "${program[@]}" on the launch line: one line per wrapper, then python or torchrun."""
    lines = []
    if r.requeue and r.mode in ("torchrun", "multinode"):  # see the templates' comment
        lines.append("bash -c 'trap \"\" USR1; exec \"$@\"' agent")
    if site.launcher:
        lines.append(site.launcher)
    if r.nsys:  # a report per srun task, named by nsys from the task's variables (%q{...})
        lines.append('nsys profile --trace=cuda,nvtx,osrt --force-overwrite=true '
                     '--output="${out_dir:-.}/nsys/%q{SLURM_JOB_ID}.%q{SLURM_PROCID}"')
    last = ""
    if r.mode in ("torchrun", "multinode"):
        last = "torchrun " if program.python else "torchrun --no-python "
    elif r.line_profile:
        targets = DEFAULT_LINE_PROFILE if r.line_profile is True else str(r.line_profile)
        _check_pattern("line_profile", targets, re.compile(r"[A-Za-z0-9_.,/]+"), "dotted names and paths",
                       "e.g. line_profile='tutorial_lib.engine.Run.fit'")
        last = f'kernprof -l -p {targets} -o "$out_dir/line_profile.lprof" '
    elif program.python:
        last = "python "
    return "".join(line + " \\\n    " for line in lines) + last


def _log_name(output: str, job_name: str) -> str:
    """The output pattern as a reader sees it: jobs/logs/demo-<job id>.out."""
    for pattern, meaning in (("%x", job_name), ("%A", "<array job id>"), ("%a", "<task>"), ("%j", "<job id>")):
        output = output.replace(pattern, meaning)
    return output


def _monitor_csv(program: Program) -> str:
    if program.training:
        return '"$out_dir/gpu_monitor.csv"'
    return '"jobs/logs/$SLURM_JOB_NAME-$SLURM_JOB_ID.gpu.csv"'


def _describe(program: Program, cfg: TrainConfig | None) -> str:
    if cfg is None:
        return "runs: " + " ".join(shlex.quote(a) for a in program.overrides)
    length = f"{cfg.steps} steps" if cfg.steps else f"{cfg.epochs} epoch{'s' * (cfg.epochs > 1)}"
    return f"train {cfg.model} on {cfg.dataset} for {length}"


def _layout(r: Resources, points: list) -> str:
    gpus = f"{r.nodes} node{'s' * (r.nodes > 1)} x {r.gpus_per_node} GPU{'s' * (r.gpus_per_node != 1)}"
    world = r.nodes * procs_per_node(r)
    how = {"single": "one process",
           "torchrun": f"torchrun starts {r.gpus_per_node} processes",
           "multinode": f"one torchrun per node, {world} processes",
           "srun": f"one srun task per GPU, {world} processes"}[r.mode]
    array = f" A job array of {len(points)} tasks, one per point of the sweep." if points else ""
    return f"{gpus}: {how} (launch mode {r.mode}).{array}"


def directives(r: Resources, site: Site, n_points: int) -> list[str]:
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
        _check_pattern("reservation", r.reservation, _WORD, "letters, digits, '_', '.', '-'",
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


def _gpu_rows(r: Resources, site: Site) -> list[tuple[str, str]]:
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


def render_command(record: dict) -> str:
    """The `python -m tutorial_lib jobs render ...` line that writes the same file."""
    words = ["python", "-m", "tutorial_lib", "jobs", "render", "--site", record["site"], "--name", record["name"]]
    if record.get("description"):
        words += ["--description", record["description"]]
    for key, value in record["resources"].items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        else:
            words += [flag, str(value)]
    for point in record.get("sweep") or []:
        words += ["--point", " ".join(f"{k}={v}" for k, v in point.items())]
    if record.get("command"):
        words += ["--command", shlex.join(record["command"])]
    words += record.get("overrides") or []
    return shlex.join(words)


# ---------------------------------------------------------------------------------------- files
def write(name: str, cfg: TrainConfig | None = None, *, site: str | None = None, command: str | list | None = None,
          sweep: dict | list | None = None, description: str | None = None, jobs_dir: str | os.PathLike | None = None,
          show: bool = True, **resource_values: Any) -> Path:
    """Render jobs/<name>.sbatch (see `render`), write it and print it (show=False: don't). Returns its path.

    The notebooks call this for the job of each lesson, e.g.
        tl.jobs.write("05_ddp", cfg.replace(parallel="ddp"), gpus_per_node=4, time="00:30:00",
                      description="notebook 05: DDP on one node, 4 GPUs")
    and commit the file: a test renders every jobs/*.sbatch again from its `workbook-render` line and fails
    when the file is stale. site=None uses $WORKBOOK_SITE or `generic`.
    """
    text = render(name, cfg, site=site, command=command, sweep=sweep, description=description, **resource_values)
    path = Path(jobs_dir) if jobs_dir is not None else JOBS_DIR
    path.mkdir(parents=True, exist_ok=True)
    path = path / f"{name}.sbatch"
    path.write_text(text)
    if show:
        print(f"# {_shown_path(path)}\n{text}", end="")
    return path


def _shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def render_record(path: str | os.PathLike) -> dict:
    """The render arguments recorded in a file written by `write` (its `# workbook-render:` line)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(RENDER_MARK):
            return json.loads(line[len(RENDER_MARK):])
    raise UserError(f"{path} has no '{RENDER_MARK.strip()}' line: it was not written by tutorial_lib.jobs")


def rerender(path: str | os.PathLike) -> str:
    """Render a file again from its record: the text it should have with today's templates and profiles."""
    rec = render_record(path)
    cfg = load(None, rec["overrides"]) if rec.get("overrides") is not None else None
    return render(rec["name"], cfg, site=rec["site"], command=rec.get("command"), sweep=rec.get("sweep"),
                  description=rec.get("description"), **rec["resources"])


def stale(jobs_dir: str | os.PathLike | None = None) -> list[Path]:
    """The jobs/*.sbatch files whose text differs from what their record renders today."""
    folder = Path(jobs_dir) if jobs_dir is not None else JOBS_DIR
    return [p for p in sorted(folder.glob("*.sbatch")) if p.read_text() != rerender(p)]


def out_dirs(record: dict) -> list[str]:
    """The out_dir of each task of a rendered job (one for a plain job; none for a command)."""
    if record.get("overrides") is None:
        return []
    cfg = load(None, record["overrides"])
    if not record.get("sweep"):
        return [cfg.out_dir]
    return [p["out_dir"] for p in _sweep_words(cfg, record["sweep"], cfg.out_dir)]


# ---------------------------------------------------------------------------------------- command line
def cli(argv: list[str]) -> int:
    """`python -m tutorial_lib jobs render|submit|status|sites|check ...`; returns the exit code."""
    import sys

    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.cmd == "render":  # key=value overrides may come before, between or after the options
        args.overrides += [x for x in extra if "=" in x and not x.startswith("-")]
        extra = [x for x in extra if x not in args.overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _parser():
    import argparse

    p = argparse.ArgumentParser(prog="python -m tutorial_lib jobs", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="write jobs/NAME.sbatch and print its path")
    r.add_argument("--site", default=None, help=f"site profile: {', '.join(site_names())} or a YAML file "
                   f"(default: $WORKBOOK_SITE or generic; now {default_site()})")
    r.add_argument("--name", required=True, help="the file's name (jobs/NAME.sbatch) and the job's name")
    r.add_argument("--description", help="one line on what the job is for (its header)")
    for f in fields(Resources):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "line_profile":
            r.add_argument(flag, nargs="?", const=True, default=None, metavar="TARGETS",
                           help=f"kernprof -l (default targets {DEFAULT_LINE_PROFILE})")
        elif f.name == "nsys":
            r.add_argument(flag, action="store_true", default=None, help="nsys profile with NVTX ranges")
        else:
            kind = int if "int" in str(f.type) else str
            r.add_argument(flag, type=kind, default=None, metavar=f.name.upper())
    r.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="a job array over every combination of the values (repeat for more keys)")
    r.add_argument("--point", action="append", default=[], metavar="'K=V K=V'", help="one array task's overrides")
    r.add_argument("--command", help="run this command instead of the training")
    r.add_argument("--config", help="YAML file of TrainConfig fields (key=value overrides win)")
    r.add_argument("--jobs-dir", default=None, help="where to write (default: the workbook's jobs/)")
    r.add_argument("--show", action="store_true", help="also print the file")
    r.add_argument("overrides", nargs="*", metavar="key=value", help="TrainConfig fields")
    r.set_defaults(func=_cli_render)
    s = sub.add_parser("submit", help="sbatch a file from the top of the workbook; --wait follows it to the end")
    s.add_argument("path")
    s.add_argument("--wait", action="store_true", help="wait until the job ends; show its log and result")
    s.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    s.set_defaults(func=_cli_submit)
    st = sub.add_parser("status", help="the state of a job (array: of each task)")
    st.add_argument("job_id")
    st.set_defaults(func=lambda a: _print_states(Job(a.job_id)))
    sub.add_parser("sites", help="the site profiles").set_defaults(func=_cli_sites)
    c = sub.add_parser("check", help="fail if a jobs/*.sbatch file is stale (differs from a fresh render)")
    c.add_argument("--jobs-dir", default=None)
    c.set_defaults(func=_cli_check)
    return p


def _cli_render(args) -> int:
    values = {f.name: getattr(args, f.name) for f in fields(Resources) if getattr(args, f.name) is not None}
    if args.command and (args.overrides or args.config or args.sweep or args.point):
        raise UserError("--command runs a command of yours: leave out key=value overrides, --config and sweeps")
    if args.sweep and args.point:
        raise UserError("give the sweep either as --sweep KEY=V1,V2 (every combination) or as --point, not both")
    sweep: dict | list | None = None
    if args.sweep:
        sweep = {}
        for item in args.sweep:
            key, sep, vals = item.partition("=")
            if not sep or not vals:
                raise UserError(f"--sweep {item!r} is not KEY=V1,V2 (e.g. --sweep batch_size=64,128)")
            sweep[key] = vals.split(",")
    elif args.point:
        sweep = [dict(_split_override(w) for w in shlex.split(p)) for p in args.point]
    cfg = None if args.command else load(args.config, args.overrides)
    path = write(args.name, cfg, site=args.site, command=args.command, sweep=sweep, description=args.description,
                 jobs_dir=args.jobs_dir, show=args.show, **values)
    print(_shown_path(path))
    return 0


def _split_override(word: str) -> tuple[str, str]:
    key, sep, value = word.partition("=")
    if not sep:
        raise UserError(f"--point entry {word!r} is not key=value")
    return key, value


def _cli_submit(args) -> int:
    job = submit(args.path)
    print(f"submitted job {job.id}: {args.path}")
    if not args.wait:
        print(f"follow it: squeue -j {job.id}; python -m tutorial_lib jobs status {job.id}")
        return 0
    state = job.wait(timeout=args.timeout)
    print(f"job {job.id} {state}, exit code {job.exit_code()}; log {job.log_path()} ends with:")
    print(job.log(lines=15))
    if state == "COMPLETED":
        for i, res in enumerate(_results_or_empty(job)):
            print(f"result {i}: " + result_line(res))
    return 0 if state == "COMPLETED" else 1


def _results_or_empty(job: Job) -> list[dict]:
    try:
        return job.results()
    except UserError as e:
        print(f"(no result: {e})")
        return []


def _print_states(job: Job) -> int:
    for task, state in job.states().items():
        print(f"{task} {state}")
    return 0


def _cli_sites(args) -> int:
    for name in site_names():
        print(f"{name:12s} {load_site(name).description}")
    return 0


def _cli_check(args) -> int:
    bad = stale(args.jobs_dir)
    for path in bad:
        print(f"stale: {_shown_path(path)} (render it again from its notebook, or: {render_command(render_record(path))})")
    return 1 if bad else 0
