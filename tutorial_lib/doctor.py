"""Pre-flight check of a workshop machine: one line per check, PASS / WARN / FAIL / SKIP, each with its fix.

    python -m tutorial_lib doctor                      # the table; exit code 1 when any check FAILs
    python -m tutorial_lib doctor --json               # one JSON object, to collect from many nodes
    python -m tutorial_lib doctor --site mysite --account proj --reservation workshop --need cifar10
    tl.doctor.run()                                    # the same table from a notebook cell (notebook 00)

Every check is bounded in time (each external command has a timeout; the torch facts come from a
subprocess) and none needs the internet. Without a GPU or Slurm the checks that need them say SKIP and
what they would have checked. What a check compares against can be given (Options): the site profile,
the datasets the workshop needs, the /dev/shm path and its minimum, the disk minimums, the proxy module and
the Python of the Jupyter server, so a test can inject a fault without patching anything.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from . import compilecache, numa, sites
from .config import ROOT, UserError, default_workers, usable_cpus
from .gpucheck import (GpuFacts, allreduce, check_bf16, check_driver, check_gpus, check_nccl,  # noqa: F401
                       save)  # doctor.check_gpus, doctor.allreduce, ...: the GPU lines live in gpucheck.py
from .sitecheck import SITE_CHECKS, Check, SiteFacts, shown as _shown
from .sitecheck import run_command as _run
from .values import count, is_whole

STATUSES = ("PASS", "WARN", "FAIL", "SKIP")
LOCK = ROOT / "requirements.lock"
MARKS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "mnist": "MNIST/raw",
         "imagefolder": "imagefolder/manifest.json"}  # what tutorial_lib.data.staged looks for


@dataclass
class Options:
    """What the checks compare against; every default is what a workshop machine should offer."""
    site: str | None = None  # a site profile name or YAML path; None: sites.default_site()
    account: str | None = None  # the workshop's project account (else the site profile's)
    reservation: str | None = None  # the workshop's Slurm reservation
    data_dir: str = "data"  # where datasets are staged (TrainConfig.data_dir)
    need: tuple[str, ...] = ()  # datasets the workshop needs staged (the notebooks need none: shapes)
    shm_path: str = "/dev/shm"
    shm_min_mib: int = 512  # below this DataLoader workers die with "Bus error" (Docker gives 64 MiB)
    min_free_gib: float = 5.0  # where runs/ and data/ are written
    min_free_inodes: int = 100_000  # the imagefolder set alone is 60,000 files
    kernel: str = "hpc-workbook"  # the kernel `make kernel` registers
    proxy_module: str = "jupyter_server_proxy"
    server_python: str | None = None  # the Python of the Jupyter server; None: found from the running server
    timeout: float = 30.0  # seconds for each external command


@dataclass
class Report:
    checks: list[Check]
    host: str = field(default_factory=socket.gethostname)
    torch: dict = field(default_factory=dict)  # what the torch probe found (version, GPUs), when it ran
    collect_env: dict | None = None  # torch's own environment report (--json only: collect_env below)

    @property
    def ok(self) -> bool:
        return not any(c.status == "FAIL" for c in self.checks)

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def table(self, verbose: bool = False) -> str:
        """One line per check, its fix on the same line; verbose: the fix below it and each check's detail."""
        width = max(len(c.name) for c in self.checks)
        lines = []
        for c in self.checks:
            fix = c.fix if c.fix and c.status != "PASS" else ""
            said = f"; fix: {fix}" if fix and not verbose else ""
            lines.append(f"{c.status}  {c.name:<{width}}  {c.message}{said}")
            pad = f"{'':4}  {'':<{width}}  "
            lines += [pad + x for x in c.detail.splitlines()] if verbose else []
            lines += [f"{pad}fix: {fix}"] if fix and verbose else []
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items() if n)
        lines.append(f"{counts}: {'ready' if self.ok else 'NOT ready (fix the FAIL lines)'}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "ok": self.ok, "counts": self.counts(),
                           "checks": [asdict(c) for c in self.checks],
                           **({"collect_env": self.collect_env} if self.collect_env is not None else {})}, indent=1)


