"""The whole command line: python -m tutorial_lib {train,bench,ladder,study,card,data,jobs,doctor,hang,warm} ...

    python -m tutorial_lib train dataset=shapes model=resnet18 steps=40 batch_size=32 out_dir=runs/demo
    python -m tutorial_lib train --config configs/baseline.yaml precision=bf16
    torchrun --nproc_per_node=2 -m tutorial_lib train parallel=ddp ...
    python -m tutorial_lib bench loader=gpu_resident precision=bf16     # IO / SYNTHETIC / FULL and a verdict
    python -m tutorial_lib ladder --small                               # notebook 04's optimization ladder
    python -m tutorial_lib study --list                                 # the GPU studies behind the notebooks
    python -m tutorial_lib study ladder --reference                     # one of them, on a GPU node
    python -m tutorial_lib card my_models.py:make_model --batch my_models.py:batch   # the card of your model
    python -m tutorial_lib data fetch cifar10                           # on a login node with internet
    python -m tutorial_lib jobs render --site generic --name demo steps=100
    python -m tutorial_lib jobs submit jobs/demo.sbatch --wait
    python -m tutorial_lib doctor                                       # the workshop pre-flight
    python -m tutorial_lib hang runs/my_job                             # a hung run: which rank, which collective
    python -m tutorial_lib warm                                         # make warm: the shared compile cache

Each subcommand is one function below, calling the module that does the work, so "go to definition" from here
lands in the right file. The torch-free modules are imported here at the top; a module that imports torch is
imported inside its subcommand (after the arguments are checked), so that `jobs` runs on a login node without
torch and bad input fails at once. Bad input ends in one line, `error: ...`, and exit code 2.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from dataclasses import fields
from pathlib import Path

from . import compilecache, doctor as doctor_module, perfdoc, reference
from .config import UserError, key_help, load
from .jobs import DEFAULT_LINE_PROFILE, Resources, render_command, render_record, shown_path
from .jobs import stale as stale_jobs, submit as submit_job, write as write_job
from .lessons import size, studies
from .results import make_folder, result_line
from .sites import default_site, load_site, site_names
from .slurm import Job


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file of TrainConfig fields (named ones in configs/); key=value wins")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="TrainConfig fields; the keys are below")


def _keys_epilog() -> str:
    return "keys (default; allowed values) meaning:\n" + "\n".join(
        f"  {name}={default}{f'  ({allowed})' if allowed else ''}  {meaning}"
        for name, (default, allowed, meaning) in key_help().items())


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=description, epilog=_keys_epilog(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


# ---------------------------------------------------------------------------------------------- train
def train(argv: list[str]) -> int:
    p = _parser("python -m tutorial_lib train", "Train with the workbook's engine; writes <out_dir>/result.json.")
    _config_args(p)
    args = p.parse_args(argv)
    cfg = load(args.config, args.overrides)  # bad input fails here, before torch is imported
    from . import engine  # imports torch
    from .lessons import hang as hang_module

    if cfg.parallel == "ddp":  # a hang leaves each rank's record of its collectives in out_dir/flight_recorder
        hang_module.record_collectives(cfg.out_dir)

    started = time.time()
    try:
        result = engine.train(cfg)
    except engine.Preempted:
        return engine.EXIT_PREEMPTED
    if os.environ.get("RANK", "0") == "0":
        print(result.summary())
        written = os.path.getmtime(os.path.join(cfg.out_dir, "result.json")) >= started  # not for a finished run
        print(f"{'wrote' if written else 'kept'} {cfg.out_dir}/result.json")
    return 0


# ---------------------------------------------------------------------------------------------- bench
def bench(argv: list[str]) -> int:
    from .lessons import bench as bench_module  # imports torch

    p = _parser("python -m tutorial_lib bench", bench_module.__doc__.split("\n\n", 1)[1])
    p.add_argument("--steps", type=int, help="timed steps per measure (default: steps=, else 100)")
    p.add_argument("--window", type=int, help="steps per timed window (default: steps / 10)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: timing_warmup=)")
    p.add_argument("--measures", default=",".join(bench_module.MEASURES),
                   help="comma-separated subset of io,synthetic,full")
    _config_args(p)
    args = p.parse_args(argv)
    for name in ("steps", "window", "warmup"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warmup" else 1):
            raise UserError(f"--{name}={value} must be {'>= 0' if name == 'warmup' else 'a positive integer'}")
    cfg = load(args.config, args.overrides)
    result = bench_module.bench(cfg, args.steps, args.window, args.warmup,
                                tuple(m for m in args.measures.split(",") if m))
    if os.environ.get("RANK", "0") == "0":
        print(result.summary())
        print(f"wrote {cfg.out_dir}/bench.json")
    return 0


# ---------------------------------------------------------------------------------------------- ladder
def ladder(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tutorial_lib ladder", description="The optimization ladder of "
                                "notebook 04, every rung measured in this process (tutorial_lib/lessons/ladder.py).")
    p.add_argument("--small", action="store_true", help="tiny sizes: every rung a CPU can run, in minutes (default: "
                   "small without a GPU, or as $WORKBOOK_SIZE says)")
    p.add_argument("--only", help="comma-separated rungs to measure (the others are left out)")
    p.add_argument("--compile-on-cpu", action="store_true", help="also run the compiled rungs on a CPU (minutes)")
    p.add_argument("--out", default="runs/04_ladder", help="where ladder.json and ladder.md go")
    p.add_argument("--trace", action="store_true", help="also profile the bf16 eager and the last rung (GPU)")
    p.add_argument("--roofline", action="store_true", help="only the traces, their kernel classes against the card's "
                   "peak (with --reference: notebooks/reference/04_roofline_<card>.json)")
    p.add_argument("--reference", action="store_true", help="with --roofline: write its reference records (GPU)")
    p.add_argument("--doc", action="store_true", help="measure nothing: render docs/performance.md again from "
                   "notebooks/reference/04_ladder_*.json and 04_roofline_*.json")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="changes to the base (fp32) rung")
    args = p.parse_args(argv)
    if args.doc:
        print(f"wrote {perfdoc.write()} from the reference files in {reference.FOLDER}")
        return 0
    if args.reference and not args.roofline:
        raise UserError("the ladder's reference records come from `python -m tutorial_lib study ladder --reference` "
                        "(the ladder, its traces and the bench at configs/optimized.yaml); --reference here goes "
                        "with --roofline")
    cfg = load(None, args.overrides)
    given = {key: getattr(cfg, key) for key in (o.split("=", 1)[0].strip() for o in args.overrides)}
    from .lessons import ladder as ladder_module  # imports torch

    sizes = ladder_module.sizes_for(size.current(args.small))
    if args.roofline:
        return roofline(ladder_module, sizes, given, args.reference)
    make_folder(args.out, f"--out {args.out!r}", "give a folder you can write")  # before the rungs run, not after
    rows = ladder_module.run(sizes, given, args.only.split(",") if args.only else None, args.compile_on_cpu)
    trace = ladder_module.traces(sizes, given) if args.trace else {}
    json_path, md_path = ladder_module.save(rows, args.out, trace)
    print(ladder_module.markdown(rows))
    print(f"wrote {json_path} and {md_path}")
    return 0


def roofline(ladder_module, sizes, given: dict, write: bool) -> int:
    """`ladder --roofline`: profile the traced rungs only and print each one's kernel classes against the peak."""
    trace = ladder_module.traces(sizes, given)
    for name, t in trace.items():
        print("\n".join(perfdoc.roofline_lines(t, name)) or f"{name}: {t.get('error', 'no tensor-core kernels')}")
    device = next((t["device"] for t in trace.values() if "device" in t), None)
    if write and device:
        for name in ladder_module.reference_names("04_roofline", device):
            print(f"wrote {reference.write(name, {'traces': trace}, script='python -m tutorial_lib ladder --roofline')}")
    return 0


