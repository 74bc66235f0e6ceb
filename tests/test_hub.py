"""The workshop as participants meet it: a real JupyterHub whose servers are Slurm jobs, driven in a browser.

`scripts/hub/hub.sh up` starts the hub as `make hub` does (PAM accounts alice and bob, batchspawner's
SlurmSpawner on the local cluster, configurable-http-proxy, nbgitpuller clones), here with its own name and
ports, a one-minute idle limit and a five-second poll. Two headless Chromiums, one per learner:

1. a spawner that cannot submit (a hub started with a partition the cluster lacks): bob's start fails and the
   page says what failed (sbatch's own words) and what to do;
2. alice: a wrong password is refused; the hand-out link logs her in, her server starts as a Slurm job on a
   compute node (squeue) and opens notebook 00 in the workbook kernel without a dialog; the doctor cell runs
   and names her job's limits; notebook 01's job cell, opted in, submits from inside her server's job and the
   job completes; the TensorBoard cell shows that run's loss curve through /user/alice/proxy/<port>/;
3. bob at the same time: his server is another job; alice's server, notebook and TensorBoard answer him 403;
   his job and TensorBoard are his own (port, runs/, logdir) although the job has the same name;
4. a job that dies (cancelled, as a time limit or a node failure would end it): bob's hub page says how it
   ended and what to do; his next server has no jupyter-server-proxy: the TensorBoard cell and the doctor say
   so and what to do;
5. bob logs out: his server's job ends; alice left her tab: the idle limit ends hers, and her hub page says so.

Before them, hub.sh prepares the learners once more from a copy of this checkout in a folder only root may
enter: learners get the workbook from the handout repository and never read the instructor's checkout.
Every step leaves a screenshot in build/browser/hub/ (the last one of a failed step ends in -FAILED). Runs as
root (it creates the accounts and submits as them), like the Slurm tests; skipped with the reason otherwise.
When `hub.sh prepare` fails, every hub test fails with its words (not with what is missing after it).
The unit tests at the top (spawner messages, the doctor's hub line, TensorBoard without a proxy, what the
servers' settings point at) run anywhere.
"""
import contextlib
import http.server
import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT
from tutorial_lib import sitecheck, tensorboard
from tutorial_lib.doctor import Context, Options

HUB_DIR = ROOT / "scripts" / "hub"
sys.path.insert(0, str(HUB_DIR))
SHOTS = ROOT / "build" / "browser" / "hub"
NAME = "workbook-test"  # the test's hub: its own state folder, ports and job names (workbook-test-server-<learner>)
IDLE = 45  # the hub's idle limit here, seconds (not a whole minute: the page says it as it is)
CLONE = "hpc-workbook"


# ---------------------------------------------------------------------------------------- without a hub
def test_spawner_failures_say_what_failed_and_what_to_do():
    from workbook_spawner import LearnerError, ending, slurm_fields

    fields = slurm_fields("JobId=7 JobName=workbook-server-alice JobState=TIMEOUT Reason=TimeLimit "
                          "ExitCode=0:15 TimeLimit=01:00:00 NodeList=node1")
    assert ending(fields) == "TIMEOUT: its time limit (01:00:00) passed (reason: TimeLimit)"
    assert ending({"JobState": "FAILED", "ExitCode": "1:0", "Reason": "NonZeroExitCode"}) == \
        "FAILED: the server exited with an error (exit code 1) (reason: NonZeroExitCode)"
    error = LearnerError("The cluster refused <it>.", "Tell your instructor.", details="sbatch: error: x")
    assert error.jupyterhub_message == "The cluster refused <it>. Tell your instructor.\nsbatch: error: x"
    assert "&lt;it&gt;" in error.jupyterhub_html_message  # the hub shows it as HTML: escaped
    assert "<strong>What to do:</strong> Tell your instructor." in error.jupyterhub_html_message


def test_the_idle_limit_is_said_in_the_unit_it_was_given():
    from workbook_spawner import _duration

    assert [_duration(s) for s in (3600, 7200, 5400, 60, 45, 90)] == ["1 h", "2 h", "90 min", "1 min", "45 s", "90 s"]


def test_doctor_outside_a_hub_skips_and_inside_names_the_prefix_and_the_job(monkeypatch):
    for name in ("JUPYTERHUB_SERVICE_PREFIX", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    assert sitecheck.check_hub(Context(Options())).status == "SKIP"
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
    monkeypatch.setenv("JUPYTERHUB_USER", "ada")
    check = sitecheck.check_hub(Context(Options()))
    assert check.status == "PASS" and "/user/ada/" in check.message and "not a Slurm job" in check.message
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    ctx = Context(Options())
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 600))
    ctx.__dict__["job"] = {"JobId": "12", "NodeList": "node2", "TimeLimit": "08:00:00", "EndTime": end,
                           "TRES": "cpu=4,mem=16G,node=1,billing=4,gres/gpu=1"}  # what scontrol would say
    check = sitecheck.check_hub(ctx)
    assert check.status == "WARN", check  # ten minutes left: less than a lesson
    assert "Slurm job 12 on node2: 4 CPUs, 16G memory, 1 GPU, time limit 08:00:00" in check.message
    assert "save your notebooks" in check.fix
    # a cluster that does not track memory and GPUs as TRES: what the job asked for
    ctx.__dict__["job"] = {"JobId": "12", "NodeList": "node2", "TimeLimit": "UNLIMITED", "EndTime": "Unknown",
                           "NumCPUs": "2", "TRES": "cpu=2,node=1,billing=2", "MinMemoryNode": "8G",
                           "TresPerNode": "gres:gpu:1"}
    check = sitecheck.check_hub(ctx)
    assert check.status == "PASS" and "2 CPUs, 8G memory, 1 GPU, time limit UNLIMITED" in check.message


