"""The Slurm and JupyterHub checks of the doctor (`tutorial_lib.doctor`): torch-free, so they run on a
login node. Each returns a Check; every command they start has a timeout, and none needs the internet.

    sbatch, sinfo, scontrol, sacctmgr    does the site profile's partition / account / QOS / GPU syntax /
                                         time limit suit this cluster (sbatch --test-only of a rendered job)
    the running Jupyter server           is jupyter-server-proxy importable in *its* Python, and does a
                                         page on 127.0.0.1 (TensorBoard) answer through <base_url>proxy/<port>/
                                         (on JupyterHub: through the hub's address, with the server's token)
    a server spawned by JupyterHub       the hub's prefix, and the limits of the Slurm job it runs in (CPUs,
                                         memory, GPUs, the time left)
"""
from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from functools import cached_property
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from . import jobs, sites
from .config import ROOT, TrainConfig, UserError
from .tensorboard import running
from .values import count


@dataclass
class Check:
    name: str
    status: str  # PASS | WARN | FAIL | SKIP
    message: str
    fix: str = ""
    seconds: float = 0.0  # how long the check took
    detail: str = ""  # what the learner's one line leaves out (a package list): --verbose and --json show it


def run_command(cmd: list[str], timeout: float, cwd: Path | None = None) -> tuple[int | None, str]:
    """(exit code, stdout + stderr) of a command; exit code None when it is missing or ran out of time."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                           stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return None, f"{cmd[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"`{' '.join(cmd[:3])}` did not answer within {timeout:.0f} s"
    return p.returncode, (p.stdout + p.stderr).strip()


def first_words(out: str) -> str:
    """The first line of a command's output that says something: scontrol frames its news in lines of asterisks
    ("Slurmctld(primary) at vm is DOWN", then "*****")."""
    lines = [line.strip(" *") for line in out.splitlines()]
    return next((line[:120] for line in lines if line), "no output")


def shown(path: str | os.PathLike) -> str:
    """A path as the table shows it: relative to the workbook or ~, never a machine path when avoidable."""
    p = Path(os.path.abspath(path))
    for base, label in ((ROOT, ""), (Path.home(), "~/")):
        if p == base or base in p.parents:
            return (label + str(p.relative_to(base))).rstrip("/.") or "."
    return str(p)


class SiteFacts:
    """Cluster facts several checks share, each found once and only when a check asks for it."""

    def __init__(self, opts):
        self.opts = opts  # a doctor.Options

    @cached_property
    def site(self) -> sites.Site:
        return sites.load_site(self.opts.site)

    @cached_property
    def slurm(self) -> str | None:
        """None when Slurm answers here; otherwise why not."""
        missing = [c for c in ("sbatch", "sinfo", "scontrol") if shutil.which(c) is None]
        if missing:
            return f"no Slurm commands here ({', '.join(missing)} missing)"
        code, out = run_command(["scontrol", "ping"], self.opts.timeout)
        if code == 0 and "UP" in out:
            return None
        return f"the Slurm controller does not answer ({first_words(out)})"

    @cached_property
    def partitions(self) -> dict[str, str]:
        """Partition -> its time limit, as sinfo prints them (the default partition's name ends in '*')."""
        code, out = run_command(["sinfo", "-h", "-o", "%P %l"], self.opts.timeout)
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2) if code == 0 else {}

    @cached_property
    def server(self) -> dict | None:
        """The running Jupyter server that serves this kernel (else any running one), with its Python."""
        servers = _servers()
        parent = os.environ.get("JPY_PARENT_PID")
        mine = [s for s in servers if str(s.get("pid")) == parent]
        chosen = (mine or servers or [None])[0]
        if chosen is not None:
            chosen = {**chosen, "python": _python_of(chosen["pid"]), "serves_this_kernel": bool(mine)}
        return chosen

    @cached_property
    def job(self) -> dict[str, str] | None:
        """`scontrol show job` of the Slurm job this process runs in, as a dict; None outside a job or when
        Slurm does not answer."""
        job = os.environ.get("SLURM_JOB_ID")
        if not job or shutil.which("scontrol") is None:
            return None
        code, out = run_command(["scontrol", "show", "job", "-o", job], self.opts.timeout)
        return dict(re.findall(r"(\w+)=(\S*)", out)) if code == 0 else None


def hub_server() -> dict | None:
    """What JupyterHub told the server this kernel runs in (its kernels inherit it), or None outside a hub."""
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if not prefix:
        return None
    return {"user": os.environ.get("JUPYTERHUB_USER", "?"), "prefix": prefix,
            "public_url": os.environ.get("JUPYTERHUB_PUBLIC_URL") or None,
            "token": os.environ.get("JUPYTERHUB_API_TOKEN", "")}