# ---------------------------------------------------------------------------------------------- study
def study(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tutorial_lib study", description=studies.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="the study to run (--list names them)")
    p.add_argument("--list", action="store_true", help="list the studies and exit")
    p.add_argument("--small", action="store_true", help="tiny sizes on this machine (the CPU check; default: small "
                   "without a GPU, or as $WORKBOOK_SIZE says)")
    p.add_argument("--reference", action="store_true", help="also write notebooks/reference/ (full sizes, a GPU)")
    p.add_argument("--out", help="where its tables, logs and reference records go (default: runs/study_NAME)")
    p.add_argument("--only", action="append", metavar="CASE,...",
                   help="run just these cases and merge their records into the study's existing record")
    p.add_argument("--compare", metavar="OLD.json", help="measure nothing: compare the study's committed record "
                   "(notebooks/reference/) case by case with an older one of the same study (a rerun's check)")
    args = p.parse_args(argv)
    if args.list or not args.name:
        print(studies.listing())
        return 0 if args.list else 2
    study = studies.get(args.name)  # an unknown name fails here, before any work
    if args.compare:
        old = Path(args.compare)
        if not old.is_file():
            raise UserError(f"--compare {args.compare}: no such file; give an older record of study {args.name}, "
                            f"e.g. git show HEAD~1:notebooks/reference/<name>.json > old.json")
        record = reference.read(old, f"give an older record of study {args.name}, e.g. git show "
                                f"HEAD~1:notebooks/reference/<name>.json > old.json")
        ours = study.scripts()
        if record.get("script") not in ours:
            raise UserError(f"--compare {args.compare}: a record of {record.get('script')!r}, not of study "
                            f"{args.name} ({' or '.join(ours)})")
        print("\n".join(studies.comparison_lines(record, studies.counterpart(record, scripts=ours))))
        return 0
    studies.run(args.name, size.current(args.small), args.out or f"runs/study_{args.name}", args.reference,
                args.only)
    return 0


# ---------------------------------------------------------------------------------------------- card
def card(argv: list[str]) -> int:
    """`card MODULE:FUNCTION`: every measurement of the workbook on a model of yours (tutorial_lib/lessons/card.py)."""
    p = argparse.ArgumentParser(prog="python -m tutorial_lib card", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="The card of your model: IO / SYNTHETIC / FULL, the optimization ladder's "
                                "rungs, FLOPs and MFU, memory, DDP predicted, a recommended configuration and its job.",
                                epilog=_card_epilog())
    p.add_argument("model", help="MODULE:FUNCTION that builds the model (MODULE: a .py file or an importable module)")
    p.add_argument("--batch", help="MODULE:FUNCTION returning (input, target), a Dataset or a DataLoader "
                   "(default: the function `batch` beside the model's)")
    p.add_argument("--loss", help="MODULE:FUNCTION (output, target) -> scalar (default: cross-entropy for integer "
                   "targets, mean squared error for float targets of the output's shape)")
    p.add_argument("--small", action="store_true", help="tiny sizes (default: small without a GPU, or as "
                   "$WORKBOOK_SIZE says)")
    p.add_argument("--train", action="store_true", help="measure nothing: train the model with the engine at the "
                   "key=value given (what the card's job runs); writes <out_dir>/result.json")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="TrainConfig fields, or the card's keys below")
    args = p.parse_intermixed_args(argv)  # key=value before, between or after the options
    values = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"{item!r} is not key=value (e.g. precision=bf16 or steps=20)")
        values[key.strip()] = value
    from .lessons import card as card_module  # imports torch

    if args.train:
        result = card_module.train(args.model, args.batch, args.loss, **values)
        print(result.summary())
        return 0
    card_module.card(args.model, args.batch, args.loss, small=args.small or None, **values)
    return 0