def test_tensorboard_on_a_hub_without_its_proxy_says_what_to_do(tmp_path, monkeypatch):
    class NoProxy(http.server.BaseHTTPRequestHandler):  # a hub's server without jupyter-server-proxy
        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), NoProxy)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/user/ada/"
        (tmp_path / "jpserver-4243.json").write_text(json.dumps({"url": url, "base_url": "/user/ada/", "sock": ""}))
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
        monkeypatch.setenv("JPY_PARENT_PID", "4243")
        monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
        monkeypatch.setenv("SLURMD_NODENAME", "node2")
        tensorboard._serves_proxy.cache_clear()
        html = tensorboard.TensorBoard(pid=1, port=6006, logdir="/x")._repr_html_()
        assert "<iframe" not in html and "no jupyter-server-proxy" in html
        assert "What to do" in html and "ssh -L 6006:127.0.0.1:6006 node2" in html
        assert "-J &lt;login node&gt;" in html  # shown as text, not taken for a tag
    finally:
        httpd.shutdown()
        httpd.server_close()
        tensorboard._serves_proxy.cache_clear()


@pytest.mark.parametrize("answer, expected", [((302, "/user/ada/proxy/{port}"), "FAIL"), ((404, ""), "FAIL"),
                                              ((302, "/hub/api/oauth2/authorize?client_id=x"), "WARN"),
                                              ((200, ""), "PASS")],
                         ids=["slash-redirect", "not-found", "login", "proxied"])
def test_doctor_checks_the_tensorboard_link_through_the_hub(answer, expected, tmp_path, monkeypatch):
    """In a hub's server the link is asked for at the hub's address with the server's token. Without
    jupyter-server-proxy, Jupyter answers `.../proxy/<port>/` with a redirect to the same path without its
    slash (then 404): that is a missing proxy, not a login page."""
    asked = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append((self.path, self.headers.get("Authorization")))
            code, location = answer
            self.send_response(code)
            if location:
                self.send_header("Location", location.format(port=self.path.split("/")[-2]))
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/user/ada/"
        (tmp_path / "jpserver-4244.json").write_text(json.dumps({"url": url, "base_url": "/user/ada/", "pid": os.getpid(),
                                                                 "token": ""}))
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
        monkeypatch.setenv("JPY_PARENT_PID", str(os.getpid()))
        monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
        monkeypatch.setenv("JUPYTERHUB_PUBLIC_URL", url)
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "server-token")
        monkeypatch.setattr(tensorboard, "STATE", tmp_path / "tensorboard.json")  # none runs: a test page is asked
        check = sitecheck.check_tensorboard(Context(Options()))
        assert check.status == expected, check
        assert asked[0][0].startswith("/user/ada/proxy/") and asked[0][1] == "token server-token"
        if answer[1].startswith("/user/ada/proxy") or answer[0] == 404:
            assert "no jupyter-server-proxy" in check.message
            assert check.fix.startswith("the hub's admins: install and enable jupyter-server-proxy")
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_nothing_a_learners_server_runs_or_reads_lies_in_the_instructors_checkout(monkeypatch):
    """jupyterhub_config.py's settings for the servers (command, prologue, environment, the variables passed on)
    name the shared environment and the learner's home, never this checkout, which may be private."""
    from traitlets.config import Config

    monkeypatch.setenv("PATH", f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}")  # as `make test` runs the hub
    monkeypatch.setenv("VIRTUAL_ENV", str(ROOT / ".venv"))
    c = Config()
    exec(compile((HUB_DIR / "jupyterhub_config.py").read_text(), "jupyterhub_config.py", "exec"),
         {"get_config": lambda: c, "__file__": str(HUB_DIR / "jupyterhub_config.py")})
    from jupyterhub.spawner import Spawner

    learners = {f"{section}.{k}": v for section in ("Spawner", "SlurmSpawner", "WorkbookSlurmSpawner")
                for k, v in c[section].items()}
    assert {"Spawner.cmd", "WorkbookSlurmSpawner.req_prologue", "Spawner.environment"} <= set(learners)
    into = [f"{k} = {v!r}" for k, v in learners.items() if str(ROOT) in json.dumps(v, default=str)]
    assert not into, f"a learner's server would need the instructor's checkout: {into}"
    keep = learners.get("Spawner.env_keep", Spawner.class_traits()["env_keep"].default())  # what they inherit
    assert not {"PATH", "PYTHONPATH", "VIRTUAL_ENV"} & set(keep), keep


