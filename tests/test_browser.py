"""The workbook as learners see it: JupyterLab and TensorBoard in a real headless Chromium.

JupyterLab is started as `make lab` starts it (127.0.0.1, a token), on a free port, once at `/` and once at a
JupyterHub-like base URL. The browser opens notebook 00 from the file browser, runs its TensorBoard cell and
reads the train/loss curve of a tiny run in the inline view, which goes through jupyter-server-proxy. The
browser reaches 127.0.0.1 only, like one on a cluster without internet: the PyTorch Profiler tab is checked
that way. Each step leaves a screenshot in build/browser/<case>/ (the last one of a failed step ends in -FAILED).

Needs Debian's chromium + chromium-driver (`bash scripts/install-browser.sh` as root; `make test` runs it) and
selenium (the test extra).
"""
import contextlib
import ctypes
import importlib.util
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT, tiny

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
MISSING = [name for name, found in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER),
                                    ("selenium (pip install -e '.[test]')", importlib.util.find_spec("selenium")))
           if not found]
if MISSING:  # one line for the whole module
    pytest.skip(f"browser test: no {' and no '.join(MISSING)}; as root, `bash scripts/install-browser.sh` installs "
                "Debian's chromium + chromium-driver (make test does)", allow_module_level=True)
pytestmark = pytest.mark.browser
SHOTS = ROOT / "build" / "browser"
NOTEBOOK = ROOT / "notebooks" / "00_setup.ipynb"
RUN = ROOT / "runs" / "test_browser"  # below the runs/ folder that notebook 00's TensorBoard serves
BASE_URLS = ("/", "/user/alice/")  # make lab's, and a JupyterHub's (ServerApp.base_url=/user/<name>/)
WAIT = 90  # seconds for anything the browser waits for: a kernel start with torch's import on a busy 2-core CPU


def stops_with_pytest():
    """preexec_fn: SIGTERM to the child when this test process dies, also without its teardown (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
    # nothing of its own on the network: no QUIC, first-run page, background requests, updates or sync
    "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--disable-sync",
    # offline, like a browser that reaches only the cluster: every other host is unresolvable
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")


def chromium():
    """A new headless Chromium with its own profile (cookies: one per learner), its console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in CHROMIUM_FLAGS:
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(WAIT)
    driver.set_script_timeout(30)
    return driver


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    yield driver
    driver.quit()