CARD_KEYS = ("steps", "window", "warmup", "rungs", "compile_on_cpu", "out", "site", "jobs_dir", "job_steps",
             "ddp_gpus")


def _card_epilog() -> str:  # the keys of lessons.card.CARD_KEYS (a test holds the two equal), without importing torch
    return (f"the card's own keys: {', '.join(CARD_KEYS)} (their meaning: tutorial_lib/lessons/card.py, CARD_KEYS); "
            "every other key is a TrainConfig field (python -m tutorial_lib train --help lists them)")


# ---------------------------------------------------------------------------------------------- data
def data(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tutorial_lib data")
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download a dataset into data/ (on a login node with internet)")
    f.add_argument("name", nargs="+")
    f.add_argument("--data-dir", default="data")
    s = sub.add_parser("status", help="which datasets are staged")
    s.add_argument("--data-dir", default="data")
    args = p.parse_args(argv)
    from . import data as data_module  # imports torch

    if args.cmd == "fetch":
        for name in args.name:
            print(f"staged {name} in {data_module.fetch(name, args.data_dir)}")
    else:
        for name, ok in data_module.staged(args.data_dir).items():
            print(f"{name:12s} {'staged' if ok else 'missing: python -m tutorial_lib data fetch ' + name}")
    return 0


# ---------------------------------------------------------------------------------------------- jobs
def jobs(argv: list[str]) -> int:
    """`jobs render|submit|status|sites|check`: Slurm job files (tutorial_lib/jobs.py, slurm.py, sites.py)."""
    p = _jobs_parser()
    args, extra = p.parse_known_args(argv)
    if args.cmd == "render":  # key=value overrides may come before, between or after the options
        args.overrides += [x for x in extra if "=" in x and not x.startswith("-")]
        extra = [x for x in extra if x not in args.overrides]
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    return {"render": _jobs_render, "submit": _jobs_submit, "status": _jobs_status, "sites": _jobs_sites,
            "check": _jobs_check}[args.cmd](args)


def _jobs_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tutorial_lib jobs",
                                description="Render, submit and follow the workbook's Slurm jobs.")
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
            r.add_argument(flag, type=int if "int" in str(f.type) else str, default=None, metavar=f.name.upper())
    r.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="a job array over every combination of the values (repeat for more keys)")
    r.add_argument("--point", action="append", default=[], metavar="'K=V K=V'", help="one array task's overrides")
    r.add_argument("--command", help="run this command instead of the training")
    r.add_argument("--jobs-dir", default=None, help="where to write (default: the workbook's jobs/)")
    r.add_argument("--show", action="store_true", help="also print the file")
    _config_args(r)
    s = sub.add_parser("submit", help="sbatch a file from the top of the workbook; --wait follows it to the end")
    s.add_argument("path")
    s.add_argument("--wait", action="store_true", help="wait until the job ends; show its log and result")
    s.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    sub.add_parser("status", help="the state of a job (array: of each task)").add_argument("job_id")
    sub.add_parser("sites", help="the site profiles")
    c = sub.add_parser("check", help="fail if a jobs/*.sbatch file is stale (differs from a fresh render)")
    c.add_argument("--jobs-dir", default=None)
    return p


