"""The shared compile cache (tutorial_lib/compilecache.py, `make warm`: lessons/warm.py): which folder, what a
compiled run does with it, the doctor's line about it, and the first compiled step cold against warm, measured on
the CPU with a small model (the GPU figures: scripts/gpu/compile_cache.sh)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, cli
from tutorial_lib import compilecache, doctor, jobs, sites
from tutorial_lib.config import TrainConfig, UserError
from tutorial_lib.doctor import Context, Options

from test_jobs_05 import write_mnist_files


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No cache chosen by the machine this runs on, and torch's own cache variables restored afterwards."""
    for name in (compilecache.ENV, compilecache.READONLY_ENV, "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORKBOOK_HUB_HOME", str(tmp_path / "hub"))
    return monkeypatch


# ---------------------------------------------------------------------------------------- which folder
def test_the_folder_comes_from_the_variable_then_the_site_then_the_hubs_once_it_exists(clean_env, tmp_path):
    folder, why = compilecache.where()
    assert folder is None and why.startswith("none set ($WORKBOOK_COMPILE_CACHE")
    hub = tmp_path / "hub" / "compile-cache"
    hub.mkdir(parents=True)
    assert compilecache.where() == (hub, "the hub's shared folder")
    assert compilecache.where("/shared/cc", "mysite") == (Path("/shared/cc"), "site profile 'mysite'")
    clean_env.setenv(compilecache.ENV, str(tmp_path / "mine"))
    assert compilecache.where("/shared/cc", "mysite") == (tmp_path / "mine", "$WORKBOOK_COMPILE_CACHE")
    clean_env.setenv(compilecache.ENV, "off")
    assert compilecache.where("/shared/cc", "mysite")[0] is None


def test_a_writable_folder_becomes_torchs_cache_before_anything_compiles(clean_env, tmp_path):
    assert compilecache.use() is None and "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # nothing set: torch's own
    clean_env.setenv(compilecache.ENV, str(tmp_path / "cc"))
    said = compilecache.use()
    assert said == f"compile cache: {tmp_path / 'cc'} ($WORKBOOK_COMPILE_CACHE)"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cc" / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "cc" / "triton")


def test_a_read_only_folder_without_warmed_files_says_the_run_compiles_from_scratch(clean_env, tmp_path):
    clean_env.setenv(compilecache.ENV, str(tmp_path / "cc"))
    clean_env.setenv(compilecache.READONLY_ENV, "1")
    said = compilecache.use()
    assert "read-only" in said and "compiles from scratch" in said and "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_the_manifest_keeps_each_torch_and_device_apart(tmp_path):
    compilecache.record(tmp_path, "optimized", "2.14.1", "NVIDIA H100 80GB HBM3", {"first_step_s": 40.0})
    compilecache.record(tmp_path, "ladder_compile", "2.14.1", "NVIDIA H100 80GB HBM3", {"first_step_s": 30.0})
    compilecache.record(tmp_path, "optimized", "2.11.0", "NVIDIA H200", {"first_step_s": 35.0})
    entries = compilecache.read_manifest(tmp_path)["entries"]
    assert sorted(entries) == ["torch-2.11.0-nvidia_h200", "torch-2.14.1-nvidia_h100_80gb_hbm3"]
    assert sorted(entries["torch-2.14.1-nvidia_h100_80gb_hbm3"]["configs"]) == ["ladder_compile", "optimized"]
    (tmp_path / compilecache.MANIFEST).write_text("[1, 2]")
    with pytest.raises(UserError, match="not a compile cache manifest; delete it and run make warm again"):
        compilecache.read_manifest(tmp_path)


# ---------------------------------------------------------------------------------------- site profiles and jobs
def _site(tmp_path, **values) -> str:
    text = (sites.SITES_DIR / "local.yaml").read_text()
    for key, value in values.items():
        text = "\n".join(line for line in text.splitlines() if not line.startswith(f"{key}:")) + f"\n{key}: {value}\n"
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("key, value, said", [
    ("numa_binding", "nodes", "numa_binding='nodes' is not one of node, socket, exclusive, core-complex"),
    ("cpu_bind", "'cores; rm -rf ~'", "cpu_bind='cores; rm -rf ~': only letters, digits"),
    ("gpu_bind", "'closest &'", "gpu_bind='closest &': only letters"),
    ("compile_cache", "'/a b'", "compile_cache='/a b': only letters, digits, '_', '.', '/', '-' and $VARS")])
