"""Start and stop TensorBoard from a notebook cell.

It listens on 127.0.0.1 only (never --bind_all: on a shared login or compute node anyone could read your
runs). The browser reaches it through jupyter-server-proxy, `<base_url>proxy/<port>/`, whenever the Jupyter
serving the notebook has it: on JupyterHub, and under `make lab` (also when reached through `ssh -L`, which
forwards Jupyter's port only). That address is the link and what the inline view loads.
"""
from __future__ import annotations

import errno
import html
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from .config import UserError
from .results import atomic_write_text, disk_problem, existing, make_folder

STATE = Path(os.environ.get("WORKBOOK_STATE_DIR", Path.home() / ".cache" / "tutorial_lib")) / "tensorboard.json"


@dataclass
class TensorBoard:
    pid: int
    port: int
    logdir: str

    @property
    def local_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def url(self) -> str:
        """The address to open in the browser: through Jupyter's proxy when it has one."""
        prefix = proxy_prefix()
        return f"{prefix}{self.port}/" if prefix else self.local_url

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
            with urllib.request.urlopen(self.local_url + "data/logdir", timeout=2) as r:
                return Path(json.load(r)["logdir"]).resolve() == Path(self.logdir).resolve()
        except (OSError, ValueError, KeyError):
            return False

    def is_ours(self) -> bool:
        """Whether `pid` is still the TensorBoard this record describes, not a process that reused the PID (the
        state file lives in $HOME, shared by every node): its command line names tensorboard, this logdir and
        port; where there is no /proc (macOS), its port answers with this logdir."""
        cmdline = Path(f"/proc/{self.pid}/cmdline")
        if not Path("/proc/self/cmdline").exists():
            return self.alive()
        try:
            words = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return False
        return (any("tensorboard" in w for w in words) and _after(words, "--logdir") == self.logdir
                and _after(words, "--port") == str(self.port))

    @property
    def shown_logdir(self) -> str:
        """The logdir relative to the working directory when it lies below it (no machine paths in outputs)."""
        rel = os.path.relpath(self.logdir)
        return self.logdir if rel.startswith("..") else rel

    def _repr_html_(self) -> str:
        if _hub_without_proxy():
            return f'<p style="color:#b00000"><b>{html.escape(self.no_proxy_message())}</b></p>'
        return (f'<p>TensorBoard (pid {self.pid}) for <code>{self.shown_logdir}</code>: '
                f'<a href="{self.url}" target="_blank">{self.url}</a></p>'
                f'<iframe src="{self.url}" width="100%" height="600" frameborder="0"></iframe>')

    def __repr__(self) -> str:
        if _hub_without_proxy():
            return self.no_proxy_message()
        return f"TensorBoard for {self.shown_logdir} at {self.url} (pid {self.pid})"

    def no_proxy_message(self) -> str:
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        return (f"TensorBoard runs (pid {self.pid}, port {self.port} on {node}), but this JupyterHub server has no "
                "jupyter-server-proxy, so your browser cannot reach it through the hub. What to do: ask the hub's "
                "admins to install jupyter-server-proxy in the servers' environment; meanwhile, from your computer, "
                f"ssh -L {self.port}:127.0.0.1:{self.port} {node} (through the login node: -J <login node>) and open "
                f"http://127.0.0.1:{self.port}/")


def proxy_prefix() -> str | None:
    """The path under which the browser reaches this machine's ports, `<base_url>proxy/`, or None.

    On JupyterHub the hub says it (JUPYTERHUB_SERVICE_PREFIX). In a kernel of a local Jupyter server
    (`make lab`) that server is the kernel's parent (JPY_PARENT_PID): its runtime file gives its address and
    base_url, and it has jupyter-server-proxy if it answers on `proxy/`. Headless kernels (nbclient, nbval)
    have no server, so their links stay at 127.0.0.1.
    """
    hub = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if hub:
        return hub.rstrip("/") + "/proxy/"
    server = _parent_jupyter_server()
    if server and _serves_proxy(server["url"]):
        return server["base_url"].rstrip("/") + "/proxy/"
    return None


def _hub_without_proxy() -> bool:
    """On JupyterHub, the server this kernel runs in lacks jupyter-server-proxy's route (links would answer 404)."""
    if not os.environ.get("JUPYTERHUB_SERVICE_PREFIX"):
        return False
    server = _parent_jupyter_server()
    return server is not None and not _serves_proxy(server["url"])


def _parent_jupyter_server() -> dict | None:
    """The runtime record (url, base_url, ...) of the Jupyter server that started this kernel, if any."""
    pid = os.environ.get("JPY_PARENT_PID")
    if not pid:
        return None
    try:
        from jupyter_core.paths import jupyter_runtime_dir  # optional: the lab extra

        server = json.loads((Path(jupyter_runtime_dir()) / f"jpserver-{pid}.json").read_text())
    except (ImportError, OSError, ValueError):
        return None
    # a server on a Unix socket has no URL this kernel could ask
    return server if {"url", "base_url"} <= server.keys() and not server.get("sock") else None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect (to the login page) is an answer: the route exists


@lru_cache
def _serves_proxy(server_url: str) -> bool:
    """Whether the Jupyter server at `server_url` has jupyter-server-proxy's `proxy/<port>/` route.

    Without it the route is an unknown page (404); with it, an unauthenticated request is sent to the login
    page (302) before anything is proxied, so no token is needed to ask. (Without the trailing slash: Jupyter
    answers any unknown `.../` with a redirect to the same path without it.)
    """
    try:
        urllib.request.build_opener(_NoRedirect).open(server_url.rstrip("/") + "/proxy/1", timeout=5).close()
        return True
    except urllib.error.HTTPError as e:
        return e.code != 404
    except OSError:
        return False