def _fake_slurm(tmp_path: Path, completing: int) -> dict:
    """squeue, scancel and scontrol on PATH as a cluster whose one server job (42, alice's) stays COMPLETING for
    `completing` queries after scancel (a server slow to answer SIGTERM); -1: it never ends. KillWait = 1 s."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "squeue").write_text(f"""#!/bin/bash
[[ " $* " == *" -u alice "* ]] || exit 0
if [[ -e {tmp_path}/cancelled ]]; then
    n=$(( $(cat {tmp_path}/after 2>/dev/null || echo 0) + 1 )); echo $n > {tmp_path}/after
    (( {completing} < 0 || n <= {completing} )) || exit 0
fi
echo 42
""")
    (bin_ / "scancel").write_text(f"#!/bin/bash\necho \"$*\" > {tmp_path}/cancelled\n")
    (bin_ / "scontrol").write_text("#!/bin/bash\necho 'KillWait                = 1 sec'\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "WORKBOOK_HUB_NAME": "workbook-fake",
            "WORKBOOK_HUB_STATE": str(tmp_path / "state"), "WORKBOOK_HUB_STOP_WAIT": "2"}


@pytest.mark.skipif(os.getuid() != 0, reason="hub.sh down runs as root")
@pytest.mark.parametrize("completing", [3, -1], ids=["ends", "never-ends"])
def test_hub_down_returns_once_its_servers_jobs_have_left_the_queue(completing, tmp_path):
    """A cancelled job stays COMPLETING until its processes exit (up to KillWait): `down` waits for that, so a
    `make hub-down` that returned has freed the nodes; a job that outlives the wait is named in a warning."""
    env = _fake_slurm(tmp_path, completing)
    run = subprocess.run(["bash", str(HUB_DIR / "hub.sh"), "down"], env=env, capture_output=True, text=True,
                         timeout=60)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert (tmp_path / "cancelled").read_text().split() == ["42"], out
    assert "waiting for the servers' jobs to end: 42 (Slurm kills what still runs after KillWait=1 s)" in out
    queried = int((tmp_path / "after").read_text())
    if completing > 0:
        assert queried == completing + 1 and "warning" not in out, out  # it asked until the job had gone
        assert run.stdout.splitlines()[-1] == "hub: down", out
    else:
        assert "hub: warning: the servers' jobs 42 have not ended after 3 s: see squeue -j 42" in run.stderr, out


@pytest.mark.skipif(os.getuid() != 0, reason="hub.sh down runs as root")
def test_hub_down_names_a_bad_stop_wait(tmp_path):
    env = {**_fake_slurm(tmp_path, 1), "WORKBOOK_HUB_STOP_WAIT": "1m"}
    run = subprocess.run(["bash", str(HUB_DIR / "hub.sh"), "down"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "WORKBOOK_HUB_STOP_WAIT=1m is not a whole number of seconds" in run.stderr
    assert not (tmp_path / "cancelled").exists()  # it stopped nothing


# ---------------------------------------------------------------------------------------- the hub
def _why_not() -> str | None:
    if os.getuid() != 0:
        return ("the hub test runs as root (it creates the learners' accounts, authenticates them with PAM and "
                "submits their servers as Slurm jobs): run make test as root")
    if shutil.which("sbatch") is None:
        return "no Slurm: make test as root starts the local cluster (scripts/slurm/local-cluster.sh up)"
    return None


hub_only = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


def _free_ports(n: int) -> int:
    """A port p with p..p+n-1 free on 127.0.0.1 (the hub, its API, its proxy's API)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + n < 65535 and all(_free(p + i) for i in range(1, n)):
            return p
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Hub:
    """One hub started by scripts/hub/hub.sh (as `make hub` starts it), with this test's settings."""

    def __init__(self, name: str, **settings):
        self.name, self.port = name, _free_ports(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "WORKBOOK_HUB_NAME": name, "WORKBOOK_HUB_PORT": str(self.port),
                    **{f"WORKBOOK_HUB_{k.upper()}": str(v) for k, v in settings.items()}}
        self.log = SHOTS / f"{name}.log"

    def hub_sh(self, command: str, timeout: float = 600, checkout: Path = ROOT, **env):
        """`hub.sh command` of `checkout`, started in it (as `make hub` there is); fails with the end of its log."""
        start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "a") as log:
            p = subprocess.run(["bash", str(checkout / "scripts" / "hub" / "hub.sh"), command],
                               env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                               cwd=checkout)
        said = self.log.read_text()[start:]
        if p.returncode != 0:
            pytest.fail(f"hub.sh {command} failed; {self.log} ends with:\n{said[-2000:]}", pytrace=False)
        return said

    def password(self, user: str) -> str:
        shared = Path(self.env.get("WORKBOOK_HUB_HOME", "/opt/hpc-workbook"))
        return dict(line.split() for line in (shared / "accounts").read_text().splitlines())[user]

    def link(self) -> str:
        """The hand-out link hub.sh prints: nbgitpuller updates the learner's clone, then opens notebook 00."""
        return (f"{self.url}/hub/user-redirect/git-pull?repo=file:///opt/hpc-workbook/handout.git&branch=main"
                f"&urlpath=lab/tree/{CLONE}/notebooks/00_setup.ipynb")

    def server_job(self, user: str) -> dict | None:
        """The learner's server job as squeue shows it (id, state, node, user, name), or None."""
        out = subprocess.run(["squeue", "-h", "-u", user, "-n", f"{self.name}-server-{user}", "-o", "%i %T %N %u %j"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return dict(zip(("id", "state", "node", "user", "name"), out[:5])) if out else None


def job_fields(job: str) -> dict:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_until(what: str, check, timeout: float, every: float = 1.0):
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.time() > deadline:
            pytest.fail(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def home(user: str) -> Path:
    import pwd

    return Path(pwd.getpwnam(user).pw_dir)


def has_account(user: str) -> bool:
    try:
        home(user)
        return True
    except KeyError:
        return False


def as_user(user: str, *cmd: str):
    subprocess.run(["runuser", "-u", user, "--", "env", f"HOME={home(user)}", *cmd], check=True,
                   capture_output=True, timeout=60, cwd=home(user))


@pytest.fixture(scope="module")
def ui():
    """The browser helpers of test_browser.py (skips this module's hub tests when Chromium is missing)."""
    return importlib.import_module("test_browser")


@pytest.fixture(scope="module")
def prepared():
    """`hub.sh prepare` as `make hub` runs it, once, after the learners' clones are put back as handed out (the
    test's own changes from a former run reverted, runs/ emptied). When it fails, each test that needs the hub
    fails with hub.sh's words (pytest keeps a module fixture's failure)."""
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    for user in ("alice", "bob"):
        if has_account(user):  # none yet: hub.sh creates it
            reset_clone(user)
    hub = Hub(f"{NAME}-prepare")
    hub.hub_sh("prepare")
    return hub


@pytest.fixture(scope="module")
def learners(ui, prepared):
    """A Chromium per learner, once hub.sh has prepared the learners."""
    drivers = {}
    try:
        for user in ("alice", "bob"):
            drivers[user] = ui.chromium()
        yield drivers
    finally:
        for d in drivers.values():
            d.quit()


def reset_clone(user: str):
    clone = home(user) / CLONE
    if (clone / ".git").is_dir():
        as_user(user, "git", "-C", str(clone), "checkout", "--", ".")
        shutil.rmtree(clone / "runs", ignore_errors=True)
    config = home(user) / ".jupyter" / "jupyter_server_config.json"
    config.unlink(missing_ok=True)


def log_in(ui, d, hub: Hub, user: str, password: str):
    ui.waiter(d).until(lambda d: ui.css(d, "#username_input"), "no login form")
    ui.css(d, "#username_input")[0].clear()
    ui.css(d, "#username_input")[0].send_keys(user)
    ui.css(d, "#password_input")[0].send_keys(password)
    ui.css(d, "#login_submit")[0].click()


def cell_output(ui, d, cell, until, timeout=None) -> str:
    """Wait until the cell's output satisfies `until(text)`; the output text."""
    def out(_):
        text = "\n".join(o.text for o in ui.css(cell, ".jp-OutputArea-output"))
        return text if until(text) else False
    return ui.waiter(d, timeout or ui.WAIT).until(out, f"the cell's output never satisfied the test; cell:\n{cell.text}")


def run_and_read(ui, d, text: str, until, timeout=None) -> str:
    cell = ui.code_cell(d, text)
    ui.run_cell(d, cell)
    out = cell_output(ui, d, cell, until, timeout)
    d.execute_script("arguments[0].scrollIntoView()", cell)  # the step's screenshot shows the cell and its output
    return out


def run_until_job_ends(ui, d, timeout: float) -> str:
    """Run notebook 01's "run this cell again in a minute" cell until it shows the job's end."""
    from tutorial_lib.slurm import TERMINAL

    cell = ui.code_cell(d, "job.state()")
    deadline = time.time() + timeout
    while True:
        ui.run_cell(d, cell)
        out = cell_output(ui, d, cell, lambda t: t.startswith("job ") or "no job" in t)
        if any(f": {state}" in out.splitlines()[0] for state in TERMINAL) or time.time() > deadline:
            return out
        time.sleep(3)


def show_tab(ui, d, name: str):
    tab = ui.waiter(d).until(lambda d: next((t for t in ui.css(d, ".lm-DockPanel-tabBar .lm-TabBar-tab")
                                             if t.text.strip() == name), False), f"no tab {name}")
    tab.click()


def set_submit(ui, d):
    """Opt in to notebook 01's job: in the parameters cell, double-click False on the SUBMIT line, type True. A
    learner's clone kept from an earlier session (nbgitpuller keeps their edits) may already say True: kept."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    # the cell whose source has the line (not one whose output quotes it: 01 prints "SUBMIT = False: ..." later)
    line = ("//div[contains(@class, 'jp-NotebookPanel') and not(contains(@class, 'lm-mod-hidden'))]"
            "//div[contains(@class, 'jp-CodeCell')][.//div[contains(@class, 'cm-line')]"
            "[starts-with(normalize-space(.), 'SUBMIT = ')]]")
    cell = ui.waiter(d).until(lambda d: next(iter(d.find_elements(By.XPATH, line)), False),
                              "no code cell with the line SUBMIT = ...")
    if "SUBMIT = True" not in cell.text:
        word = cell.find_element(By.XPATH, ".//div[contains(@class, 'cm-line')][starts-with(normalize-space(.), "
                                           "'SUBMIT')]//*[normalize-space(text())='False']")
        d.execute_script("arguments[0].scrollIntoView()", word)
        ActionChains(d).double_click(word).send_keys("True").perform()
    ui.waiter(d, 10).until(lambda _: "SUBMIT = True" in cell.text, "SUBMIT = True was not typed in")
    return cell


def kernel_env(user: str, name: str) -> dict:
    """The environment of the learner's kernel (the newest ipykernel process of `user`)."""
    pids = subprocess.run(["pgrep", "-n", "-u", user, "-f", "ipykernel_launcher"], capture_output=True,
                          text=True).stdout.split()
    assert pids, f"no kernel of {user} runs"
    raw = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
    return dict(v.decode().split("=", 1) for v in raw if b"=" in v)


def http_status(d, url: str) -> int:
    """The status a fetch of `url` from the page's origin gets, with the learner's cookies."""
    return d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {credentials: 'include'}).then(r => done(r.status), e => done(String(e)));", url)


def listening_outside_loopback(pids: set[int]) -> list[str]:
    """Listening TCP sockets of these processes that are not on 127.0.0.1."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout
    bad = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids and not line.split()[3].startswith("127.0.0.1:"):
            bad.append(line)
    return bad


def pids_of(*users: str) -> set[int]:
    out = subprocess.run(["pgrep", "-u", ",".join(users)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def private_copy(folder: Path) -> Path:
    """This checkout's tracked files as they are now (uncommitted changes included), cloned into `folder`."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "stash", "create"], capture_output=True, text=True, check=True).stdout.strip() \
        or subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    copy = folder / "workbook"
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(ROOT), str(copy)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(copy), "checkout", "-q", "--detach", commit], check=True, timeout=120)
    return copy


