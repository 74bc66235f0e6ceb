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

import json
import os
import re
import shlex
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import jinja2

from .config import ROOT, TrainConfig, UserError, check_one_line, load, suggest
from .results import atomic_write_text
from .jobkeys import key_lines
from .results import result_line  # noqa: F401  (tl.jobs.result_line: notebooks 01, 03)
from .sites import (ARRAY_RE, PATH_RE, Site, check_name, check_pattern, check_slurm_words, default_site, directives,
                    load_site, time_seconds)
from .slurm import Job, NoSlurm
from .sweeps import as_read, check_as_in_the_job, sweep_points, sweep_words
from .slurm import available as slurm_available  # noqa: F401  (tl.jobs.slurm_available(): notebooks 01-03)
from .slurm import submit as sbatch

JOBS_DIR = ROOT / "jobs"
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
MODES = ("auto", "single", "torchrun", "multinode", "srun")
RENDER_MARK = "# workbook-render: "
ALWAYS_SHOWN = ("dataset", "model", "batch_size", "steps", "epochs")  # in every job file, even at their default
DEFAULT_LINE_PROFILE = "tutorial_lib.engine.Run.fit,tutorial_lib.engine.Run.train_step"


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


# ---------------------------------------------------------------------------------------- what runs
@dataclass
class Program:
    """The words of the `program=(...)` array and what they are."""
    words: list[str]  # shell words, quoted
    training: bool  # `-m tutorial_lib train ...`
    python: bool  # the words are arguments of python (so torchrun can run them directly)
    overrides: list[str] = field(default_factory=list)  # the training's key=value (render record)
    out_dir: str | None = None
    workers: int | None = None  # num_workers, where the config sets a number (None: auto)


def _launched(r: Resources) -> bool:
    """Whether the job's processes learn their rank from a launcher (distributed.read_env): torchrun's, also for
    one process; srun's tasks when there are several."""
    return r.mode in ("torchrun", "multinode") or r.nodes * procs_per_node(r) > 1


def _training(cfg: TrainConfig, name: str, world_size: int, launched: bool) -> Program:
    check_as_in_the_job(cfg, world_size, launched)
    default = TrainConfig()
    if cfg.out_dir == default.out_dir:
        cfg = cfg.replace(out_dir=f"runs/{name}")  # each job its own folder
    if cfg.progress:
        cfg = cfg.replace(progress=False)  # a log file is not a terminal: step lines instead of a bar
    shown = set(ALWAYS_SHOWN) - {"epochs" if cfg.steps is not None else "steps"}
    changed = {o.split("=", 1)[0] for o in cfg.to_overrides()}
    overrides = [o for o in cfg.to_overrides(only_changed=False) if o.split("=", 1)[0] in changed | shown]
    for item in overrides:
        check_one_line(*item.split("=", 1))
    words = ["-m tutorial_lib train"]
    words += [shlex.quote(o) for o in overrides if not o.startswith("out_dir=")]
    workers = None if cfg.num_workers == "auto" else cfg.num_workers  # auto: resolved in the job, at run time
    return Program(words, True, True, overrides, cfg.out_dir, workers)


def _command(command: str | list[str]) -> Program:
    lines = command.strip().splitlines() if isinstance(command, str) else []
    if len(lines) > 1:  # shlex.split reads a newline as a space: two commands would silently become one
        raise UserError(f"command holds {len(lines)} lines ({lines[0]!r}, ...): a job runs one command; join them "
                        "with && or put them in a script and run that")
    argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    if not argv:
        raise UserError("command is empty; give the program and its arguments, e.g. command='python train.py'")
    for word in argv:
        check_one_line("command", word)
    python = os.path.basename(argv[0]) in ("python", "python3")
    words = [shlex.quote(a) for a in (argv[1:] if python else argv)]
    return Program(words or ["-c", "pass"], False, python, argv)


