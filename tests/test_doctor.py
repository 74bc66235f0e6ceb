"""The workshop pre-flight (`python -m tutorial_lib doctor`): passes here, and names the fault when one is injected.

Faults are injected through the doctor's Options (a site profile file, the /dev/shm minimum, the data folder,
the proxy module, the kernel search path), never by patching its functions.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli
from tutorial_lib import doctor, jobs, sitecheck, sites
from tutorial_lib.doctor import Context, Options

slurm_up = pytest.mark.skipif(not jobs.slurm_available(), reason="no local Slurm (make slurm-up, as root)")


def status(check) -> str:
    return f"{check.status}: {check.message} | {check.fix}"


# ---------------------------------------------------------------------------------------- the whole run
@pytest.mark.slurm
@slurm_up
@pytest.mark.parametrize("faults, code", [([], 0), (["--need", "cifar10", "--shm-min-mib", "100000000"], 1)],
                         ids=["clean", "faults"])
def test_json_holds_every_check_and_the_exit_code_says_fail(tmp_path, faults, code):
    empty = tmp_path / "data"
    empty.mkdir()
    p = cli("doctor", "--json", "--site", "local", "--data-dir", str(empty), *faults, timeout=240)
    assert p.returncode == code, p.stdout + p.stderr
    report = json.loads(p.stdout)
    names = [c["name"] for c in report["checks"]]
    assert names == [f.__name__.removeprefix("check_") for f in doctor.CHECKS]
    by = {c["name"]: c for c in report["checks"]}
    for name in ("python", "packages", "shm", "disk", "slurm", "partition", "sbatch", "time", "proxy"):
        assert by[name]["status"] in (("PASS",) if not faults or name != "shm" else ("FAIL",)), by[name]
    if shutil.which("nvidia-smi") is None:
        assert by["gpus"]["status"] == "WARN" and "no GPU visible" in by["gpus"]["message"]
        assert {by[n]["status"] for n in ("driver", "bf16", "nccl")} == {"SKIP"}
    assert report["ok"] is (code == 0)
    assert report["collect_env"]["fields"]["torch_version"] and "PyTorch version:" in report["collect_env"]["text"]
    if faults:
        assert by["datasets"]["status"] == "FAIL" and "cifar10 missing" in by["datasets"]["message"]
        assert report["counts"]["FAIL"] == 2


def test_table_has_one_line_per_check_its_detail_and_fix_below_it_when_verbose():
    checks = [doctor.Check("a", "PASS", "fine", detail="x 1\ny 2"), doctor.Check("bb", "FAIL", "broken", "do this")]
    lines = doctor.Report(checks).table().splitlines()
    assert lines == ["PASS  a   fine", "FAIL  bb  broken; fix: do this", "1 PASS, 1 FAIL: NOT ready (fix the FAIL lines)"]
    lines = doctor.Report(checks).table(verbose=True).splitlines()
    assert [x.split() for x in lines[1:5]] == [["x", "1"], ["y", "2"], ["FAIL", "bb", "broken"], ["fix:", "do", "this"]]


def test_the_package_line_is_one_line_and_its_list_is_in_the_detail(monkeypatch, tmp_path):
    """00's line read 'WARN packages 71 missing, 36 differ from requirements.lock: missing aiodns, alembic, ...'."""
    lock = tmp_path / "requirements.lock"
    lock.write_text("# Python 3.11\nno-such-package-a==1.0\nno-such-package-b==2.0\npytest==0.0.1\n")
    monkeypatch.setattr(doctor, "LOCK", lock)
    got = doctor.check_packages(None)
    assert got.status == "WARN" and got.message == ("2 missing, 1 differ from requirements.lock "
                                                    "(doctor --verbose lists them)")
    assert "missing: no-such-package-a, no-such-package-b" in got.detail and "differs: pytest" in got.detail
    assert "no-such-package" not in doctor.Report([got]).table()
    assert "no-such-package-a" in doctor.Report([got]).table(verbose=True) and '"detail"' in doctor.Report([got]).to_json()


