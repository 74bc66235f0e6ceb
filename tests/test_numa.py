"""The doctor's `numa` line (tutorial_lib/numa.py): each GPU's NUMA node and nearby CPUs read from `nvidia-smi topo
-m` (a fixture from a 4-GPU, 2-socket node) or /sys, this process's CPUs against its GPU's, and a warning when
they are far apart or unbound."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT
from tutorial_lib import doctor, numa

TOPO = (ROOT / "tests" / "fixtures" / "nvidia_smi_topo_4gpu_2numa.txt").read_text()
NODE0, NODE1 = numa.cpu_list("0-47,96-143"), numa.cpu_list("48-95,144-191")


def test_topo_gives_each_gpus_numa_node_and_cpus():
    places = numa.from_topo(TOPO)
    assert [(p.gpu, p.numa_node) for p in places] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert places[2].cpus == NODE1 and len(places[0].cpus) == 96
    assert numa.from_topo(TOPO.strip()) == places  # as sitecheck.run_command returns it: the header is no GPU row
    assert numa.from_topo("nvidia-smi: command failed\n") == []


@pytest.mark.parametrize("mine,gpu,status,said", [
    (NODE1, 2, "PASS", "all on GPU 2's NUMA node 1"),
    (numa.cpu_list("48-59"), 3, "PASS", "all on GPU 3's NUMA node 1"),  # a share of the node: srun --cpu-bind
    (NODE0, 3, "WARN", "96 of its CPUs are far from GPU 3 (NUMA node 1)"),
    (NODE0 | NODE1, 0, "WARN", "not bound (it may run on any CPU, 96 of them far from GPU 0)")])
def test_the_binding_is_judged_against_the_gpus_numa_node(mine, gpu, status, said):
    got, message, fix = numa.verdict(numa.from_topo(TOPO), mine, gpu, environ={"SLURM_CPU_BIND_TYPE": "mask_cpu:"})
    assert got == status and said in message and "binding SLURM_CPU_BIND_TYPE=mask_cpu:" in message
    assert "GPU 2: NUMA node 1, CPUs 48-95,144-191" in message
    assert ("--cpu-bind" in fix) == (status == "WARN")


def test_one_numa_node_needs_no_binding():
    places = [numa.GpuPlace(0, 0, numa.cpu_list("0-7")), numa.GpuPlace(1, 0, numa.cpu_list("0-7"))]
    assert numa.verdict(places, numa.cpu_list("0-7"), 1, environ={})[0] == "PASS"
    assert numa.verdict([], numa.cpu_list("0-7"), 0, environ={})[0] == "SKIP"


def test_sysfs_gives_the_same_places_from_the_gpus_bus_ids(tmp_path):
    for bus, node, cpus in (("0000:18:00.0", "0", "0-47,96-143"), ("0000:9a:00.0", "1", "48-95,144-191")):
        device = tmp_path / "bus" / "pci" / "devices" / bus
        device.mkdir(parents=True)
        (device / "numa_node").write_text(node + "\n")
        (device / "local_cpulist").write_text(cpus + "\n")
    places = numa.from_sysfs(["00000000:18:00.0", "00000000:9A:00.0", "00000000:FF:00.0"], tmp_path)
    assert [(p.gpu, p.numa_node, p.cpus == c) for p, c in zip(places, (NODE0, NODE1))] == [(0, 0, True), (1, 1, True)]


@pytest.mark.parametrize("environ,gpu", [({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "2,3"}, 3),
                                         ({"SLURM_LOCALID": "0", "CUDA_VISIBLE_DEVICES": "1"}, 1),
                                         ({"LOCAL_RANK": "2"}, 2), ({"CUDA_VISIBLE_DEVICES": "GPU-8c1e"}, None)])
def test_a_rank_finds_its_gpu_from_its_local_rank(environ, gpu):
    assert numa.my_gpu(environ) == gpu


def test_the_doctor_reports_the_numa_line_from_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint(open({str(ROOT / 'tests/fixtures/nvidia_smi_topo_4gpu_2numa.txt')!r}).read())\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(NODE0), raising=False)
    check = numa.check_numa(SimpleNamespace(opts=doctor.Options()))
    assert (check.name, check.status) == ("numa", "WARN") and "far from GPU 2 (NUMA node 1)" in check.message
    assert numa.check_numa in doctor.CHECKS


BOTH_CPUS = pytest.mark.skipif(not {0, 1} <= set(os.sched_getaffinity(0)), reason="needs CPUs 0 and 1 to bind between")
TWO_NODES = "GPU0\t X \tSYS\t0\t0\nGPU1\tSYS\t X \t1\t1\n"  # GPU 0 near CPU 0 (node 0), GPU 1 near CPU 1
PRINT_AFFINITY = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]


def fake_nvidia_smi(tmp_path, topo_rows: str) -> dict:
    """This environment with an nvidia-smi first on PATH that prints a two-GPU `topo -m` of the rows given (each
    GPU's line after the header), and no CUDA_VISIBLE_DEVICES."""
    topo = tmp_path / "topo.txt"
    topo.write_text("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n" + topo_rows)
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!{sys.executable}\nprint(open({str(topo)!r}).read())\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def exec_bound(tmp_path, topo_rows: str, flags=(), **environ):
    """`python -m tutorial_lib.numa --exec-bound [flags] python -c <print its CPUs>` under fake_nvidia_smi, as local
    rank 1 of the environ given."""
    env = {**fake_nvidia_smi(tmp_path, topo_rows), "LOCAL_RANK": "1", "RANK": "1", **environ}
    return subprocess.run([sys.executable, "-m", "tutorial_lib.numa", "--exec-bound", *flags, *PRINT_AFFINITY],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


@BOTH_CPUS
def test_exec_bound_pins_a_rank_to_its_gpus_cpus_then_runs_the_command(tmp_path):
    """The binding by hand (no numactl): GPU 1 sits on NUMA node 1 with CPU 1, so rank LOCAL_RANK=1 runs on CPU 1."""
    p = exec_bound(tmp_path, TWO_NODES)
    assert p.returncode == 0 and p.stdout == "[1]\n", p.stderr
    assert "CPU binding: rank 1: GPU 1, CPUs 1 (NUMA node 1)" in p.stderr


def test_exclusive_gives_each_rank_its_own_share_of_its_numa_nodes_cpus():
    """One NUMA node for four GPUs (every lent 4-GPU node so far): binding to the node changes nothing, so each
    rank gets a contiguous quarter; on two nodes the GPUs of one node split that node's CPUs only."""
    cpus = numa.cpu_list("0-63")
    parts = [numa.share(cpus, [0, 1, 2, 3], g) for g in range(4)]
    assert [numa._ranges(p) for p in parts] == ["0-15", "16-31", "32-47", "48-63"]
    assert frozenset().union(*parts) == cpus and sum(map(len, parts)) == 64  # disjoint, nothing left out
    assert numa._ranges(numa.share(numa.cpu_list("0-9"), [0, 1, 2], 2)) == "6-9"  # as even as 10 / 3 allows
    assert numa.share(NODE1, [2, 3], 3) == frozenset(sorted(NODE1)[48:])  # the fixture's node 1: GPUs 2 and 3
    assert numa.share(cpus, [], 1) == cpus  # a rank alone on its node keeps all of it


@BOTH_CPUS
def test_exec_bound_exclusive_pins_each_local_rank_to_its_share(tmp_path):
    both = "GPU0\t X \tNV18\t0-1\t0\nGPU1\tNV18\t X \t0-1\t0\n"  # one NUMA node, CPUs 0-1, for both GPUs
    p = exec_bound(tmp_path, both, ["--exclusive"], LOCAL_WORLD_SIZE="2")
    assert p.returncode == 0 and p.stdout == "[1]\n", p.stderr  # rank 1 of 2 on one node of CPUs 0-1: CPU 1
    assert "CPU binding: rank 1: GPU 1, CPUs 1 (NUMA node 0, its share)" in p.stderr
    p = subprocess.run([sys.executable, "-m", "tutorial_lib.numa", "--exec-bound", "--exclusive"], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and "--exec-bound [--exclusive] COMMAND" in p.stderr  # no command: the usage


def test_places_prints_each_gpus_numa_node_and_cpus_as_json(monkeypatch, capsys):
    """`python -m tutorial_lib.numa --places`: what the study `cluster` records of the node."""
    import json

    monkeypatch.setattr(numa, "gpu_places", lambda timeout: [numa.GpuPlace(0, 0, frozenset({0, 1, 2, 5})),
                                                             numa.GpuPlace(1, None, frozenset())])
    assert numa.main(["--places"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"gpu": 0, "numa_node": 0, "cpus": "0-2,5"},
                                                   {"gpu": 1, "numa_node": None, "cpus": "none"}]


def test_torchrun_command_runs_each_rank_through_the_binder(tmp_path):
    """The study `cluster`'s bound DDP run: launcher.torchrun_command(wrapper=...) puts numa's --exec-bound between
    torchrun and the CLI, so each rank (LOCAL_RANK from torchrun) is bound to its GPU's NUMA node and then trains."""
    import json

    from conftest import tiny
    from tutorial_lib.launcher import torchrun_command

    env = {**fake_nvidia_smi(tmp_path, TWO_NODES), "OMP_NUM_THREADS": "1"}
    cfg = tiny(tmp_path / "run", parallel="ddp", steps=4)
    words = torchrun_command(cfg, 2, wrapper=(sys.executable, "-m", "tutorial_lib.numa", "--exec-bound"))
    assert words[5:8] == ["--no-python", sys.executable, "-m"] and words[8:10] == ["tutorial_lib.numa", "--exec-bound"]
    p = subprocess.run(words, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    said = p.stdout + p.stderr
    assert "rank 0: GPU 0, CPUs 0 (NUMA node 0)" in said and "rank 1: GPU 1, CPUs 1 (NUMA node 1)" in said, said
    assert json.loads((tmp_path / "run" / "result.json").read_text())["world_size"] == 2


# ---------------------------------------------------------------------------------------- a job's binding decision
def node_with_gpus(tmp_path, monkeypatch, gpus=2):
    """This process on a node of `gpus` visible GPUs (torch.cuda says so), with numactl (a stub that runs its
    command) and fake_nvidia_smi's two-NUMA-node topology first on PATH, free to run on CPUs 0 and 1."""
    import torch

    env = fake_nvidia_smi(tmp_path, TWO_NODES)
    numactl = tmp_path / "numactl"
    numactl.write_text('#!/bin/sh\nshift\nexec "$@"\n')
    numactl.chmod(0o755)
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


def test_the_installed_torchs_binder_is_called_with_the_keyword_its_signature_has(tmp_path, monkeypatch):
    """The decision against the installed torch: its private binder's real signature and validation (numactl on
    PATH), only the part that reads the GPU's NUMA node replaced (there is no GPU here): GPU n -> CPU 4n."""
    import inspect

    binding = pytest.importorskip("torch.numa.binding")
    node_with_gpus(tmp_path, monkeypatch)
    keyword = next(k for k in inspect.signature(binding._get_validated_logical_cpus_to_bind_to).parameters
                   if k != "numa_options")
    monkeypatch.setattr(binding, "_get_logical_cpus_to_bind_to", lambda numa_options, **gpu: {4 * gpu[keyword]})
    words, why = numa.torchrun_binding("node")
    assert words == ["--numa-binding=node"], why
    assert f"_get_validated_logical_cpus_to_bind_to({keyword}=...)" in why
    assert why.endswith(": local rank 0 on CPUs 0; local rank 1 on CPUs 4")


def test_torch_2_13s_keyword_is_picked_from_the_signature(tmp_path, monkeypatch):
    binding = pytest.importorskip("torch.numa.binding")
    node_with_gpus(tmp_path, monkeypatch)
    called = []

    def older(*, gpu_index, numa_options):  # torch 2.13.0's signature
        called.append((gpu_index, numa_options.affinity_mode.value))
        return {gpu_index + 10}

    monkeypatch.setattr(binding, "_get_validated_logical_cpus_to_bind_to", older)
    words, why = numa.torchrun_binding("exclusive")
    assert words == ["--numa-binding=exclusive"] and called == [(0, "exclusive"), (1, "exclusive")]
    assert "(gpu_index=...)" in why and "local rank 0 on CPUs 10; local rank 1 on CPUs 11" in why


def test_a_renamed_keyword_falls_back_to_the_workbooks_binder_and_says_so(tmp_path, monkeypatch, capsys):
    """A torch whose private binder takes a keyword this module does not know: it is never called (the call would
    raise), each rank runs through --exec-bound instead, and the job's line names the signature and each rank's
    CPUs (fake_nvidia_smi: GPU 0 near CPU 0, GPU 1 near CPU 1)."""
    binding = pytest.importorskip("torch.numa.binding")
    node_with_gpus(tmp_path, monkeypatch)

    def renamed(*, accelerator_index, numa_options):
        raise AssertionError("a signature not checked was called")

    monkeypatch.setattr(binding, "_get_validated_logical_cpus_to_bind_to", renamed)
    assert numa.main(["--torchrun-flag", "node"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["--no-python", sys.executable, "-m", "tutorial_lib.numa", "--exec-bound", sys.executable]
    assert err.startswith("CPU binding: the workbook's binder, python -m tutorial_lib.numa --exec-bound, as torchrun "
                          "can't bind here (torch ") and err.count("\n") == 1
    assert "_get_validated_logical_cpus_to_bind_to(accelerator_index, numa_options) is not a signature" in err
    assert err.endswith(": local rank 0 on CPUs 0; local rank 1 on CPUs 1\n")
    assert numa.main(["--torchrun-flag", "exclusive", "--no-python"]) == 0  # a program that is not python's arguments
    assert capsys.readouterr().out.splitlines()[-2:] == ["--exec-bound", "--exclusive"]
    assert numa.main(["--torchrun-flag", "socket"]) == 1  # the workbook's binder has no socket mode: unbound, said
    assert "CPU binding: off: torchrun can't bind (torch " in capsys.readouterr().err
    assert numa.main(["--torchrun-flag", "node", "--python"]) == 2


@pytest.mark.parametrize("signature", ["*, device_index, numa_options", "gpu_index, /, numa_options",
                                       "*, gpu_index, numa_options, node", "*, numa_options, **kw"])
def test_only_a_known_signature_is_called(signature):
    import types

    namespace = {}
    exec(f"def private({signature}): return {{0}}", namespace)
    binding = types.SimpleNamespace(_get_validated_logical_cpus_to_bind_to=namespace["private"], NumaOptions=object,
                                    AffinityMode=object)
    cpus, how = numa.torch_binder(binding)
    assert (cpus is not None) == signature.startswith("*, device_index"), how
    assert numa.torch_binder(types.SimpleNamespace())[1] == "its torch.numa.binding has no " \
        "_get_validated_logical_cpus_to_bind_to"


def test_the_jobs_binding_words_reach_torchrun_one_a_line(tmp_path):
    """The job's CPU binding block, as rendered, run by bash with a `python` that answers as the decision does: each
    line one word of the array torchrun gets, a word with a space kept whole."""
    from tutorial_lib import jobs

    text = jobs.render("demo", command="./train.sh", site="generic", gpus_per_node=2)
    block = text[text.index("numa_binding=()"):text.index("fi\n", text.index("numa_binding=()")) + 3]
    assert "--torchrun-flag node --no-python); then" in block
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$*" > "$(dirname "$0")/asked"\nprintf -- "--no-python\\n/opt/my env/python\\n"\n')
    fake.chmod(0o755)
    p = subprocess.run(["bash", "-c", block + 'printf "<%s>" "${numa_binding[@]}"'], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}, timeout=30)
    assert p.stdout == "<--no-python></opt/my env/python>", p.stderr
    assert (tmp_path / "asked").read_text() == "-m tutorial_lib.numa --torchrun-flag node --no-python\n"