def _servers() -> list[dict]:
    try:
        from jupyter_core.paths import jupyter_runtime_dir  # optional: the lab extra
    except ImportError:
        return []
    found = []
    for f in sorted(Path(jupyter_runtime_dir()).glob("*server-*.json")):  # jpserver-*, nbserver-*
        try:
            info = json.loads(f.read_text())
            os.kill(int(info["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append(info)
    return found


def _python_of(pid: int) -> str | None:
    """The interpreter a process runs: its argv[0] when that is a python path (keeps the venv), else its exe."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        if os.path.isabs(argv0) and "python" in Path(argv0).name and os.path.isfile(argv0):
            return argv0
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None



# ---------------------------------------------------------------------------------------- Slurm
def check_slurm(ctx: SiteFacts) -> Check:
    if ctx.slurm:
        return Check("slurm", "SKIP", f"{ctx.slurm}: jobs can be written here and submitted elsewhere; the "
                     "partition, account, sbatch and time checks are skipped")
    return Check("slurm", "PASS", f"Slurm answers; site profile {ctx.site.name!r}")


def check_partition(ctx: SiteFacts) -> Check:
    if ctx.slurm:
        return Check("partition", "SKIP", "no Slurm")
    names = [p.rstrip("*") for p in ctx.partitions]
    default = next((p.rstrip("*") for p in ctx.partitions if p.endswith("*")), None)
    if ctx.site.partition is None:
        return Check("partition", "PASS" if default else "FAIL", f"the profile uses the cluster's default "
                     f"partition ({default or 'none: this cluster has no default'})",
                     f"set partition in the site profile (one of {', '.join(names)})")
    wrong = [p for p in ctx.site.partition.split(",") if p not in names]
    if wrong:
        return Check("partition", "FAIL", f"partition {wrong[0]!r} of site {ctx.site.name!r} is not on this "
                     f"cluster (it has {', '.join(names) or 'none'})",
                     "set partition in the site profile to one of those (sinfo -s lists them)")
    return Check("partition", "PASS", f"partition {ctx.site.partition} exists")


def check_account(ctx: SiteFacts) -> Check:
    account, qos = ctx.opts.account or ctx.site.account, ctx.site.qos
    if ctx.slurm:
        return Check("account", "SKIP", "no Slurm")
    if ctx.site.account_required and not account:
        return Check("account", "FAIL", f"site {ctx.site.name!r} charges every job to a project, and none is given",
                     "doctor --account <project>; render the jobs with --account <project>")
    if not account and not qos:
        return Check("account", "PASS", "the profile names no account or QOS")
    if shutil.which("sacctmgr") is None:
        return Check("account", "SKIP", "no sacctmgr: sbatch --test-only below checks account and QOS")
    code, out = run_command(["sacctmgr", "-n", "-P", "show", "assoc", f"user={getpass.getuser()}",
                             "format=account,qos"], ctx.opts.timeout)
    if code != 0 or not out:
        return Check("account", "SKIP", "sacctmgr does not answer (no accounting database): sbatch "
                     "--test-only below checks account and QOS")
    rows = [line.split("|") for line in out.splitlines()]
    accounts = {r[0] for r in rows}
    qoses = {q for r in rows if len(r) > 1 for q in r[1].split(",")}
    if account and account not in accounts:
        return Check("account", "FAIL", f"you have no association with account {account!r} (yours: "
                     f"{', '.join(sorted(accounts))})", "use one of yours, or ask the admins to add you")
    if qos and qos not in qoses:
        return Check("account", "FAIL", f"QOS {qos!r} is not yours (yours: {', '.join(sorted(qoses))})",
                     "set qos in the site profile to one of yours")
    return Check("account", "PASS", f"account {account or '-'} and QOS {qos or '-'} are yours")


def check_sbatch(ctx: SiteFacts) -> Check:
    if ctx.slurm:
        return Check("sbatch", "SKIP", "no Slurm")
    extra = {k: v for k, v in (("account", ctx.opts.account), ("reservation", ctx.opts.reservation)) if v}
    try:
        text = jobs.render("doctor_test", TrainConfig(steps=10), site=ctx.opts.site, gpus_per_node=1, **extra)
    except UserError as e:
        return Check("sbatch", "FAIL", f"a one-GPU job does not render: {e}", "fix the site profile")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "doctor_test.sbatch"
        path.write_text(text)
        code, out = run_command(["sbatch", "--test-only", str(path)], ctx.opts.timeout, cwd=ROOT)
    what = "a one-GPU job" + "".join(f", {k} {v}" for k, v in extra.items())
    last = out.splitlines()[-1].replace("sbatch: ", "") if out else "no answer"
    if code != 0:
        return Check("sbatch", "FAIL", f"sbatch --test-only refuses {what} of site {ctx.site.name!r}: {last}",
                     "check the partition, account and GPU syntax of the site profile, and --account / --reservation")
    start = re.sub(r"Job \d+ to start at \S+ ", "", last)  # "Job 12 to start at <date> using 1 processors ..."
    return Check("sbatch", "PASS", f"sbatch --test-only accepts {what}: {start}")


def check_time(ctx: SiteFacts) -> Check:
    if ctx.slurm:
        return Check("time", "SKIP", "no Slurm")
    wanted = ctx.site.partition.split(",")[0] if ctx.site.partition else None
    limit = next((v for p, v in ctx.partitions.items() if p.rstrip("*") == wanted or (wanted is None and
                                                                                       p.endswith("*"))), None)
    if limit is None:
        return Check("time", "SKIP", "the partition is unknown (see the partition line)")
    if limit in ("infinite", "UNLIMITED"):
        return Check("time", "PASS", f"partition limit {limit}; profile max_time {ctx.site.max_time}")
    seconds = sites.time_seconds(limit, "sinfo time limit")
    text = f"partition limit {limit}; profile default_time {ctx.site.default_time}, max_time {ctx.site.max_time}"
    if sites.time_seconds(ctx.site.default_time) > seconds:
        return Check("time", "FAIL", text + ": every default job is refused", f"default_time <= {limit}")
    if sites.time_seconds(ctx.site.max_time) > seconds:
        return Check("time", "WARN", text + ": jobs longer than the limit are refused at submission",
                     f"max_time: {limit} in the site profile")
    return Check("time", "PASS", text)


# ---------------------------------------------------------------------------------------- JupyterHub
def check_proxy(ctx: SiteFacts) -> Check:
    server = ctx.server
    python = ctx.opts.server_python or (server and server["python"]) or sys.executable
    if ctx.opts.server_python:
        which = "the given server Python"
    elif server and server["python"]:
        which = "the Python of the Jupyter server " + ("serving this kernel" if server["serves_this_kernel"]
                                                       else f"pid {server['pid']}")
    else:
        which = "this environment"
    mod = ctx.opts.proxy_module
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({mod!r}) is None)"
    code, _ = run_command([python, "-c", probe], ctx.opts.timeout)
    if code != 0 and which == "this environment":  # no server to ask: the hub's servers may run another Python
        return Check("proxy", "WARN", f"{mod} is not importable in {which} ({shown(python)}), and no running "
                     "Jupyter server was found to ask: a JupyterHub server started from this environment could not "
                     "pass TensorBoard links", "run the check from a notebook on the hub, or pip install "
                     "jupyter-server-proxy into the servers' environment (the hub admins)")
    if code != 0:
        return Check("proxy", "FAIL", f"{mod} is not importable in {which} ({shown(python)}): TensorBoard links "
                     "will not open on JupyterHub", "pip install jupyter-server-proxy into the server's "
                     "environment (the hub admins), or use ssh -L <port>:127.0.0.1:<port>")
    suffix = " (no running Jupyter server found)" if which == "this environment" else ""
    return Check("proxy", "PASS", f"{mod} importable in {which}{suffix}")


def check_tensorboard(ctx: SiteFacts) -> Check:
    server, hub = ctx.server, hub_server()
    if server is None:
        return Check("tensorboard", "SKIP", "no running Jupyter server: the link through its proxy is checked "
                     "while one runs (notebook 00 opened in JupyterLab or on the hub, or beside `make lab`)")
    boards = running()
    with _Target(boards[0].port if boards else None) as port:
        shown = f"{server.get('base_url', '/')}proxy/{port}/"
        if hub:  # the way the learner's browser goes: the hub's address (its proxy), with this server's token
            base, token = hub["public_url"] or server["url"], hub["token"]
            how = "through the hub" if hub["public_url"] else "through this server (the hub gives no public URL)"
        else:
            base, token, how = server["url"], server.get("token", ""), "through the Jupyter server"
        url = f"{base.rstrip('/')}/proxy/{port}/"
        what = "TensorBoard" if boards else "a test page (no TensorBoard runs)"
        request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.build_opener(_NoRedirect).open(request, timeout=min(ctx.opts.timeout, 10)) as r:
                return Check("tensorboard", "PASS", f"{what} on port {port} answers at {shown}, {how} ({r.status})")
        except urllib.error.HTTPError as e:
            code, answer = e.code, f"{e.code} {e.reason}"
            if code in (301, 302, 303, 307, 308) and _same_path(e.headers.get("Location", ""), url):
                # Jupyter sends an unknown `.../` to the same path without the slash, which is no page either
                code, answer = 404, f"{e.code}, to the same address without its last slash: no such page"
            elif code in (301, 302, 303, 307, 308, 401, 403):
                return Check("tensorboard", "WARN", f"{shown} sends this check to the login page ({code}): the "
                             f"link works once you are logged in", "open the link tl.tensorboard.start shows")
            return Check("tensorboard", "FAIL", f"{shown} answers {answer} for {what}, {how}"
                         + (": this server has no jupyter-server-proxy" if code == 404 else ""),
                         "the hub's admins: install and enable jupyter-server-proxy in the servers' environment; "
                         f"meanwhile ssh -L {port}:127.0.0.1:{port} to this node and open http://127.0.0.1:{port}/")
        except OSError as e:
            return Check("tensorboard", "FAIL", f"{shown} does not answer {how} ({e})", "is the Jupyter server up?")


def _same_path(location: str, url: str) -> bool:
    return urllib.parse.urlparse(location).path.rstrip("/") == urllib.parse.urlparse(url).path.rstrip("/")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect (to a login page) is the answer to report, not a page to follow


def check_hub(ctx: SiteFacts) -> Check:
    """Inside a server that JupyterHub spawned: the hub's prefix, and the limits of the Slurm job it runs in."""
    hub, job = hub_server(), os.environ.get("SLURM_JOB_ID")
    if hub is None:
        return Check("hub", "SKIP", "not in a server spawned by JupyterHub" + (f" (in Slurm job {job})" if job else "")
                     + ": on a hub this line shows the server's prefix and its job's limits")
    home = Path.home()
    package = f"~/{ROOT.relative_to(home)}" if home in ROOT.parents else str(ROOT)
    where = f"the JupyterHub server of {hub['user']} at {hub['prefix']} (the workbook's package from {package})"
    if not job:
        return Check("hub", "PASS", f"{where}; not a Slurm job: the hub's own limits apply")
    facts = ctx.job
    if not facts:
        return Check("hub", "WARN", f"{where}, in Slurm job {job}, which scontrol does not describe",
                     "check that Slurm's commands work on this node (scontrol show job $SLURM_JOB_ID)")
    text = f"{where}, Slurm job {job} on {facts.get('NodeList', '?')}: {_job_limits(facts)}"
    try:
        left = time.mktime(time.strptime(facts["EndTime"], "%Y-%m-%dT%H:%M:%S")) - time.time()
    except (KeyError, ValueError):  # Unknown: no time limit
        return Check("hub", "PASS", text)
    text += f"; it ends at {facts['EndTime'].replace('T', ' ')} ({_duration(left)} from now)"
    if left < SERVER_MINUTES_LEFT * 60:
        return Check("hub", "WARN", text, "save your notebooks now; then stop this server (File > Hub Control Panel) "
                     "and start a new one for a full time limit")
    return Check("hub", "PASS", text)


def _job_limits(facts: dict[str, str]) -> str:
    """CPUs, memory, GPUs and time limit of a job from `scontrol show job` (the allocated TRES where Slurm
    tracks them, else what the job asked for: memory per node or per CPU, GPUs per node or per job)."""
    tres = dict(kv.split("=", 1) for kv in facts.get("TRES", "").split(",") if "=" in kv)
    cpus = tres.get("cpu", facts.get("NumCPUs", "?"))
    memory = tres.get("mem") or facts.get("MinMemoryNode") or (
        f"{facts['MinMemoryCPU']} per CPU" if facts.get("MinMemoryCPU") else "?")
    asked = " ".join(facts.get(k, "") for k in ("TresPerNode", "TresPerJob", "Gres"))
    gpus = tres.get("gres/gpu") or next(iter(re.findall(r"gpu(?::[\w-]+)?[:=](\d+)", asked)), "0")
    return f"{cpus} CPUs, {memory} memory, {count(gpus, 'GPU')}, time limit {facts.get('TimeLimit', '?')}"


SERVER_MINUTES_LEFT = 30  # fewer minutes left in the server's job: a warning (a lesson does not fit)


def _duration(seconds: float) -> str:
    minutes = max(0, int(seconds // 60))
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


class _Target:
    """The port to reach through the proxy: a running TensorBoard's, else a throwaway page on 127.0.0.1."""

    def __init__(self, port: int | None):
        self.port, self.httpd = port, None

    def __enter__(self) -> int:
        if self.port is None:
            class Page(BaseHTTPRequestHandler):
                def do_GET(self):
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"workbook doctor")

                def log_message(self, *args):
                    pass
            self.httpd = HTTPServer(("127.0.0.1", 0), Page)
            threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
            self.port = self.httpd.server_address[1]
        return self.port

    def __exit__(self, *exc) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


SITE_CHECKS = (check_slurm, check_partition, check_account, check_sbatch, check_time, check_proxy,
               check_tensorboard, check_hub)