def test_torchs_collect_env_report_comes_in_the_json_only(monkeypatch, capsys):
    """torch.utils.collect_env takes seconds: --json carries it, the table (the default) never waits for it."""
    import torch

    asked = []
    monkeypatch.setattr(doctor, "run", lambda options, show, **kw: doctor.Report([doctor.Check("a", "PASS", "ok")]))
    monkeypatch.setattr(doctor, "collect_env", lambda timeout: asked.append(timeout) or {"fields": {}, "text": "t"})
    assert doctor.cli([]) == 0 and asked == [] and "collect_env" not in capsys.readouterr().out
    assert doctor.cli(["--json", "--timeout", "5"]) == 0 and asked == [120]
    assert json.loads(capsys.readouterr().out)["collect_env"] == {"fields": {}, "text": "t"}
    monkeypatch.undo()
    got = doctor.collect_env(timeout=240)  # the real report, from a subprocess
    assert got["fields"]["torch_version"] == torch.__version__, got
    assert f"PyTorch version: {torch.__version__}" in got["text"]
    monkeypatch.setattr(doctor, "COLLECT_ENV", "import sys; sys.exit('No module named torch')")
    assert doctor.collect_env(timeout=60) == {"error": "torch.utils.collect_env failed (exit 1): No module named torch"}


def test_bad_site_is_an_error_not_a_check():
    p = cli("doctor", "--site", "no-such-site")
    assert p.returncode == 2 and "site 'no-such-site' has no profile" in p.stderr


# ---------------------------------------------------------------------------------------- injected faults
@pytest.mark.slurm
@slurm_up
def test_wrong_partition_fails_with_the_cluster_partitions(tmp_path):
    site = tmp_path / "wrong.yaml"
    site.write_text((sites.SITES_DIR / "local.yaml").read_text().replace("partition: debug", "partition: nope"))
    ctx = Context(Options(site=str(site)))
    part = sitecheck.check_partition(ctx)
    assert part.status == "FAIL" and "'nope'" in part.message and "debug" in part.message, status(part)
    sbatch = sitecheck.check_sbatch(ctx)
    assert sbatch.status == "FAIL" and "partition" in sbatch.message.lower(), status(sbatch)


@pytest.mark.slurm
@slurm_up
def test_unknown_reservation_is_refused_by_sbatch_test_only():
    check = sitecheck.check_sbatch(Context(Options(site="local", reservation="no_such_workshop")))
    assert check.status == "FAIL" and "reservation" in check.message, status(check)


def test_a_controller_that_is_down_is_named_not_its_banner(monkeypatch):
    """scontrol ping prints its news between lines of asterisks; the check showed the last line: '(*****)'."""
    out = "Slurmctld(primary) at vm is DOWN\n" + "*" * 41 + "\n** RESTORE SLURMCTLD DAEMON TO SERVICE **\n" + "*" * 41
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(sitecheck, "run_command", lambda cmd, timeout, cwd=None: (1, out))
    said = Context(Options()).slurm
    assert said == "the Slurm controller does not answer (Slurmctld(primary) at vm is DOWN)", said
    assert sitecheck.first_words("") == "no output"


@pytest.mark.parametrize("minimum, expected", [(1, "PASS"), (10**9, "FAIL")])
def test_shm_below_the_minimum_fails(minimum, expected):
    check = doctor.check_shm(Context(Options(shm_min_mib=minimum)))
    assert check.status == expected, status(check)
    if expected == "FAIL":
        assert "shm-size" in check.fix


def test_missing_shm_folder_warns(tmp_path):
    check = doctor.check_shm(Context(Options(shm_path=str(tmp_path / "no-shm"))))
    assert check.status == "WARN" and "num_workers=0" in check.fix


@pytest.mark.parametrize("staged, expected", [(False, "FAIL"), (True, "PASS")])
def test_needed_dataset_missing_fails_with_the_fetch_command(tmp_path, staged, expected):
    if staged:
        (tmp_path / "cifar-10-batches-py").mkdir()
        (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"x")
    check = doctor.check_datasets(Context(Options(data_dir=str(tmp_path), need=("cifar10",))))
    assert check.status == expected, status(check)
    if expected == "FAIL":
        assert "cifar10 missing" in check.message and "data fetch cifar10" in check.fix
    else:
        assert "cifar10 staged" in check.message


def test_disk_minimums_fail_when_not_met(tmp_path):
    assert doctor.check_disk(Context(Options(data_dir=str(tmp_path), min_free_gib=0.001))).status == "PASS"
    check = doctor.check_disk(Context(Options(data_dir=str(tmp_path), min_free_gib=1e9)))
    assert check.status == "FAIL" and "free space" in check.fix