@hub_only
def test_learners_are_prepared_from_a_checkout_they_may_not_read(prepared):
    """The instructor's checkout in a folder only root may enter (a mktemp -d, /root/...), `make hub` run there:
    the learners' clones come from the handout repository, their commands start in their homes, and nothing
    they run (kernel, its PYTHONPATH, their clone's remote) points into the checkout."""
    shared = Path(prepared.env.get("WORKBOOK_HUB_HOME", "/opt/hpc-workbook"))
    env = shared / "env"
    assert (env / ".workbook-env").is_file(), "hub.sh prepare left no learners' environment"
    folder = Path(tempfile.mkdtemp(prefix="private-"))  # mode 700, as mktemp -d makes it
    try:
        assert folder.stat().st_mode & 0o077 == 0
        copy = private_copy(folder)
        # the Python the shared environment was built on: the copy reuses the environment (it has no .venv)
        said = prepared.hub_sh("prepare", checkout=copy, WORKBOOK_HUB_PYTHON=os.path.realpath(env / "bin" / "python"))
        assert "none reads this checkout" in said, said
        handout = subprocess.run(["git", "-C", str(shared / "handout.git"), "rev-parse", "main^{tree}"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        tree = subprocess.run(["git", "-C", str(copy), "rev-parse", "HEAD^{tree}"], capture_output=True, text=True,
                              check=True).stdout.strip()
        assert handout == tree, said  # the learners' workbook is the copy's
        for user in ("alice", "bob"):
            clone = home(user) / CLONE
            kernel = home(user) / ".local" / "share" / "jupyter" / "kernels" / "hpc-workbook" / "kernel.json"
            spec = json.loads(kernel.read_text())
            assert spec["argv"][0].startswith(f"{env}/"), spec
            assert spec["env"]["PYTHONPATH"] == str(clone), spec
            assert "tutorial_lib.kernel" in spec["argv"], spec  # the kernel that sets TENSORBOARD_PROXY_URL
            remote = subprocess.run(["runuser", "-u", user, "--", "git", "-C", str(clone), "remote", "get-url",
                                     "origin"], capture_output=True, text=True, timeout=60, cwd="/").stdout.strip()
            assert remote == f"file://{shared}/handout.git", remote
            for path in (kernel, home(user) / ".gitconfig", clone / ".git" / "config"):
                text = path.read_text()
                assert str(copy) not in text and str(ROOT) not in text, f"{path} points into the checkout:\n{text}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@hub_only
def test_a_spawner_that_cannot_submit_tells_the_learner_what_to_do(ui, learners):
    """A hub whose servers ask for a partition the cluster lacks: sbatch refuses, and bob's page says so."""
    hub = Hub(f"{NAME}-broken", partition="no-such-partition")
    steps, d = ui.Steps(learners["bob"], "hub/1-cannot-submit"), learners["bob"]
    try:
        with steps("hub-up"):
            hub.hub_sh("up")
            d.get(f"{hub.url}/hub/login")
        with steps("spawn-refused"):
            log_in(ui, d, hub, "bob", hub.password("bob"))
            page = ui.waiter(d).until(lambda d: (t := d.find_element("tag name", "body").text) and "What to do" in t
                                      and t, "no message on the failed start")
            # the spawn page's error, or the "Spawn failed" page when the hub had already noted the failure
            assert ui.css(d, "#workbook-not-started") or "Spawn failed" in page, page
            assert "The cluster refused to start your server" in page
            assert "invalid partition" in page.lower(), page  # sbatch's own words name the bad request
            assert "send this message to your instructor" in page
            assert hub.server_job("bob") is None
    finally:
        hub.hub_sh("down")
        d.delete_all_cookies()


@pytest.fixture(scope="module")
def hub(learners):
    hub = Hub(NAME, idle=IDLE, poll=5)
    try:
        hub.hub_sh("up")
        yield hub
    finally:
        hub.hub_sh("down")
        for user in filter(has_account, ("alice", "bob")):
            (home(user) / ".jupyter" / "jupyter_server_config.json").unlink(missing_ok=True)
        left = [j for j in (hub.server_job("alice"), hub.server_job("bob")) if j]
        assert not left, f"make hub-down left the servers' jobs {left}"


@hub_only
def test_two_learners_work_in_their_own_server_jobs(ui, learners, hub):
    a, b = learners["alice"], learners["bob"]
    steps_a, steps_b = ui.Steps(a, "hub/2-alice"), ui.Steps(b, "hub/3-bob")
    kernel = "Python (HPC workbook)"

    # ---- alice: log in, her server is a Slurm job, notebook 00 in the workbook kernel
    with steps_a("wrong-password-refused"):
        a.get(hub.link())
        log_in(ui, a, hub, "alice", "not-her-password")
        ui.waiter(a).until(lambda d: ui.css(d, ".login_error"), "a wrong password was not refused")
        assert "Invalid username or password" in ui.css(a, ".login_error")[0].text
    with steps_a("server-job-starts"):
        log_in(ui, a, hub, "alice", hub.password("alice"))
        job = wait_until("alice's server job to run", lambda: (j := hub.server_job("alice")) and
                         j["state"] == "RUNNING" and j, 60, 0.5)
        assert job["user"] == "alice" and job["node"] in ("node1", "node2"), job
    with steps_a("notebook-00-in-the-workbook-kernel"):  # nbgitpuller's link ends on the notebook
        ui.notebook_in_kernel(a, kernel)
        assert [t.text.strip() for t in ui.css(a, ".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")] == \
            ["00_setup.ipynb"]
        state = Path(f"/tmp/workbook-hub/{NAME}")  # the hub's and its proxy's PID files
        hub_pids = {int((state / f"{name}.pid").read_text()) for name in ("jupyterhub", "proxy")}
        bad = listening_outside_loopback(pids_of("alice") | hub_pids)
        assert not bad, f"listening beyond 127.0.0.1: {bad}"
    with steps_a("doctor-cell"):
        run_and_read(ui, a, "tl.notebook.setup()", lambda t: "workbook ready" in t)
        table = run_and_read(ui, a, "tl.doctor.run()", lambda t: re.search(r"(ready|NOT ready)", t), 180)
        lines = {line.split()[1]: line for line in table.splitlines() if line.split()[:1] in
                 (["PASS"], ["WARN"], ["FAIL"], ["SKIP"])}
        assert lines["hub"].startswith("PASS"), table
        assert f"the JupyterHub server of alice at /user/alice/" in lines["hub"], table
        assert f"Slurm job {job['id']} on {job['node']}: 2 CPUs, 8G memory, 1 GPU" in lines["hub"], table
        assert f"~/{CLONE}" in lines["hub"], table  # the package of her own clone
        for name in ("kernel", "proxy", "tensorboard", "sbatch"):
            assert lines[name].startswith("PASS"), lines[name]
        assert "through the hub" in lines["tensorboard"], lines["tensorboard"]

    # ---- notebook 01's job, opted in, from inside her server's job
    with steps_a("notebook-01-job-submitted"):
        ui.open_in_file_browser(a, "01_single_gpu.ipynb")
        ui.notebook_in_kernel(a, kernel)
        run_and_read(ui, a, "tl.notebook.setup()", lambda t: "workbook ready" in t)
        ui.run_cell(a, set_submit(ui, a))
        run_and_read(ui, a, "tl.jobs.write(\"01_single_gpu\"", lambda t: "01_single_gpu.sbatch" in t)
        out = run_and_read(ui, a, "job = tl.jobs.submit(path)", lambda t: "submitted job" in t, 120)
        alice_job = re.search(r"submitted job (\d+)", out).group(1)
        fields = job_fields(alice_job)
        assert fields["UserId"].startswith("alice(") and fields["JobName"] == "01_single_gpu_cpu", fields
        assert fields["WorkDir"] == str(home("alice") / CLONE), fields
        kernel_vars = kernel_env("alice", kernel)
        assert kernel_vars["SLURM_JOB_ID"] == job["id"]  # submitted from inside her server's job
        assert kernel_vars.get("TENSORBOARD_PROXY_URL", "").endswith("proxy/%PORT%/"), kernel_vars  # %tensorboard
        into = {k: v for k, v in kernel_vars.items() if str(ROOT) in v}
        assert not into, f"alice's kernel names the instructor's checkout: {into}"

    # ---- bob logs in meanwhile: another job; alice's server is not his
    with steps_b("server-job-starts"):
        b.get(hub.link())
        log_in(ui, b, hub, "bob", hub.password("bob"))
        bob_job = wait_until("bob's server job to run", lambda: (j := hub.server_job("bob")) and
                             j["state"] == "RUNNING" and j, 60, 0.5)
        assert bob_job["id"] != job["id"] and hub.server_job("alice")["state"] == "RUNNING"
        ui.notebook_in_kernel(b, kernel)

    with steps_a("notebook-01-job-completes"):
        out = run_until_job_ends(ui, a, 240)
        assert f"job {alice_job}: COMPLETED" in out, out
        assert (home("alice") / CLONE / "runs" / "01_single_gpu_cpu" / "result.json").is_file()

    with steps_a("tensorboard-through-the-hub"):
        show_tab(ui, a, "00_setup.ipynb")
        board_cell = ui.code_cell(a, "tl.tensorboard.start(")
        ui.run_cell(a, board_cell)
        frame = ui.waiter(a).until(lambda d: (ui.css(board_cell, ".jp-OutputArea iframe") or [False])[0],
                                   "the TensorBoard cell showed no inline view")
        src = frame.get_dom_attribute("src")
        alice_port = int(re.fullmatch(r"/user/alice/proxy/(\d+)/", src).group(1))
        ui.check_loss_curve(a, frame, "01_single_gpu_cpu/tb", 20, 10, f"http://127.0.0.1:{alice_port}/")
        # what the hub cannot guard (docs/instructor.md): from the node itself her TensorBoard answers anyone
        with urllib.request.urlopen(f"http://127.0.0.1:{alice_port}/data/logdir", timeout=10) as r:
            assert json.load(r)["logdir"] == str(home("alice") / CLONE / "runs")
    a.get("about:blank")  # alice leaves her tab: from now on her server is idle

    with steps_b("alice-is-not-his"):
        for path in ("lab", f"api/contents/{CLONE}/notebooks/00_setup.ipynb", f"proxy/{alice_port}/"):
            status = http_status(b, f"/user/alice/{path}")
            assert status == 403, f"bob got {status} for alice's /user/alice/{path}"
        b.get(f"{hub.url}/user/alice/lab")
        ui.waiter(b).until(lambda d: "403" in d.find_element("tag name", "body").text, "no 403 page for bob")
    alice_touched = time.time()  # bob's requests went through her server's route: its last activity

    with steps_b("his-own-job-and-tensorboard"):
        b.get(f"{hub.url}/user/bob/lab/tree/{CLONE}/notebooks")

        ui.open_in_file_browser(b, "01_single_gpu.ipynb")
        ui.notebook_in_kernel(b, kernel)
        run_and_read(ui, b, "tl.notebook.setup()", lambda t: "workbook ready" in t)
        ui.run_cell(b, set_submit(ui, b))
        run_and_read(ui, b, "tl.jobs.write(\"01_single_gpu\"", lambda t: "01_single_gpu.sbatch" in t)
        out = run_and_read(ui, b, "job = tl.jobs.submit(path)", lambda t: "submitted job" in t, 120)
        bob_run_job = re.search(r"submitted job (\d+)", out).group(1)
        fields = job_fields(bob_run_job)
        assert fields["JobName"] == "01_single_gpu_cpu" and fields["UserId"].startswith("bob(")
        assert fields["WorkDir"] == str(home("bob") / CLONE)
        out = run_until_job_ends(ui, b, 240)
        assert f"job {bob_run_job}: COMPLETED" in out, out
        board_cell = ui.code_cell(b, "tl.tensorboard.start(")
        ui.run_cell(b, board_cell)
        frame = ui.waiter(b).until(lambda d: (ui.css(board_cell, ".jp-OutputArea iframe") or [False])[0],
                                   "bob's TensorBoard cell showed no inline view")
        bob_port = int(re.fullmatch(r"/user/bob/proxy/(\d+)/", frame.get_dom_attribute("src")).group(1))
        assert bob_port != alice_port
        with urllib.request.urlopen(f"http://127.0.0.1:{bob_port}/data/logdir", timeout=10) as r:
            assert json.load(r)["logdir"] == str(home("bob") / CLONE / "runs")
        results = [json.loads((home(u) / CLONE / "runs" / "01_single_gpu_cpu" / "result.json").read_text())
                   for u in ("alice", "bob")]
        assert results[0] != results[1]  # two runs, each in its own clone

    # ---- a job that dies: the hub says how it ended and what to do
    with steps_b("server-job-dies"):
        subprocess.run(["scancel", bob_job["id"]], check=True, timeout=30)  # as a time limit or a node failure would
        wait_until("bob's server job to end", lambda: hub.server_job("bob") is None, 60)

        def ended(d):
            d.get(f"{hub.url}/user/bob/lab")
            return ui.css(d, "#workbook-ended") or time.sleep(2)
        message = ui.waiter(b, 60).until(ended, "no page saying how bob's server job ended")[0].text
        assert f"Slurm job {bob_job['id']}" in message and "CANCELLED" in message, message
        assert "press Launch" in ui.css(b, "#workbook-todo")[0].text

    with steps_b("next-server-without-proxy"):
        config = home("bob") / ".jupyter" / "jupyter_server_config.json"  # as if the admins forgot the proxy
        config.parent.mkdir(exist_ok=True)
        config.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_server_proxy": False}}}))
        shutil.chown(config.parent, "bob", "bob")
        shutil.chown(config, "bob", "bob")
        ui.css(b, "#start")[0].click()  # Launch
        wait_until("bob's new server job to run", lambda: (j := hub.server_job("bob")) and
                   j["state"] == "RUNNING" and j["id"] != bob_job["id"] and j, 60, 0.5)
        b.get(f"{hub.url}/user/bob/lab/tree/{CLONE}/notebooks/00_setup.ipynb")
        ui.notebook_in_kernel(b, kernel)
        run_and_read(ui, b, "tl.notebook.setup()", lambda t: "workbook ready" in t)
        board_cell = ui.code_cell(b, "tl.tensorboard.start(")
        ui.run_cell(b, board_cell)
        out = cell_output(ui, b, board_cell, lambda t: "no jupyter-server-proxy" in t)
        assert "What to do: ask the hub's admins to install jupyter-server-proxy" in out
        assert not ui.css(board_cell, ".jp-OutputArea iframe")

    # ---- logging out ends bob's server; the idle limit ends alice's
    with steps_b("logout-ends-the-job"):
        b.get(f"{hub.url}/hub/logout")
        wait_until("bob's server job to end after logout", lambda: hub.server_job("bob") is None, 60)
    with steps_a("idle-limit-ends-the-job"):
        wait_until("the idle limit to end alice's server", lambda: hub.server_job("alice") is None,
                   max(10.0, alice_touched + IDLE + 90 - time.time()), 2)
        a.get(f"{hub.url}/user/alice/lab")
        message = ui.waiter(a).until(lambda d: ui.css(d, "#workbook-ended"), "no page about alice's server")[0].text
        assert f"The hub stopped your server (Slurm job {job['id']})" in message
        assert "idle for longer than the hub's limit (45 s)" in message


@hub_only
def test_hub_down_cancels_its_servers_jobs_and_no_other(ui, learners, hub):
    """`make hub-down`: the hub stops the running servers (their jobs end); a job of the same learner that is
    not a server of this hub (her own batch job) keeps running."""
    b = learners["bob"]
    steps = ui.Steps(b, "hub/4-hub-down")
    with steps("bob-logs-in-again"):
        b.get(f"{hub.url}/hub/login")
        log_in(ui, b, hub, "bob", hub.password("bob"))
        server = wait_until("bob's server job to run", lambda: (j := hub.server_job("bob")) and
                            j["state"] == "RUNNING" and j, 60, 0.5)
        ui.waiter(b).until(lambda d: ui.css(d, ".jp-LabShell"), "bob's JupyterLab did not open")
    own = subprocess.run(["runuser", "-u", "alice", "--", "sbatch", "--parsable", "--job-name=not-the-hubs",
                          "--output=/dev/null", "--wrap=sleep 300"], capture_output=True, text=True, timeout=30,
                         cwd="/tmp", check=True).stdout.strip().split(";")[0]
    try:
        with steps("hub-down"):
            hub.hub_sh("down")
            assert hub.server_job("bob") is None
            assert job_fields(server["id"])["JobState"] in ("CANCELLED", "COMPLETED"), job_fields(server["id"])
            assert job_fields(own)["JobState"] in ("PENDING", "RUNNING"), job_fields(own)
    finally:
        subprocess.run(["scancel", own], timeout=30)