def _after(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words[:-1] else None


def _check_port_free(port: int) -> None:
    """A port given to start() must be free: a TensorBoard started on a port in use fails, while whatever holds
    the port keeps answering (another TensorBoard of the same logdir answers as this one would)."""
    if not (isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536):
        raise UserError(f"port={port!r} is not a port number (1-65535); leave port out for a free one")
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise UserError(f"port {port} is in use on 127.0.0.1 (by another TensorBoard or another program); leave "
                            "port out for a free one, or tl.tensorboard.running() lists the workbook's") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records() -> list[TensorBoard]:
    try:
        return [TensorBoard(**r) for r in json.loads(STATE.read_text())]
    except (OSError, ValueError, TypeError):
        return []


def _save(records: list[TensorBoard]) -> None:
    fix = "set WORKBOOK_STATE_DIR to a folder you can write"
    make_folder(STATE.parent, f"the workbook's state folder {str(STATE.parent)!r}", fix)
    try:
        atomic_write_text(STATE, json.dumps([asdict(r) for r in records]))
    except UserError as e:
        raise UserError(f"{e} ({fix})") from None


def running() -> list[TensorBoard]:
    """Live TensorBoards started by this workbook (stale records of dead ones are dropped)."""
    live = [r for r in _records() if r.alive()]
    _save(live)
    return live


def start(logdir: str | os.PathLike = "runs", port: int | None = None, timeout: float = 60) -> TensorBoard:
    """Start TensorBoard on `logdir` (or reuse the live one already serving it) and return its handle.

    Displayed as the last expression of a cell, the handle shows the link and the TensorBoard page inline.
    (Notebook 00 teaches it.)
    """
    logdir = str(Path(logdir).resolve())
    for tb in running():
        if tb.logdir == logdir:
            return tb
    if port is not None:
        _check_port_free(port)
    log = _open_log(Path(logdir))
    port = port or _free_port()
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
           "--port", str(port), "--reload_interval", "5"]
    with log:  # the child keeps its own copy of the file
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    tb = TensorBoard(proc.pid, port, logdir)
    deadline = time.time() + timeout
    while proc.poll() is not None or not tb.alive():  # alive: the port answers for logdir, maybe not this one
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            full = disk_problem(Path(logdir))
            if full:  # TensorBoard could not even write its log
                raise UserError(f"TensorBoard did not start on port {port}: {full}; free space there")
            tail = (Path(logdir) / ".tensorboard.log").read_text()[-600:]
            raise UserError(f"TensorBoard did not start on port {port} (exit code {proc.poll()}); "
                            f"its log ends with:\n{tail}")
        time.sleep(0.5)
    _save([*_records(), tb])
    _CHILDREN[proc.pid] = proc  # this kernel's children: reaped by stop(), never collected while running
    return tb


_CHILDREN: dict = {}  # pid -> Popen of the TensorBoards this process started


def event_writer(folder: Path, purge_step: int | None = None):
    """A run's TensorBoard SummaryWriter into `folder` (the engine's; purge_step: a resumed run's first step), or a
    one-line error when the folder can't take its event file: checked first, since on a full disk the writer's
    own thread fails with a traceback while the run goes on."""
    try:
        full = disk_problem(existing(folder))
        if full:
            raise OSError(errno.ENOSPC, full)
        from torch.utils.tensorboard import SummaryWriter  # imports torch: starting TensorBoard needs none

        return SummaryWriter(str(folder), purge_step=purge_step)
    except OSError as e:
        why = disk_problem(existing(folder), e) or e.strerror or str(e)
        raise UserError(f"TensorBoard can't write its event file into {folder} ({why}); free space, or give "
                        "tensorboard=false") from None


def _open_log(logdir: Path):
    """Make `logdir` and open a new <logdir>/.tensorboard.log for TensorBoard's output: the old one is removed
    first and the new one created afresh (O_EXCL, O_NOFOLLOW), so a link planted under that name in a shared
    runs folder is replaced, never written through. A folder that can't be used is a one-line error."""
    path = logdir / ".tensorboard.log"
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        return os.fdopen(os.open(path, flags, 0o644), "w")
    except OSError as e:
        why = disk_problem(existing(logdir), e) or e.strerror or str(e)
        raise UserError(f"TensorBoard can't use logdir={str(logdir)!r} ({why}); give a folder you can write, e.g. "
                        "tl.tensorboard.start('runs')") from None


def stop(tb: TensorBoard | None = None) -> int:
    """Stop `tb`, or every TensorBoard this workbook started. Returns how many were stopped. A record whose
    PID is no longer that TensorBoard (it ended, and the PID went to another process) is dropped unsignalled."""
    stopped = []
    for r in _records():
        if (tb is None or r.pid == tb.pid) and r.is_ours():
            try:
                if os.getpgid(r.pid) == r.pid:  # started with start_new_session: its group is its own
                    os.killpg(r.pid, signal.SIGTERM)
                else:
                    os.kill(r.pid, signal.SIGTERM)
                stopped.append(r.pid)
            except OSError:
                pass
    _save([r for r in _records() if tb is not None and r.pid != tb.pid])
    for pid in stopped:
        if pid in _CHILDREN:
            try:
                _CHILDREN.pop(pid).wait(timeout=5)  # reap it: no zombie left behind in the kernel
            except subprocess.TimeoutExpired:
                pass
    return len(stopped)