@pytest.mark.parametrize("module, expected", [("jupyter_server_proxy", "PASS"), ("no_such_proxy_module", "FAIL")])
def test_proxy_module_missing_in_the_server_python_fails(module, expected):
    check = sitecheck.check_proxy(Context(Options(proxy_module=module, server_python=sys.executable)))
    assert check.status == expected, status(check)
    assert "the given server Python" in check.message


def test_python_line_names_an_environment_outside_the_workbook_by_its_path(monkeypatch):
    """A site's environment (/opt/torch/.venv on a GPU node) was shown as '.venv', which reads as the workbook's own."""
    monkeypatch.setattr(sys, "prefix", "/opt/torch/.venv")
    assert "in the environment /opt/torch/.venv" in doctor.check_python(Context(Options())).message
    monkeypatch.setattr(sys, "prefix", str(ROOT / ".venv"))
    assert "in the environment .venv" in doctor.check_python(Context(Options())).message


def test_proxy_module_missing_without_a_server_to_ask_warns(tmp_path, monkeypatch):
    """A GPU node with no Jupyter server (a terminal, a notebook run headless) only shows this environment's Python,
    which need not be the hub's servers': a WARN that says so, not a FAIL that marks the node NOT ready."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("JPY_PARENT_PID", raising=False)
    check = sitecheck.check_proxy(Context(Options(proxy_module="no_such_proxy_module")))
    assert check.status == "WARN", status(check)
    assert "is not importable in this environment (" in check.message and ") (" not in check.message
    assert "no running Jupyter server was found" in check.message
    found = sitecheck.check_proxy(Context(Options(proxy_module="json")))
    assert found.status == "PASS" and found.message.endswith("in this environment (no running Jupyter server found)")


def _kernel(root: Path, python: str) -> None:
    folder = root / "kernels" / "hpc-workbook"
    folder.mkdir(parents=True)
    spec = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python (HPC workbook)", "language": "python"}
    (folder / "kernel.json").write_text(json.dumps(spec))


@pytest.mark.parametrize("python, expected", [(sys.executable, "PASS"), ("/nonexistent/bin/python", "FAIL"),
                                              (None, "WARN")])
def test_kernel_must_run_this_environment(tmp_path, monkeypatch, python, expected):
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "no-user-kernels"))
    if python:
        _kernel(tmp_path, python)
    check = doctor.check_kernel(Context(Options(kernel="hpc-workbook")))
    if python is None and check.status != "WARN":
        pytest.skip("a system-wide hpc-workbook kernel is registered on this machine")
    assert check.status == expected, status(check)


# ---------------------------------------------------------------------------------------- GPU checks, given facts
def gpu_context(**torch_facts) -> Context:
    ctx = Context(Options())
    ctx.torch = {"torch": "2.14.1+cu130", "cuda": "13.0", "available": True, "gpus": [["NVIDIA H100", 79.2]],
                 "bf16": True, "nccl": True, **torch_facts}
    ctx.smi = {"gpus": [("NVIDIA H100", 79.6)], "driver": "580.82.07", "mig": []}
    return ctx


def test_driver_older_than_torch_cuda_fails():
    ctx = gpu_context(available=False, gpus=[])
    ctx.smi = {"gpus": [("NVIDIA H100", 79.6)], "driver": "535.104.05", "mig": []}
    assert doctor.check_gpus(ctx).status == "FAIL"
    check = doctor.check_driver(ctx)
    assert check.status == "FAIL" and "535.104.05 is older than 580.65" in check.message, status(check)
    assert doctor.check_driver(gpu_context()).status == "PASS"


def test_gpu_line_names_the_card_memory_and_mig_slices():
    ctx = gpu_context()
    ctx.smi = {"gpus": [("NVIDIA H100", 79.6)], "driver": "580.82.07", "mig": ["3g.40gb", "3g.40gb"]}
    check = doctor.check_gpus(ctx)
    assert check.status == "PASS" and "1 GPU: NVIDIA H100, 79.2 GiB each; MIG slices: 3g.40gb" in check.message
    assert doctor.check_nccl(ctx).status == "SKIP"  # one GPU: no all-reduce
    assert doctor.check_bf16(gpu_context(bf16=False)).status == "WARN"


def test_allreduce_probe_is_correct_over_two_processes():
    # the NCCL check's probe, with gloo on the CPU: two real processes and a checked sum
    ok, text = doctor.allreduce("gloo", 2, timeout=120)
    assert ok, text
    assert text.startswith("all-reduce over 2 gloo ranks correct") and "GB/s" in text
    assert "bus bandwidth" in text and "as nccl-tests reports it" in text  # the card's figure (tutorial_lib/busbw.py)


# ---------------------------------------------------------------------------------------- a real Jupyter server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_proxy_and_tensorboard_link_through_the_running_server(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    jupyter = Path(sys.executable).parent / "jupyter"
    server = subprocess.Popen([str(jupyter), "server", "--no-browser", "--allow-root", f"--port={_free_port()}",
                               "--IdentityProvider.token=doctor-test", f"--ServerApp.root_dir={ROOT}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        deadline = time.time() + 60
        while not list((tmp_path / "runtime").glob("jpserver-*.json")) and time.time() < deadline:
            time.sleep(0.3)
        monkeypatch.setenv("JPY_PARENT_PID", str(server.pid))  # as in a kernel this server started
        ctx = Context(Options())
        proxy = sitecheck.check_proxy(ctx)
        assert proxy.status == "PASS" and "serving this kernel" in proxy.message, status(proxy)
        board = sitecheck.check_tensorboard(ctx)
        assert board.status == "PASS" and "/proxy/" in board.message, status(board)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_without_a_server_the_link_check_says_what_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    check = sitecheck.check_tensorboard(Context(Options()))
    assert check.status == "SKIP" and "make lab" in check.message


# ---------------------------------------------------------------------------------------- the instructor's guide
def test_makefile_has_a_handout_target_that_converts_to_html():
    p = subprocess.run(["make", "-n", "handout"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "nbconvert --to html" in p.stdout and "build/handout" in p.stdout


def test_instructor_guide_is_current_with_the_timings_and_reference_files():
    p = subprocess.run([sys.executable, "scripts/instructor_figures.py", "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_workshop_jobs_are_every_job_rendered_for_the_site_account_and_reservation(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import workshop_jobs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    paths = workshop_jobs.render_all("generic", tmp_path, account="proj42", reservation="hpc_ws")
    assert [p.name for p in paths] == sorted(p.name for p in jobs.JOBS_DIR.glob("*.sbatch"))
    for path in paths:
        text = path.read_text()
        assert "#SBATCH --account=proj42" in text and "#SBATCH --reservation=hpc_ws" in text
        assert jobs.rerender(path) == text  # its header's record makes the same file again


def test_stored_timings_of_a_committed_notebook_feed_the_timing_plan(tmp_path):
    p = subprocess.run([sys.executable, "scripts/run_notebooks.py", "--stored", "--timings", str(tmp_path / "t.json"),
                        "notebooks/00_setup.ipynb"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    run = json.loads((tmp_path / "t.json").read_text())["notebooks"]["00_setup"]
    assert run["seconds"] > 0 and run["machine"] == "the committed CPU run" and run["load"] is None
    assert run["code_cells"] >= 10 and len(run["slowest"]) == 4
    assert run["slowest"][0][1] >= run["slowest"][-1][1]  # slowest first


def test_keep_going_lists_every_failed_cell_of_an_executed_notebook(tmp_path):
    import nbformat

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import run_notebooks
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_markdown_cell("text")])
    for i, (name, value) in enumerate([("KeyError", "'dp_4gpu'"), ("ZeroDivisionError", "division by zero")]):
        cell = nbformat.v4.new_code_cell("...")
        cell.outputs = [nbformat.v4.new_output("error", ename=name, evalue=value, traceback=[])]
        nb.cells.append(cell)
    nbformat.write(nb, tmp_path / "done.ipynb")
    assert run_notebooks.cell_errors(tmp_path / "done.ipynb") == [
        "cell 2: KeyError: 'dp_4gpu'", "cell 3: ZeroDivisionError: division by zero"]
    nb.cells = nb.cells[:2]
    nbformat.write(nb, tmp_path / "clean.ipynb")
    assert run_notebooks.cell_errors(tmp_path / "clean.ipynb") == []


def test_the_environment_report_says_shapes_is_generated_and_names_each_staged_dataset(tmp_path, capsys):
    from tutorial_lib import report

    r = report.env_report(data_dir=str(tmp_path))
    report.print_report(r)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("datasets: "))
    assert line.startswith("datasets: shapes (generated in memory, nothing to stage), cifar10 missing"), line