def _jobs_render(args) -> int:
    values = {f.name: getattr(args, f.name) for f in fields(Resources) if getattr(args, f.name) is not None}
    if args.command and (args.overrides or args.config or args.sweep or args.point):
        raise UserError("--command runs a command of yours: leave out key=value overrides, --config and sweeps")
    sweep = _sweep_from_cli(args.sweep, [shlex.split(point) for point in args.point])
    cfg = None if args.command else load(args.config, args.overrides)
    path = write_job(args.name, cfg, site=args.site, command=args.command, sweep=sweep, description=args.description,
                 jobs_dir=args.jobs_dir, show=args.show, **values)
    print(shown_path(path))
    return 0


def _sweep_from_cli(grid: list[str], points: list[list[str]]) -> dict | list | None:
    """A sweep from the command line: `--sweep KEY=V1,V2` items (every combination) or `--point` word lists."""
    if grid and points:
        raise UserError("give the sweep either as --sweep KEY=V1,V2 (every combination) or as --point, not both")
    if grid:
        sweep = {}
        for item in grid:
            key, sep, vals = item.partition("=")
            if not sep or not vals:
                raise UserError(f"--sweep {item!r} is not KEY=V1,V2 (e.g. --sweep batch_size=64,128)")
            sweep[key.strip()] = [v.strip() for v in vals.split(",")]  # `--sweep 'num_workers=0, 2'`
        return sweep
    out = []
    for words in points:
        point = {}
        for word in words:
            key, sep, value = word.partition("=")
            if not sep:
                raise UserError(f"--point entry {word!r} is not key=value")
            point[key] = value
        out.append(point)
    return out or None


def _jobs_submit(args) -> int:
    job = submit_job(args.path)
    print(f"submitted job {job.id}: {args.path}")
    if not args.wait:
        print(f"follow it: squeue -j {job.id}; python -m tutorial_lib jobs status {job.id}")
        return 0
    state = job.wait(timeout=args.timeout)
    print(f"job {job.id} {state}, exit code {job.exit_code()}; log {job.log_path()} ends with:")
    print(job.log(lines=15))
    if state == "COMPLETED":
        try:
            for i, res in enumerate(job.results()):
                print(f"result {i}: " + result_line(res))
        except UserError as e:
            print(f"(no result: {e})")
    return 0 if state == "COMPLETED" else 1


def _jobs_status(args) -> int:
    for task, state in Job(args.job_id).states().items():
        print(f"{task} {state}")
    return 0


def _jobs_sites(args) -> int:
    for name in site_names():
        print(f"{name:12s} {load_site(name).description}")
    return 0


def _jobs_check(args) -> int:
    bad = stale_jobs(args.jobs_dir)
    for path in bad:
        print(f"stale: {shown_path(path)} (render it again from its notebook, or: "
              f"{render_command(render_record(path))})")
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------- doctor
def doctor(argv: list[str]) -> int:
    """`doctor`: the workshop pre-flight (tutorial_lib/doctor.py)."""
    return doctor_module.cli(argv)


