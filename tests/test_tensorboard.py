"""TensorBoard from a cell: 127.0.0.1 only, reuse of a live instance, stale records ignored, the proxy link."""
import http.server
import json
import os
import socket
import threading
import urllib.request

import pytest

from tutorial_lib import tensorboard


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard, "STATE", tmp_path / "state.json")
    yield tmp_path
    tensorboard.stop()


def write_scalars(logdir):
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(logdir / "run1" / "tb")) as w:
        for i in range(3):
            w.add_scalar("train/loss", 1.0 / (i + 1), i)


def test_start_lists_runs_reuses_and_stops(state, tmp_path):
    logdir = tmp_path / "runs"
    write_scalars(logdir)
    tb = tensorboard.start(logdir)
    assert tb.alive()
    with urllib.request.urlopen(tb.local_url + "data/runs", timeout=10) as r:
        assert "run1/tb" in json.load(r)
    assert tensorboard.start(logdir).pid == tb.pid  # reused, not a second server
    # bound to loopback only: the port is not reachable on another local address
    ip = socket.gethostbyname(socket.gethostname())
    if not ip.startswith("127."):
        with pytest.raises(OSError):
            socket.create_connection((ip, tb.port), timeout=2)
    assert tensorboard.stop(tb) == 1
    assert tensorboard.running() == []


def test_stale_record_is_ignored(state, tmp_path):
    dead = tensorboard.TensorBoard(pid=2**22 + 12345, port=1, logdir=str((tmp_path / "runs").resolve()))
    tensorboard._save([dead])
    tb = tensorboard.start(tmp_path / "runs")
    assert tb.pid != dead.pid and tb.alive()
    assert [r.pid for r in tensorboard.running()] == [tb.pid]


def test_a_tensorboard_a_test_run_started_is_stopped_when_the_run_ends(tmp_path):
    """The root conftest.py stops every TensorBoard the session started (tests and notebook kernels)."""
    import subprocess
    import sys
    import time

    if os.environ.get("TB_CHILD_LOGDIR"):  # inside the pytest run started below
        print("pid", tensorboard.start(os.environ["TB_CHILD_LOGDIR"]).pid)
        return
    env = {**os.environ, "TB_CHILD_LOGDIR": str(tmp_path / "runs"), "WORKBOOK_STATE_DIR": str(tmp_path / "state")}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                        f"{__file__}::test_a_tensorboard_a_test_run_started_is_stopped_when_the_run_ends"],
                       capture_output=True, text=True, env=env, cwd=os.path.dirname(os.path.dirname(__file__)),
                       timeout=300)
    assert p.returncode == 0, p.stdout[-2000:]
    pid = int(p.stdout.split("pid ", 1)[1].split()[0])
    with pytest.raises(ProcessLookupError):  # gone: no orphan process group left behind
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_jupyterhub_link_goes_through_the_proxy(monkeypatch):
    tb = tensorboard.TensorBoard(pid=1, port=6006, logdir="/x")
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    monkeypatch.delenv("JPY_PARENT_PID", raising=False)  # a headless kernel: no Jupyter server to go through
    assert tb.url == "http://127.0.0.1:6006/"
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/ada/")
    assert tb.url == "/user/ada/proxy/6006/"
    assert 'src="/user/ada/proxy/6006/"' in tb._repr_html_()


@pytest.mark.parametrize("status, has_proxy", [(302, True), (404, False)])
def test_local_jupyter_link_goes_through_its_proxy_when_it_has_one(status, has_proxy, tmp_path, monkeypatch):
    """Under `make lab` (maybe behind `ssh -L`) the kernel's parent server decides: proxy route or not."""
    asked = []

    class Server(http.server.BaseHTTPRequestHandler):  # answers as jupyter_server does, with or without the proxy
        def do_GET(self):
            asked.append(self.path)
            self.send_response(status)
            self.send_header("Location", "/user/alice/login")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}/user/alice/"
        (tmp_path / "jpserver-4242.json").write_text(json.dumps({"url": url, "base_url": "/user/alice/", "sock": ""}))
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
        monkeypatch.setenv("JPY_PARENT_PID", "4242")
        monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
        tensorboard._serves_proxy.cache_clear()
        tb = tensorboard.TensorBoard(pid=1, port=6006, logdir="/x")
        assert tb.url == ("/user/alice/proxy/6006/" if has_proxy else "http://127.0.0.1:6006/")
        assert asked == ["/user/alice/proxy/1"]
        assert tb.url and len(asked) == 1  # asked once per server, not at every display
    finally:
        httpd.shutdown()
        httpd.server_close()
        tensorboard._serves_proxy.cache_clear()
