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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import jinja2

from .config import ROOT, TrainConfig, UserError, check_one_line, load
from .results import atomic_write_text
from .jobkeys import key_lines
from .jobresources import MODES, Resources, procs_per_node, procs_per_task, resolve, resources  # noqa: F401
from .results import result_line  # noqa: F401  (tl.jobs.result_line: notebooks 01, 03)
from .sites import Site, check_name, check_pattern, default_site, directives, load_site
from .slurm import Job, NoSlurm
from .sweeps import as_read, check_as_in_the_job, sweep_points, sweep_words
from .slurm import available as slurm_available  # noqa: F401  (tl.jobs.slurm_available(): notebooks 01-03)
from .slurm import submit as sbatch

JOBS_DIR = ROOT / "jobs"
TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
RENDER_MARK = "# workbook-render: "
ALWAYS_SHOWN = ("dataset", "model", "batch_size", "steps", "epochs")  # in every job file, even at their default
DEFAULT_LINE_PROFILE = "tutorial_lib.engine.Run.fit,tutorial_lib.engine.Run.train_step"


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