COLLECT_ENV = ("import json; from torch.utils import collect_env as c; info = c.get_env_info(); "
               "print(json.dumps({'fields': info._asdict(), 'text': c.pretty_str(info)}))")


def collect_env(timeout: float) -> dict:
    """torch's environment report (torch.utils.collect_env, what PyTorch's bug reports ask for): its fields and
    its text, or {'error': why}. In a subprocess, and only for --json: it takes seconds (4-5 s on a busy 2-core CPU),
    so the table never waits for it."""
    try:
        p = subprocess.run([sys.executable, "-c", COLLECT_ENV], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": f"torch.utils.collect_env did not finish within {timeout:.0f} s"}
    try:
        return json.loads(p.stdout.splitlines()[-1])
    except (IndexError, ValueError):
        said = (p.stderr.strip().splitlines() or ["it printed nothing"])[-1]
        return {"error": f"torch.utils.collect_env failed (exit {p.returncode}): {said}"}


# ---------------------------------------------------------------------------------------- helpers
def _existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


class Context(GpuFacts, SiteFacts):
    """Facts several checks share (the GPUs' from GpuFacts, the cluster's from SiteFacts), each found once when
    asked for."""


# ---------------------------------------------------------------------------------------- environment
def check_python(ctx: Context) -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    made = re.search(r"Python (\d+\.\d+)", LOCK.read_text()) if LOCK.is_file() else None
    note = f" (the lock was made with {made.group(1)})" if made else ""
    if sys.version_info < (3, 10):
        return Check("python", "FAIL", f"Python {version} is older than 3.10", "make PYTHON=python3.11 venv")
    env = _shown(sys.prefix)  # the workbook's own '.venv', or where another one lives (not just its name: '.venv')
    return Check("python", "PASS", f"Python {version} in the environment {env}{note}")


def check_packages(ctx: Context) -> Check:
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
    have = {norm(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    pinned = dict(line.split("==", 1) for line in LOCK.read_text().splitlines() if "==" in line)
    core = {"torch", "torchvision", "tensorboard", "numpy", "pyyaml", "jinja2", "matplotlib", "pillow", "tqdm"}
    missing = [n for n in pinned if norm(n) not in have]
    differ = [f"{n} {have[norm(n)]} (lock {v})" for n, v in pinned.items() if norm(n) in have and have[norm(n)] != v]
    if [n for n in missing if norm(n) in core]:
        return Check("packages", "FAIL", f"missing: {', '.join(n for n in missing if norm(n) in core)}",
                     "make venv (installs requirements.lock), or pip install -r requirements.lock")
    if missing or differ:
        detail = "\n".join((["missing: " + ", ".join(missing)] if missing else []) + [f"differs: {d}" for d in differ])
        return Check("packages", "WARN", f"{len(missing)} missing, {len(differ)} differ from requirements.lock "
                     "(doctor --verbose lists them)", "make venv for the tested versions (a site's own torch >= 2.4 "
                     "also works)", detail=detail)
    return Check("packages", "PASS", f"all {len(pinned)} packages match requirements.lock")


def check_kernel(ctx: Context) -> Check:
    name, fix = ctx.opts.kernel, "make kernel (registers this environment as the kernel)"
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel  # optional: the lab extra
    except ImportError:
        return Check("kernel", "WARN", "jupyter_client is not installed: no kernel here", fix)
    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return Check("kernel", "WARN", f"no kernel {name!r} registered: learners would pick another Python", fix)
    code, prefix = _run([spec.argv[0], "-c", "import sys; print(sys.prefix)"], ctx.opts.timeout)
    if code != 0:
        return Check("kernel", "FAIL", f"kernel {name!r} runs {_shown(spec.argv[0])}, which does not start", fix)
    if os.path.realpath(prefix.splitlines()[-1]) != os.path.realpath(sys.prefix):
        return Check("kernel", "FAIL", f"kernel {name!r} runs the Python of {_shown(prefix.splitlines()[-1])}, "
                     f"not this environment ({_shown(sys.prefix)})", fix)
    return Check("kernel", "PASS", f"kernel {name!r} ({spec.display_name}) runs this environment's Python")


# ---------------------------------------------------------------------------------------- CPUs, memory, disks
def check_cpus(ctx: Context) -> Check:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    usable, workers = usable_cpus(), default_workers()  # the workbook's DataLoader worker rule, from its one home
    text = (f"{usable} usable CPUs (affinity {affinity} of {os.cpu_count()} on the node, SLURM_CPUS_PER_TASK "
            f"{slurm or 'unset'}): the worker rule gives {count(workers, 'DataLoader worker')}")
    if slurm and not is_whole(slurm):  # Slurm sets a number; this one was set by hand (and is ignored)
        return Check("cpus", "WARN", f"{text}, but SLURM_CPUS_PER_TASK={slurm!r} is not a number (the workbook "
                     "ignores it)", "unset SLURM_CPUS_PER_TASK, or set it to the CPUs Slurm granted (a number)")
    if slurm and int(slurm) > affinity:
        return Check("cpus", "WARN", text + f", but this process may run on only {affinity}",
                     "srun --cpus-per-task or the hub's CPU limit: give the process the CPUs Slurm granted")
    want = ctx.site.cpus_per_gpu
    if usable < want:
        return Check("cpus", "WARN", text + f"; site {ctx.site.name!r} gives a job {want} per GPU",
                     f"a JupyterHub server or job with >= {want} CPUs shows the DataLoader lessons' effect")
    return Check("cpus", "PASS", text)


def check_shm(ctx: Context) -> Check:
    path, need = ctx.opts.shm_path, ctx.opts.shm_min_mib
    if not os.path.isdir(path):
        return Check("shm", "WARN", f"no {path}: DataLoader workers share batches through files instead",
                     "num_workers=0 if workers fail")
    st = os.statvfs(path)
    size, free = st.f_blocks * st.f_frsize / 2**20, st.f_bavail * st.f_frsize / 2**20
    text = f"{path}: {size:,.0f} MiB, {free:,.0f} MiB free (DataLoader workers need >= {need:,} MiB)"
    if size < need:
        return Check("shm", "FAIL", text, "give the container more shared memory (docker --shm-size=8g, "
                     "the hub's shm limit), or num_workers=0")
    if free < need:
        return Check("shm", "WARN", text, f"free {path}: stale files of crashed runs (ls -la {path})")
    return Check("shm", "PASS", text)


def check_disk(ctx: Context) -> Check:
    parts, status, fixes = [], "PASS", []
    for label, path in (("runs", ROOT / "runs"), ("data", Path(ctx.opts.data_dir))):
        here = _existing(Path(os.path.abspath(path)))
        st = os.statvfs(here)
        if not st.f_blocks:  # /proc, /sys: no storage behind it, so "0.0 GiB free" says nothing true
            status = "FAIL"
            parts.append(f"{_shown(path)}: not on a disk ({_shown(here)} is a virtual file system)")
            fixes.append(f"put {label} on a real file system")
            continue
        gib, inodes = st.f_bavail * st.f_frsize / 2**30, st.f_favail
        inode_text = f"{inodes:,} inodes" if st.f_files else "no inode limit"
        parts.append(f"{_shown(path)}: {gib:,.1f} GiB, {inode_text} free")
        if label == "runs" and not os.access(here, os.W_OK):
            status, fixes = "FAIL", fixes + [f"{_shown(here)} is not writable: clone the workbook where you can write"]
        if gib < ctx.opts.min_free_gib or (st.f_files and inodes < ctx.opts.min_free_inodes):
            status = "FAIL"
            fixes.append(f"free space at {_shown(path)} (needs {ctx.opts.min_free_gib:g} GiB and "
                         f"{ctx.opts.min_free_inodes:,} inodes), or put it on another file system")
    return Check("disk", status, "; ".join(parts), "; ".join(fixes))


def check_datasets(ctx: Context) -> Check:
    from .data import staged  # data imports torch, which the doctor only probes in a subprocess

    folder = Path(ctx.opts.data_dir)
    found = staged(str(folder))
    unreadable = [n for n, ok in found.items() if ok and not _readable(folder / MARKS[n])]
    have = [n for n, ok in found.items() if ok and n not in unreadable]
    where = f"{_shown(folder)}" + (" (a link to a shared folder)" if folder.is_symlink() else "")
    unusable = _unusable_data_dir(folder)
    if unusable:
        return Check("datasets", "FAIL", f"{where} {unusable}: no dataset can be staged there",
                     "--data-dir (data_dir=) a folder on a disk you can write, or the shared copy's folder")
    mode = ("read-only" if not os.access(folder, os.W_OK) else "writable") if folder.is_dir() else "not made yet"
    text = (f"{where} ({mode}): {', '.join(have) or 'none'} staged, shapes generated in memory; for a shared "
            "copy (site profiles name none) point data_dir, or a data -> link, at it")
    missing = [n for n in ctx.opts.need if n != "shapes" and not found.get(n)]
    if unreadable or missing:
        bad = [f"{n} unreadable" for n in unreadable] + [f"{n} missing" for n in missing]
        return Check("datasets", "FAIL", f"{', '.join(bad)}: {text}",
                     "on a login node with internet: make data (or python -m tutorial_lib data fetch "
                     + " ".join(missing or unreadable) + f" --data-dir {_shown(folder)})")
    return Check("datasets", "PASS", text)


def _unusable_data_dir(folder: Path) -> str | None:
    """Why `folder` can't hold datasets (a file; a folder that can't be created; no disk behind it), or None."""
    if folder.exists() and not folder.is_dir():
        return "is a file, not a folder"
    here = _existing(Path(os.path.abspath(folder)))
    if not here.is_dir():
        return f"can't be created ({_shown(here)} is a file)"
    if not os.statvfs(here).f_blocks:
        return f"is not on a disk ({_shown(here)} is a virtual file system)"
    if not folder.exists() and not os.access(here, os.W_OK):
        return f"can't be created ({_shown(here)} is not writable)"
    return None


def _readable(path: Path) -> bool:
    """A staged dataset can be read: its marker file, or the first file of its folder, opens."""
    try:
        first = path if path.is_file() else next((p for p in path.iterdir() if p.is_file()), None)
        if first is None:
            return False
        with open(first, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------- the compile cache
def check_compile_cache(ctx: Context) -> Check:
    """The shared compile cache (compilecache.py): where, for which torch and GPU it was warmed, its size; a warning
    on a GPU node where it is missing or holds nothing for this torch and GPU (every compiled run compiles anew)."""
    folder, source = compilecache.where(ctx.site.compile_cache, ctx.site.name)
    gpus = sorted({name for name, _ in ctx.torch.get("gpus") or []})
    fix = "the first compiled cells take minutes: ask your instructor, who warms it with make warm"
    if folder is None or not folder.is_dir():
        said = f"{_shown(folder)} ({source}) does not exist" if folder else f"no compile cache: {source}"
        if not gpus:
            return Check("compile_cache", "SKIP", f"{said}; no GPU here, where compiling is what a cache saves")
        return Check("compile_cache", "WARN", f"{said}: every compiled run on {gpus[0]} compiles from scratch", fix)
    try:
        entries = list(compilecache.read_manifest(folder)["entries"].values())
    except UserError as e:
        return Check("compile_cache", "WARN", str(e), fix)
    size = compilecache.size_bytes(folder) / 2**20
    warmed = "; ".join(f"torch {e.get('torch')} on {e.get('device')}: {count(len(e.get('configs') or {}), 'configuration')} "
                       f"warmed {str(e.get('updated', '?'))[:10]}" for e in entries) or "nothing warmed (no manifest)"
    text = f"{_shown(folder)} ({source}, {size:,.1f} MiB): {warmed}"
    here = ctx.torch.get("torch")
    if gpus and not any(e.get("torch") == here and e.get("device") in gpus for e in entries):
        return Check("compile_cache", "WARN", f"{text}; nothing for torch {here} on {gpus[0]} (the caches hold code "
                     "for one torch version and one GPU type)", fix)
    return Check("compile_cache", "PASS", text)


# ---------------------------------------------------------------------------------------- running them
CHECKS = (check_python, check_packages, check_kernel, check_gpus, check_driver, check_bf16, check_nccl,
          check_cpus, numa.check_numa, check_compile_cache, check_shm, check_disk, check_datasets, *SITE_CHECKS)


def check_options(opts: Options) -> None:
    """Limits that mean something: a timeout of 0 s made every command 'time out', blaming the kernel and the proxy."""
    for name, low, strict in (("timeout", 0, True), ("shm_min_mib", 0, False), ("min_free_gib", 0, False),
                              ("min_free_inodes", 0, False)):
        value = getattr(opts, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and (value > low if strict else value >= low)):
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag}={value} must be a number {'>' if strict else '>='} {low} (default "
                            f"{getattr(Options(), name)})")


def run(options: Options | None = None, show: bool = True, verbose: bool = False, **values) -> Report:
    """Every check; prints the table, one line per check (verbose: with each check's detail; show=False: nothing).
    Options fields may be given as keywords."""
    opts = options or Options(**values)
    check_options(opts)
    ctx = Context(opts)
    ctx.site  # a bad --site is the user's error, not a failed check  # noqa: B018
    checks = []
    for check in CHECKS:
        t0 = time.perf_counter()
        try:
            result = check(ctx)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            result = Check(check.__name__.removeprefix("check_"), "FAIL", f"the check itself failed: "
                           f"{type(e).__name__}: {e}", "report it with python -m tutorial_lib doctor --json")
        result.seconds = round(time.perf_counter() - t0, 2)
        checks.append(result)
    report = Report(checks, torch=ctx.torch)
    if show:
        print(report.table(verbose))
    return report


def cli(argv: list[str]) -> int:
    """`python -m tutorial_lib doctor [--json] [--site NAME] ...`: 0 when nothing FAILs, else 1."""
    d = Options()
    p = argparse.ArgumentParser(prog="python -m tutorial_lib doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="one JSON object with every check (for a site admin)")
    p.add_argument("--verbose", action="store_true", help="each check's detail below its line (the package list)")
    p.add_argument("--site", help=f"site profile name or YAML file (default: {sites.default_site()})")
    p.add_argument("--account", help="the workshop's project account (default: the site profile's)")
    p.add_argument("--reservation", help="the workshop's Slurm reservation, checked with sbatch --test-only")
    p.add_argument("--data-dir", default=d.data_dir, help="where datasets are staged (default: %(default)s)")
    p.add_argument("--need", action="append", default=[], choices=sorted(MARKS),
                   help="a dataset the workshop needs staged (repeat)")
    p.add_argument("--shm-path", default=d.shm_path, help="shared memory of DataLoader workers (%(default)s)")
    p.add_argument("--shm-min-mib", type=int, default=d.shm_min_mib, help="its minimum size (%(default)s MiB)")
    p.add_argument("--min-free-gib", type=float, default=d.min_free_gib, help="free space (%(default)s GiB)")
    p.add_argument("--min-free-inodes", type=int, default=d.min_free_inodes, help="free inodes (%(default)s)")
    p.add_argument("--kernel", default=d.kernel, help="the notebook kernel's name (%(default)s)")
    p.add_argument("--proxy-module", default=d.proxy_module, help="the proxy's module (%(default)s)")
    p.add_argument("--server-python", help="the Python of the Jupyter server (default: found from the server)")
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds per command (%(default)s)")
    p.add_argument("--out", help="also write DIR/doctor.json, DIR/doctor.txt and the GPU checks as the reference "
                   "record DIR/reference/doctor.json (the GPU node's run, scripts/gpu/doctor.sh)")
    p.add_argument("--reference", action="store_true", help="with --out: also notebooks/reference/doctor.json")
    args = vars(p.parse_args(argv))
    as_json, out, write_reference = args.pop("json"), args.pop("out"), args.pop("reference")
    verbose = args.pop("verbose")
    if write_reference and not out:
        raise UserError("--reference goes with --out DIR (where the report is written too)")
    args["need"] = tuple(args["need"])
    report = run(Options(**args), show=not as_json, verbose=verbose)
    if as_json:
        report.collect_env = collect_env(max(args["timeout"], 120))
        print(report.to_json())
    if out:
        print("wrote " + ", ".join(str(p) for p in save(report, Path(out), write_reference)), file=sys.stderr)
    return 0 if report.ok else 1