def test_bad_binding_or_cache_values_name_the_key_and_the_fix(tmp_path, key, value, said):
    with pytest.raises(UserError, match="site profile .*" + re.escape(said)):
        sites.load_site(_site(tmp_path, **{key: value}))


def test_a_job_exports_the_sites_cache_and_binds_as_the_site_says(tmp_path):
    site = _site(tmp_path, compile_cache="$SCRATCH/compile-cache", cpu_bind="cores", gpu_bind="closest",
                 numa_binding="socket")
    cfg = TrainConfig(parallel="ddp", steps=10)
    text = jobs.render("demo", cfg, site=site, gpus_per_node=2)
    assert 'export WORKBOOK_COMPILE_CACHE="${WORKBOOK_COMPILE_CACHE:-$SCRATCH/compile-cache}"' in text
    assert "if flag=$(python -m tutorial_lib.numa --torchrun-flag socket); then" in text
    assert ('srun --ntasks=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" --cpu-bind=cores --kill-on-bad-exit=1 \\\n'
            '    python -m tutorial_lib.launcher --standalone --nproc_per_node=2 ${numa_binding[@]+"${numa_binding[@]}"} '
            '"${program[@]}"') in text
    text = jobs.render("demo", cfg, site=site, gpus_per_node=2, mode="srun")
    assert "--cpu-bind=cores --gpu-bind=closest --kill-on-bad-exit=1" in text and "numa_binding" not in text
    text = jobs.render("demo", cfg, site="generic", gpus_per_node=2, nodes=2)  # the default: torchrun's, no srun's
    assert '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \\\n        ${numa_binding[@]+"${numa_binding[@]}"} "${program[@]}"' \
        in text and "--cpu-bind" not in text and "--gpu-bind" not in text  # the binding's words just before the program
    assert "WORKBOOK_COMPILE_CACHE" not in text