class TinyRun:
    """A few CPU steps with TensorBoard scalars and a profiler trace, where notebook 00's TensorBoard looks.

    It trains in the background (`python -m tutorial_lib train ...`) while JupyterLab and the browser start."""

    def __init__(self):
        shutil.rmtree(RUN, ignore_errors=True)
        self.cfg = tiny(RUN, steps=6, log_every=2, batch_size=8, eval=False, tensorboard=True, profile=True,
                        profile_wait=1, profile_warmup=1, profile_active=2)
        self.log = SHOTS / "tiny_run.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tutorial_lib", "train", *self.cfg.to_overrides()],
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=stops_with_pytest)

    def wait(self):
        try:
            code = self.proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            self.stop()
            code = "timeout (240 s)"
        assert code == 0, f"the tiny run failed ({code}); {self.log} ends with:\n{self.log.read_text()[-1500:]}"
        return self.cfg

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        shutil.rmtree(RUN, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_run():
    run = TinyRun()
    yield run
    run.stop()


@pytest.fixture(scope="module")
def boards():
    """Stops the TensorBoards started while the tests ran (by the notebook's kernel or by a test)."""
    from tutorial_lib import tensorboard

    before = {tb.pid for tb in tensorboard.running()}
    yield tensorboard
    for tb in tensorboard.running():
        if tb.pid not in before:
            tensorboard.stop(tb)


class Lab:
    """JupyterLab as `make lab` starts it, with its own Jupyter folders and the workbook's kernel registered."""

    def __init__(self, base_url: str, home: Path):
        self.base_url, self.token = base_url, secrets.token_hex(16)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}{base_url}"
        bin_dir = str(Path(sys.executable).parent)
        env = {k: v for k, v in os.environ.items()
               if k not in ("JUPYTERHUB_SERVICE_PREFIX", "TENSORBOARD_PROXY_URL", "JPY_PARENT_PID")}
        env.update(JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
                   JUPYTER_RUNTIME_DIR=str(home / "runtime"), PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
        spec = json.loads(NOTEBOOK.read_text())["metadata"]["kernelspec"]
        self.kernel = spec["display_name"]
        # `make kernel`'s command, into this lab's own data folder (the user's kernels stay untouched)
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--user", "--name", spec["name"],
                        "--display-name", spec["display_name"]], env=env, check=True, capture_output=True, timeout=60)
        # the test runs cells of a committed notebook: never save it; no news pop-up over the page
        for plugin, settings in (("docmanager-extension/plugin", {"autosave": False}),
                                 ("apputils-extension/notification", {"fetchNews": "false"})):
            path = home / "config" / "lab" / "user-settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(settings))
        cmd = [f"{bin_dir}/jupyter", "lab", "--ip=127.0.0.1", f"--port={self.port}", "--no-browser",
               f"--ServerApp.root_dir={ROOT}", f"--ServerApp.base_url={base_url}",
               f"--IdentityProvider.token={self.token}", *(["--allow-root"] if os.getuid() == 0 else [])]
        self.log = home / "jupyter.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=stops_with_pytest)

    def ready(self) -> "Lab":
        deadline = time.time() + WAIT
        while not self.api("status"):
            if self.proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"JupyterLab did not start at {self.url}; its log ends with:\n"
                            f"{self.log.read_text()[-1500:]}")
            time.sleep(0.5)
        return self

    def api(self, path: str):
        req = urllib.request.Request(f"{self.url}api/{path}", headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def terminate(self):
        """SIGTERM: the server shuts its kernels down (they run in sessions of their own), then exits."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self):
        self.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """lab(base_url) -> a running Lab. Both start at once (in the background) and stop at the end of the module."""
    labs = {}
    try:
        for base_url in BASE_URLS:
            labs[base_url] = Lab(base_url, tmp_path_factory.mktemp("jupyter"))
        yield lambda base_url: labs[base_url].ready()
    finally:
        for one in labs.values():
            one.terminate()  # both at once
        for one in labs.values():
            one.stop()


class Steps:
    """`with steps("name"):` one step of a test; a screenshot of the page when it ends, passed or failed."""

    def __init__(self, driver, case: str):
        self.driver, self.folder, self.n = driver, SHOTS / case, 0
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.n += 1
        failed, t0 = True, time.time()
        try:
            yield
            failed = False
        finally:
            shot = f"{self.n:02d}-{name}{'-FAILED' if failed else ''}"
            self.driver.save_screenshot(str(self.folder / f"{shot}.png"))
            with open(self.folder / "steps.txt", "a") as log:  # how long each step took
                log.write(f"{shot}: {time.time() - t0:.1f} s\n")


def waiter(driver, timeout: float = WAIT):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,))


def css(root, selector: str):
    from selenium.webdriver.common.by import By

    return root.find_elements(By.CSS_SELECTOR, selector)


def open_in_file_browser(driver, name: str):
    """Double-click `name` in JupyterLab's file browser, as a learner does."""
    from selenium.webdriver.common.action_chains import ActionChains

    def double_click(d):
        item = next((i for i in css(d, ".jp-DirListing-item") if i.text.split("\n")[0] == name), None)
        if item is None:
            return False
        ActionChains(d).double_click(item).perform()
        return True
    waiter(driver).until(double_click, f"{name} is not in the file browser")


def run_cell(driver, cell):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    driver.execute_script("arguments[0].scrollIntoView()", cell)
    css(cell, ".jp-InputArea-editor")[0].click()
    ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()


def notebook_in_kernel(driver, kernel: str):
    """Wait until the open notebook's kernel `kernel` is idle; fails on a kernel-choice (or any) dialog."""
    status = f"{kernel} | Idle"
    waiter(driver).until(lambda d: css(d, ".jp-Dialog") or any(e.text == status for e in css(d, ".jp-StatusBar-Item")),
                         f"the kernel did not start: no '{status}' in the status bar")
    assert not css(driver, ".jp-Dialog"), f"a dialog opened with the notebook: {css(driver, '.jp-Dialog')[0].text!r}"
    assert css(driver, ".jp-NotebookPanel-toolbar .jp-KernelName")[-1].text == kernel


def code_cell(driver, text: str):
    """The first code cell of the open notebook whose source contains `text`."""
    return waiter(driver).until(lambda d: next((c for c in css(d, ".jp-NotebookPanel:not(.lm-mod-hidden) "
                                                                  ".jp-CodeCell") if text in c.text), False),
                                f"no code cell with {text!r}")


def check_loss_curve(driver, frame, run: str, steps: int, log_every: int, local_url: str):
    """In TensorBoard's page in `frame`: the train/loss card of `run` (e.g. "name/tb") shows its last point, the
    value TensorBoard's own API (at `local_url`) serves, and a curve drawn in the run's colour."""
    from PIL import Image
    from selenium.webdriver.common.keys import Keys

    driver.execute_script("arguments[0].scrollIntoView()", frame)
    driver.switch_to.frame(frame)
    try:
        waiter(driver).until(lambda d: css(d, "input[placeholder='Filter runs (regex)']"),
                             "TensorBoard's page did not load through the proxy")
        css(driver, "input[placeholder='Filter runs (regex)']")[0].send_keys(f"^{run.split('/')[0]}/")
        css(driver, "input[placeholder='Filter tags (regex)']")[0].send_keys("^train/loss$", Keys.ESCAPE)
        card = waiter(driver).until(lambda d: next((c for c in css(d, "scalar-card") if run in c.text), False),
                                    f"no train/loss card of the run {run}")
        assert card.text.replace("\n", "").startswith("train/loss")
        # the data table: the run's last point, the value TensorBoard's own API serves
        row = card.text.split("Relative\n", 1)[1].split("\n")
        assert row[0] == run and int(row[3]) == steps, row
        with urllib.request.urlopen(f"{local_url}data/plugin/scalars/scalars?run={run}&tag=train/loss",
                                    timeout=10) as r:
            points = json.load(r)
        assert [p[1] for p in points] == list(range(log_every, steps + 1, log_every))
        assert float(row[2]) == pytest.approx(points[-1][2], rel=1e-3)
        # the curve: the chart's canvas gets the run's colour along it (2 px x the plot's width), once drawn
        colour = css(card, "tb-data-table span[style*='background-color']")[0].value_of_css_property(
            "background-color")
        rgb = tuple(int(v) for v in colour[colour.index("(") + 1:colour.index(")")].split(",")[:3])

        def curve_pixels(_):
            canvas = Image.open(io.BytesIO(css(card, "canvas")[0].screenshot_as_png)).convert("RGB")
            return sum(1 for px in canvas.get_flattened_data() if sum(abs(a - b) for a, b in zip(px, rgb)) < 30)
        waiter(driver, 30).until(lambda _: curve_pixels(_) > 100, f"no curve in the run's colour {rgb} on the chart")
    finally:
        driver.switch_to.default_content()


def mui_select(driver, current: str, choice: str):
    """Pick `choice` in the Material-UI drop-down that shows `current` (the profiler plugin's menus)."""
    from selenium.webdriver.common.by import By

    menu = waiter(driver).until(lambda d: next((m for m in css(d, "[aria-haspopup=listbox]") if m.text == current),
                                               False), f"no drop-down showing {current!r}")
    menu.click()
    # an option's text reads "" until the menu's opening animation shows it: wait for the choice, not for any option
    option = waiter(driver).until(lambda d: next((o for o in css(d, "li[role=option]") if o.text == choice), False),
                                  f"{choice!r} is never offered in the drop-down showing {current!r}")
    option.click()
    waiter(driver).until(lambda d: not css(d, "li[role=option]"))
    return driver.find_element(By.XPATH, "//main")


@pytest.mark.parametrize("base_url", BASE_URLS, ids=["root", "hub-base-url"])
def test_notebook_00_opens_in_the_workbook_kernel_and_shows_tensorboard(base_url, tiny_run, lab, boards, browser):
    d, server, committed = browser, lab(base_url), NOTEBOOK.read_bytes()
    steps = Steps(d, "root" if base_url == "/" else base_url.strip("/").replace("/", "-"))
    with steps("lab"):
        d.get(f"{server.url}lab?token={server.token}")
        open_in_file_browser(d, "notebooks")

    with steps("notebook-00-in-the-workbook-kernel"):
        open_in_file_browser(d, NOTEBOOK.name)
        notebook_in_kernel(d, server.kernel)  # a missing kernelspec shows a kernel-choice dialog

    with steps("tensorboard-cell"):
        setup, board_cell = code_cell(d, "tl.notebook.setup()"), code_cell(d, "tl.tensorboard.start(")
        run_cell(d, setup)
        waiter(d).until(lambda d: "workbook ready" in setup.text, "the set-up cell printed no banner")
        cfg = tiny_run.wait()  # TensorBoard's page lists the dashboards that have data when it loads
        run_cell(d, board_cell)
        frame = waiter(d).until(lambda d: (css(board_cell, ".jp-OutputArea iframe") or [False])[0],
                                "the TensorBoard cell showed no inline view")
        assert not css(d, ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        board = next((tb for tb in boards.running() if tb.logdir == str(ROOT / "runs")), None)
        assert board, "no TensorBoard on runs/ is running after the cell"
        proxied = f"{base_url}proxy/{board.port}/"  # the page's own server: works behind `ssh -L` and on a hub
        assert frame.get_dom_attribute("src") == proxied
        assert css(board_cell, ".jp-OutputArea a")[0].get_dom_attribute("href") == proxied
        d.switch_to.frame(frame)
        try:
            waiter(d).until(lambda d: css(d, "input[placeholder='Filter runs (regex)']"),
                            "TensorBoard's page did not load through the proxy")
        finally:
            d.switch_to.default_content()
        d.execute_script("arguments[0].scrollIntoView()", board_cell)  # the cell, its link and the view

    with steps("train-loss-curve"):
        check_loss_curve(d, frame, f"{RUN.name}/tb", cfg.steps, cfg.log_every, board.local_url)
    assert NOTEBOOK.read_bytes() == committed, "JupyterLab changed the committed notebook"


def test_profiler_tab_renders_nothing_without_internet(tiny_run, lab, boards, browser):
    """torch-tb-profiler's page loads Google's chart library from www.gstatic.com before it draws any view,
    the Trace view included: offline (a cluster's browser tunnel) every view spins. Notebook 02 says so and
    points to the offline summary (tl.trace_summary.summarize) and Perfetto."""
    import tutorial_lib as tl

    d, server = browser, lab("/")
    steps = Steps(d, "profiler")
    tiny_run.wait()
    board = boards.start(ROOT / "runs")
    profile = f"{RUN.name}/tb/profile"
    views = tl.profiling.profiler_runs(board, wait_for=profile).get(profile, [])
    assert {"Overview", "Trace"} <= set(views), f"the plugin did not read the trace: {views}"  # served fine
    d.get_log("browser")  # drop the messages of earlier pages
    with steps("profiler-tab"):
        d.get(f"{server.url}proxy/{board.port}/?token={server.token}#pytorch_profiler")
        waiter(d).until(lambda d: css(d, "iframe"), "no PyTorch Profiler tab")
        d.switch_to.frame(css(d, "iframe")[0])
    try:
        scripts = [s.get_attribute("src") for s in css(d, "script[src]")]
        assert "https://www.gstatic.com/charts/loader.js" in scripts
        shown = waiter(d).until(lambda d: next((m.text for m in css(d, "[aria-haspopup=listbox]")
                                                if "/tb/profile" in m.text), False), "no run in the Runs menu")
        if shown != profile:
            mui_select(d, shown, profile)
        for view in ("Overview", "Trace"):
            with steps(f"{view.lower()}-view"):
                current = next(m.text for m in css(d, "[aria-haspopup=listbox]") if m.text in views)
                main = mui_select(d, current, view) if current != view else css(d, "main")[0]
                time.sleep(4)  # what a person waits before calling it stuck; it stays so for good
                assert css(main, "[role=progressbar]") and not main.text.strip(), main.text[:200]
                assert not css(main, "iframe, canvas, table, svg:not(.MuiCircularProgress-svg)")
    finally:
        d.switch_to.default_content()
    errors = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert any("www.gstatic.com/charts/loader.js" in e for e in errors), errors
    assert any("google is not defined" in e for e in errors), errors