# ---------------------------------------------------------------------------------------------- hang
def hang(argv: list[str]) -> int:
    """`hang OUT_DIR`: the diagnosis of a run that hung or failed in a collective (lessons/hang.py)."""
    p = argparse.ArgumentParser(prog="python -m tutorial_lib hang", description="Which rank stopped and which "
                                "collective the others waited in: the ranks' last words and the flight recorder.")
    p.add_argument("out_dir", help="the run's out_dir (it holds ranks/rank<R>.json)")
    args = p.parse_args(argv)
    from .lessons import hang as hang_module

    print(hang_module.read_report(args.out_dir))
    return 0


def drill(argv: list[str]) -> int:
    """`drill --freeze-rank R --at-step S key=value ...`: one rank of the hang drill (tl.hang.drill starts them)."""
    p = _parser("python -m tutorial_lib drill", "One rank of notebook 05's hang drill: train, rank R frozen "
                "before step S (start it with torchrun; tl.hang.drill does).")
    p.add_argument("--freeze-rank", type=int, default=1)
    p.add_argument("--at-step", type=int, default=3)
    _config_args(p)
    args = p.parse_args(argv)
    cfg = load(args.config, args.overrides)
    from .lessons import hang as hang_module

    hang_module.record_collectives(cfg.out_dir)
    hang_module.rank_main(cfg, args.freeze_rank, args.at_step)
    return 0


# ---------------------------------------------------------------------------------------------- warm
def warm(argv: list[str]) -> int:
    """`warm`: the workbook's compiled configurations into the shared compile cache (lessons/warm.py)."""
    p = _parser("python -m tutorial_lib warm", "Compile the workbook's compiled configurations once, into the compile "
                "cache the learners' runs share; --measure: the first compiled step cold against warm.")
    p.add_argument("--cache", help="the cache folder (default: $WORKBOOK_COMPILE_CACHE, else the site profile's "
                   f"compile_cache, else {compilecache.default_dir()})")
    p.add_argument("--site", help=f"site profile name or YAML file (default: {default_site()})")
    p.add_argument("--only", help="comma-separated configurations to compile (--list names them)")
    p.add_argument("--list", action="store_true", help="the configurations and the folder; compile nothing")
    p.add_argument("--measure", action="store_true", help="the first step cold, warm and warm from a read-only copy "
                   "(--config/key=value, default configs/optimized.yaml), in a fresh cache under --out")
    p.add_argument("--reference", action="store_true", help="with --measure on a GPU: also notebooks/reference/"
                   "04_compile_cache.json")
    p.add_argument("--out", default="runs/compile_cache", help="the runs' folders and logs (%(default)s)")
    p.add_argument("--child", help=argparse.SUPPRESS)  # one configuration's process (warm_module.run_child)
    _config_args(p)
    args = p.parse_args(argv)
    own = args.config is not None or bool(args.overrides)
    cfg = load(args.config, args.overrides) if own or args.child else None  # bad input fails before torch
    if args.reference and not args.measure:
        raise UserError("--reference goes with --measure (the cold and warm first steps are what it records)")
    from .lessons import warm as warm_module  # imports torch

    if args.child:
        warm_module.child(args.child, cfg)
        return 0
    out = make_folder(args.out, f"--out {args.out!r}", "give a folder you can write")
    if args.measure:
        return warm_module.measure_cli(cfg, out, args.reference)
    folder = warm_module.folder_for(args.cache, args.site)
    configs = [("own", warm_module.short(cfg, out, "own"))] if own else warm_module.plan(out)
    configs = warm_module.pick(configs, args.only.split(",") if args.only else None)
    if args.list:
        print(f"compile cache: {folder}\n" + "\n".join(f"  {n}: {' '.join(c.to_overrides())}" for n, c in configs))
        return 0
    import torch

    if not own and not torch.cuda.is_available():
        raise UserError("no CUDA GPU here: the compile caches hold kernels for one GPU type and one torch version; run "
                        "make warm on a node of the hub's GPU type (e.g. srun --gres=gpu:1 make warm), or warm a "
                        "configuration of your own here with --config/key=value")
    warm_module.warm(configs, folder, out)
    compilecache.share(folder)
    return 0


# ---------------------------------------------------------------------------------------------- main
COMMANDS = {"train": train, "bench": bench, "ladder": ladder, "study": study, "card": card, "data": data,
            "jobs": jobs, "doctor": doctor, "hang": hang, "drill": drill, "warm": warm}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd not in COMMANDS:
            raise UserError(f"unknown command {cmd!r}; one of {', '.join(sorted(COMMANDS))}")
        return COMMANDS[cmd](rest)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