# ---------------------------------------------------------------------------------------- rendering
def render(name: str, cfg: TrainConfig | None = None, *, site: str | None = None, command: str | list | None = None,
           sweep: dict | list | None = None, description: str | None = None, where: str | None = None,
           **resource_values: Any) -> str:
    """The text of jobs/<name>.sbatch: `cfg` trained (or `command` run) with the given resources. `where`: the
    file's path as its header names it (default jobs/<name>.sbatch; `write` passes the folder it writes into).

    resource_values are the fields of `Resources` (nodes, gpus_per_node, time, partition, requeue, ...);
    `sweep` ({key: [values]} or [{key: value}, ...]) turns the job into an array, one task per point.
    """
    check_name("name", name)
    if description is not None:
        check_one_line("description", str(description))
    if site is not None:
        check_one_line("site", str(site))
    if (cfg is None) == (command is None):
        raise UserError("give a TrainConfig (cfg) or a command, not both or neither")
    if sweep and cfg is None:
        raise UserError("sweep varies TrainConfig fields; for a command use array=0-N and $SLURM_ARRAY_TASK_ID")
    profile = load_site(site)
    r = resolve(resources(**resource_values), profile, one_process=cfg is not None and cfg.parallel == "dp")
    points = sweep_points(sweep)
    if points and cfg is not None:
        points = as_read(cfg, points, r.nodes * procs_per_node(r), _launched(r))
    if points and r.array is not None:
        raise UserError(f"array={r.array!r} and a sweep both set the array; leave array out (the sweep sets it)")
    world = r.nodes * procs_per_node(r)
    if cfg is not None and r.nsys and not cfg.nvtx:
        cfg = cfg.replace(nvtx=True)  # the training marks forward, backward, optimizer... as NVTX ranges
    program = _training(cfg, name, world, _launched(r)) if cfg is not None else _command(command)
    if r.line_profile and not program.training:
        raise UserError("line_profile profiles the training (-m tutorial_lib train); for a command of your own, "
                        "put kernprof -l in the command itself")
    context = _context(name, profile, r, program, points, cfg, description)
    named = str(site if site is not None else default_site())
    own_file = named.endswith((".yaml", ".yml"))  # a profile outside tutorial_lib/sites (also by $WORKBOOK_SITE)
    record = {"name": name, "site": named if own_file else profile.name, "description": description,
              "resources": resources_record(resource_values),
              "overrides": program.overrides if program.training else None,
              "command": None if program.training else program.overrides, "sweep": points or None}
    context["where"] = where or f"jobs/{name}.sbatch"
    context["render_json"] = json.dumps(record, separators=(",", ":"))
    context["render_command"] = render_command(record)
    return _environment().get_template("job.sbatch.j2").render(context)


def resources_record(values: dict[str, Any]) -> dict[str, Any]:
    return resources(**values).given()


def _environment():
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
    sweep = sweep_words(cfg, points, program.out_dir) if points else []
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
        "tools": _tools(r, site), "own_files": _own_files(r, program),
    }


def _own_files(r: Resources, program: Program) -> list[str]:
    """The files a training job writes into out_dir itself (the training writes its own files safely)."""
    if not program.training:
        return []
    return [name for name, on in (("gpu_monitor.csv", r.gpu_monitor), ("line_profile.lprof", r.line_profile),
                                  ("nsys", r.nsys)) if on]


def _tools(r: Resources, site: Site) -> list[tuple[str, str]]:
    """Programs the job runs that a node may lack, each with how to get it (checked at the top of the job)."""
    where = f"add what provides it to the setup of site profile '{site.name}'"
    tools = []
    if r.nsys:
        tools.append(("nsys", f"{where} (e.g. module load nsight-systems, or the CUDA module that ships it)"))
    if r.line_profile:
        tools.append(("kernprof", f"pip install line_profiler into the environment the job activates (the setup "
                                  f"of site profile '{site.name}')"))
    return tools


def _runner(r: Resources, program: Program, site: Site) -> str:
    """What stands before "${program[@]}" on the launch line: one line per wrapper, then python or torchrun."""
    lines = []
    if r.requeue and r.mode in ("torchrun", "multinode"):  # see the templates' comment
        lines.append("bash -c 'trap \"\" USR1; exec \"$@\"' agent")
    if site.launcher:
        lines.append(site.launcher)
    if r.nsys:  # a report per srun task, named by nsys from the task's variables (%q{...})
        lines.append('nsys profile --trace=cuda,nvtx,osrt --capture-range=cudaProfilerApi --capture-range-end=stop '
                     '--cuda-graph-trace=node --force-overwrite=true '
                     '--output="${out_dir:-.}/nsys/%q{SLURM_JOB_ID}.%q{SLURM_PROCID}"')
    last = ""
    if r.mode in ("torchrun", "multinode"):  # one node: torchrun with its stores on 127.0.0.1 (tutorial_lib.launcher)
        last = "torchrun " if r.mode == "multinode" else "python -m tutorial_lib.launcher "
        last += "" if program.python else "--no-python "
    elif r.line_profile:
        targets = DEFAULT_LINE_PROFILE if r.line_profile is True else str(r.line_profile)
        check_pattern("line_profile", targets, re.compile(r"[A-Za-z0-9_.,/]+"), "dotted names and paths",
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
    """Render jobs/<name>.sbatch (see `render`), write it and print its key lines (show=False: don't). Returns its path.

    The notebooks call this for the job of each lesson, e.g.
        tl.jobs.write("05_ddp", cfg.replace(parallel="ddp"), gpus_per_node=4, time="00:30:00",
                      description="notebook 05: DDP on one node, 4 GPUs")
    and commit the file: a test renders every jobs/*.sbatch again from its `workbook-render` line and fails
    when the file is stale. site=None uses $WORKBOOK_SITE or `generic`.
    (Notebook 01 teaches it.)
    """
    path = Path(jobs_dir) if jobs_dir is not None else JOBS_DIR
    text = render(name, cfg, site=site, command=command, sweep=sweep, description=description,
                  where=shown_path(path / f"{name}.sbatch"), **resource_values)
    path = path / f"{name}.sbatch"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"can't write {path} ({e.strerror}); give a jobs folder you can write (jobs_dir=, "
                        "--jobs-dir)") from None
    atomic_write_text(path, text)  # whole or not at all: a reader (sbatch, a test beside a notebook) never sees half
    if show:
        print(key_lines(text, shown_path(path)))  # the file explains every line; the screen shows the key ones
    return path


def shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def render_record(path: str | os.PathLike) -> dict:
    """The render arguments recorded in a file written by `write` (its `# workbook-render:` line)."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(RENDER_MARK):
            try:
                record = json.loads(line[len(RENDER_MARK):])
            except ValueError as e:
                record = e
            if not (isinstance(record, dict) and {"name", "site", "resources"} <= set(record)):
                raise UserError(f"{path}: its '{RENDER_MARK.strip()}' line is damaged (edited by hand?); render the "
                                "file again from its notebook, or restore it with `git checkout`")
            return record
    raise UserError(f"{path} has no '{RENDER_MARK.strip()}' line: it was not written by tutorial_lib.jobs")


def rerender(path: str | os.PathLike) -> str:
    """Render a file again from its record: the text it should have with today's templates and profiles."""
    rec = render_record(path)
    cfg = load(None, rec["overrides"]) if rec.get("overrides") is not None else None
    return render(rec["name"], cfg, site=rec["site"], command=rec.get("command"), sweep=rec.get("sweep"),
                  description=rec.get("description"), where=shown_path(Path(path)), **rec["resources"])


def stale(jobs_dir: str | os.PathLike | None = None) -> list[Path]:
    """The jobs/*.sbatch files whose text differs from what their record renders today."""
    folder = Path(jobs_dir) if jobs_dir is not None else JOBS_DIR
    if not folder.is_dir():
        raise UserError(f"jobs folder {str(folder)!r} does not exist; give the folder of the .sbatch files "
                        "(default: the workbook's jobs/)")
    return [p for p in sorted(folder.glob("*.sbatch")) if p.read_text() != rerender(p)]


def submit(path: str | os.PathLike, *, cwd: str | os.PathLike | None = None,
           sbatch_args: list[str] | tuple = ()) -> Job:
    """Submit a job file written by `write` (notebook 01 teaches it); returns a tl.slurm.Job that knows where
    each task's result.json goes. Without Slurm here, the error says how to run the same thing without it."""
    record = _record_or_none(path)
    try:
        return sbatch(path, cwd=cwd, sbatch_args=sbatch_args, out_dirs=out_dirs(record) if record else None)
    except NoSlurm as e:
        raise UserError(f"{e}. {_without_slurm(Path(path), record)}\nor submit the file on a cluster's login "
                        "node. As root, `make slurm-up` starts the workbook's local test cluster.") from None


def attach(job_id: str, path: str | os.PathLike) -> Job:
    """The Job `job_id` submitted from `path` (a file written by `write`), to follow it or read its results."""
    record = render_record(path)
    return Job(str(job_id), Path(path), out_dirs(record))


def _record_or_none(path) -> dict | None:
    try:
        return render_record(path)
    except (UserError, OSError):
        return None


def _without_slurm(path: Path, rec: dict | None) -> str:
    """How to run what the file runs, here, without Slurm."""
    if rec and rec.get("overrides") is not None:
        gpus = rec["resources"].get("gpus_per_node", 1) * rec["resources"].get("nodes", 1)
        start = (f"torchrun --standalone --nproc_per_node={gpus} -m tutorial_lib train" if gpus > 1
                 else "python -m tutorial_lib train")
        return ("To run the same training here without Slurm, from the top of the workbook:\n    "
                f"{start} " + shlex.join(rec["overrides"]))
    if rec and rec.get("command"):
        return "To run its command here without Slurm, from the top of the workbook:\n    " + shlex.join(rec["command"])
    return f"Run its commands by hand (bash {path} needs Slurm's variables)"


def out_dirs(record: dict) -> list[str]:
    """The out_dir of each task of a rendered job (one for a plain job; none for a command)."""
    if record.get("overrides") is None:
        return []
    cfg = load(None, record["overrides"])
    if not record.get("sweep"):
        return [cfg.out_dir]
    return [p["out_dir"] for p in sweep_words(cfg, record["sweep"], cfg.out_dir)]