def test_torchruns_binding_is_off_with_the_reason_where_the_node_cant_bind(monkeypatch, capsys):
    from tutorial_lib import numa

    monkeypatch.setattr(numa.shutil, "which", lambda name: None)
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    flag, why = numa.torchrun_binding("node")  # neither torch's binding (no numactl) nor the workbook's (no topology)
    assert flag is None and "no numactl on this node" in why and "GPU 0 is not in this node's topology" in why
    monkeypatch.setattr(numa.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert numa.main(["--torchrun-flag", "node"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "CPU binding: off: no GPU visible here: nothing to bind to\n"
    assert numa.main(["--torchrun-flag", "nodes"]) == 2


def test_a_node_without_gpu_devices_answers_before_importing_torch(tmp_path):
    """The job's binding question on a node with no GPU device file and no nvidia-smi: the same line, and torch
    is never imported (each job's start would pay its 3.5 s and 650 MB for nothing)."""
    code = ("import sys; from pathlib import Path; from tutorial_lib import numa; numa.DEV = Path(sys.argv[1]); "
            "numa.shutil.which = lambda name: None; rc = numa.main(['--torchrun-flag', 'node']); "
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False"] and "CPU binding: off: no GPU visible here" in out.stderr
    (tmp_path / "nvidia0").touch()  # a device file: torch is asked
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.split()[1] == "True"


# ---------------------------------------------------------------------------------------- the doctor's line
def _doctor_line(tmp_path, monkeypatch, gpus, torch_version="2.14.1"):
    monkeypatch.setenv(compilecache.ENV, str(tmp_path / "cc"))
    ctx = Context(Options(site="local"))
    ctx.__dict__["torch"] = {"torch": torch_version, "gpus": [[g, 80.0] for g in gpus]}  # the probe's answer
    return doctor.check_compile_cache(ctx)


def test_the_doctor_warns_on_a_gpu_node_without_a_warmed_cache(tmp_path, monkeypatch):
    line = _doctor_line(tmp_path, monkeypatch, ["NVIDIA H100 80GB HBM3"])
    assert line.status == "WARN" and "does not exist" in line.message and "make warm" in line.fix
    line = _doctor_line(tmp_path, monkeypatch, [])
    assert line.status == "SKIP" and "no GPU here" in line.message
    compilecache.record(tmp_path / "cc", "optimized", "2.11.0", "NVIDIA H100 80GB HBM3", {"first_step_s": 40.0})
    line = _doctor_line(tmp_path, monkeypatch, ["NVIDIA H100 80GB HBM3"])
    assert line.status == "WARN" and "nothing for torch 2.14.1 on NVIDIA H100 80GB HBM3" in line.message
    (tmp_path / "cc" / "inductor").mkdir()
    (tmp_path / "cc" / "inductor" / "kernel.so").write_bytes(b"x" * 3 * 2**20)
    compilecache.record(tmp_path / "cc", "optimized", "2.14.1", "NVIDIA H100 80GB HBM3", {"first_step_s": 40.0})
    line = _doctor_line(tmp_path, monkeypatch, ["NVIDIA H100 80GB HBM3"])
    assert line.status == "PASS", line.message
    assert "3.0 MiB" in line.message and "torch 2.14.1 on NVIDIA H100 80GB HBM3: 1 configuration warmed" in line.message


# ---------------------------------------------------------------------------------------- warm, the CLI
def test_warm_refuses_what_it_cant_do_before_compiling_anything(tmp_path):
    p = cli("warm", "--reference")
    assert p.returncode == 2 and "--reference goes with --measure" in p.stderr
    out = ("--out", str(tmp_path / "runs"))
    p = cli("warm", "--list", "--cache", str(tmp_path / "cc"), "--only", "nope", *out)
    assert p.returncode == 2 and "--only 'nope' is not a configuration make warm compiles; they are optimized," in p.stderr
    p = cli("warm", "--list", "--cache", str(tmp_path / "cc"), *out)
    assert p.returncode == 0 and f"compile cache: {tmp_path / 'cc'}" in p.stdout
    assert "  optimized: " in p.stdout and "  ladder_compile: " in p.stdout and "  ladder_step_graph: " in p.stdout
    import torch

    if not torch.cuda.is_available():
        p = cli("warm", "--cache", str(tmp_path / "cc"), *out)
        assert p.returncode == 2 and "no CUDA GPU here" in p.stderr and "make warm on a node" in p.stderr


def test_the_first_compiled_step_is_faster_warm_than_cold(tmp_path, monkeypatch):
    """warm.measure with a small model on the CPU: a cold and a warm process; then the folder as a read-only copy,
    whose mega-cache file a fresh process loads into its own caches (a learner on the hub). The cold process is the
    only full compile (its C++ kernels: about a minute of a 2-core CPU); `warm --measure` also trains read-only."""
    from tutorial_lib.lessons import warm

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = TrainConfig(model="mnist_cnn", dataset="mnist", batch_size=8, train_size=64, num_workers=0, device="cpu",
                      compile=True, data_dir=str(write_mnist_files(tmp_path / "data")))
    out = tmp_path / "measure"
    figures = warm.measure(warm.short(cfg, out, "measure"), out, ways=("cold", "warm"))
    assert json.loads((out / "measure.json").read_text()) == figures and "read_only_first_step_s" not in figures
    cold, warmed = figures["cold_first_step_s"], figures["warm_first_step_s"]
    assert cold > 3 * warmed, figures  # the C++ kernels and the graphs come from the folder the cold run filled
    assert figures["device"].startswith("CPU") and figures["cold_over_warm"] == pytest.approx(cold / warmed)
    shared = out / "shared_cache"
    manifest = compilecache.read_manifest(shared)["entries"]
    entry = next(iter(manifest.values()))
    assert entry["device"] == "cpu" and set(entry["configs"]) == {"measure"}
    assert list((shared / "megacache").glob("*/measure.bin"))
    own = tmp_path / "own_cache"
    p = subprocess.run([sys.executable, "-c", "from tutorial_lib import compilecache; print(compilecache.use())"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, compilecache.ENV: str(shared), compilecache.READONLY_ENV: "1",
                            "TORCHINDUCTOR_CACHE_DIR": str(own / "inductor")})
    said = p.stdout.strip()
    assert p.returncode == 0 and "read-only" in said and said.endswith("of 1 warmed runs loaded"), p.stderr[-2000:]
    assert int(said.split(": ")[-1].split()[0]) > 0, said  # artifacts loaded into this process's own caches
