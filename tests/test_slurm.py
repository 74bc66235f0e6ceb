"""The rendered jobs on a real Slurm: the local two-node cluster of scripts/slurm/local-cluster.sh.

Every job is submitted at once (module fixture `jobs`), then each test waits for its own: the cluster
runs them side by side. They train on the CPU with gloo; the cluster's GPUs are fake GRES.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tutorial_lib import jobs, ladder
from tutorial_lib.config import TrainConfig, load
from tutorial_lib.slurm import Job, SubmitError

ROOT = Path(__file__).resolve().parents[1]
UP = "bash scripts/slurm/local-cluster.sh up"


def _cluster_problem() -> str | None:
    if shutil.which("sinfo") is None:
        return f"no Slurm on this machine (sinfo not on PATH); as root, `make slurm-up` or `{UP}` installs and starts it"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return f"the Slurm controller does not answer (`scontrol ping`); as root, `make slurm-up` or `{UP}`"
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()
    if not {"node1", "node2"} <= set(nodes):
        return f"this Slurm is not the workbook's local cluster (nodes {nodes}); the job tests need node1 and node2"
    return None


PROBLEM = _cluster_problem()
if PROBLEM and os.environ.get("CI") and os.getuid() == 0:
    # CI runs as root and `make test` starts the cluster first: a missing cluster is a failure there.
    raise RuntimeError(f"the Slurm tests can't run in CI: {PROBLEM}")
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))]

# The requeue job's steps. Its first run waits in step REQUEUE_STALL_AT, using no CPU, until the time limit's USR1
# arrives (REQUEUE_STALL, a Python start-up hook given to that job only) rather than train until then. Slurm sends
# that USR1 at its first check of the limits (every 30 s) less than 10 + 30 s before the limit: with a limit of one
# minute 20-50 s after the start, which on a busy 2-core machine came before the job script had set its USR1 trap
# (the script died of the signal); with two minutes, 80-110 s after the start. The run then stops at that step's
# end with a checkpoint; the job is requeued, and its next run trains on.
REQUEUE_STEPS, REQUEUE_STALL_AT = 12, 2
REQUEUE_STALL = """
import sys
import time

if "tutorial_lib" in sys.orig_argv and "train" in sys.orig_argv:  # the training, not the script's other pythons
    from tutorial_lib import engine

    step = engine.Run.train_step

    def train_step(self, x, y):
        if self.step + 1 == %d and (self.resumed_from or 0) < self.step + 1:  # not yet stopped after this step
            deadline = time.monotonic() + 240
            while not self.stop_requested and time.monotonic() < deadline:
                time.sleep(0.2)
        return step(self, x, y)

    engine.Run.train_step = train_step
""".replace("%d", str(REQUEUE_STALL_AT))


def tiny(out_dir: Path, **kw) -> TrainConfig:
    base = dict(dataset="shapes", model="resnet18_imagenet", steps=6, batch_size=8, train_size=64, val_size=32,
                device="cpu", tensorboard=False, log_every=2, out_dir=str(out_dir))
    return TrainConfig(**{**base, **kw})


FAKE_NVIDIA_SMI = """#!/bin/bash
# Stand-in for nvidia-smi on the CPU test cluster: a CSV line per interval until it is killed.
interval=1
while (($#)); do [[ $1 == -l ]] && interval=$2; shift; done
echo "$$" >>"$FAKE_PIDS"
echo "timestamp, index, name, utilization.gpu [%], memory.used [MiB]"
while true; do echo "$(date '+%Y/%m/%d %H:%M:%S'), 0, Fake GPU, 0 %, 0 MiB"; sleep "$interval"; done
"""

FAKE_NSYS = """#!/bin/bash
# Stand-in for Nsight Systems: records its options, then runs the profiled command.
[[ $1 == profile ]] || exit 2
shift
opts=()
while [[ $1 == --* ]]; do opts+=("$1"); shift; done
printf '%s\\n' "${opts[@]}" >"$FAKE_NSYS_LOG.$SLURM_PROCID"
exec "$@"
"""


def _fake_tools(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("nvidia-smi", FAKE_NVIDIA_SMI), ("nsys", FAKE_NSYS)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slurm")


def _requeue_spec(work: Path) -> dict:
    hook = work / "requeue_stall"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(REQUEUE_STALL)
    return dict(cfg=tiny(work / "requeue", steps=REQUEUE_STEPS, log_every=1), site="local", time="00:02:00",
                requeue=10, pythonpath=hook)


def _submit(name: str, spec: dict, work: Path) -> Job:
    fake = _fake_tools(work / "bin")
    spec = dict(spec)
    hook = spec.pop("pythonpath", None)
    env = (f"--export=ALL,PATH={fake}:{os.environ['PATH']},FAKE_PIDS={work}/smi.pids,FAKE_NSYS_LOG={work}/nsys"
           + (f",PYTHONPATH={hook}" if hook else ""))
    path = jobs.write(f"t_{name}", spec.pop("cfg"), jobs_dir=work / "jobs", show=False,
                      output=f"{work}/logs/%x-%j.out", **spec)
    return jobs.submit(path, sbatch_args=[env])


_EARLY: dict = {}  # the requeue job when tests/conftest.py submitted it at the session's start


def submit_requeue_early(work: Path) -> None:
    """The requeue job waits one to two minutes for the controller's signal, then for the requeue; submitted when the
    session starts (tests/conftest.py, when this module is selected and the cluster answers), it waits beside the
    other tests instead of at the end of this module."""
    _EARLY.update(job=_submit("requeue", _requeue_spec(work), work))


@pytest.fixture(scope="module")
def jobs_submitted(work, request, tmp_path_factory):
    """Render every job into a scratch jobs/ folder and submit them all; name -> Job."""
    from test_slurm_signals import start_beside

    start_beside(request.session, tmp_path_factory)  # the stop-signal jobs wait for the cluster beside these
    specs = {
        # the long one first: it needs a time limit to pass (submitted at the session's start when it could be)
        **({} if _EARLY else {"requeue": _requeue_spec(work)}),
        # the default profile, as the committed jobs/ files use it, with the monitor and line_profiler
        "single": dict(cfg=tiny(work / "single"), site="generic", cpus_per_task=1, gpu_monitor=1, line_profile=True),
        "torchrun": dict(cfg=tiny(work / "torchrun", parallel="ddp"), site="local", gpus_per_node=2),
        "multinode": dict(cfg=tiny(work / "multinode", parallel="ddp"), site="local", nodes=2, gpus_per_node=2),
        "srun": dict(cfg=tiny(work / "srun", parallel="ddp"), site="local", nodes=2, gpus_per_node=1, mode="srun",
                     nsys=True),
        "sweep": dict(cfg=tiny(work / "sweep"), site="local", sweep={"batch_size": [8, 16]}),
        # fails at its start (a config the render can check, such as fp16 on a CPU, is refused at render time)
        "fails": dict(cfg=tiny(work / "fails", dataset="cifar10", data_dir=str(work / "no-data")), site="local"),
        "ladder": dict(cfg=ladder_job(work)[0], sweep=ladder_job(work)[1], site="local"),  # notebook 04's job
    }
    submitted = {"requeue": _EARLY["job"]} if _EARLY else {}
    for name, spec in specs.items():
        submitted[name] = _submit(name, spec, work)
    yield submitted
    for job in submitted.values():  # nothing left behind on the cluster when a test failed early
        subprocess.run(["scancel", job.id], capture_output=True)


LADDER = ladder.Sizes(batch=8, big_batch=16, steps=3, big_steps=2, warmup=1, model="resnet18_imagenet",
                      train_size=64, budget_s=600)


def ladder_job(work: Path):
    """jobs/04_ladder.sbatch as notebook 04 renders it, with CPU sizes: one array task per rung a CPU runs."""
    return ladder.job_sweep(LADDER, {"out_dir": str(work / "ladder")}, device="cpu")


def finished(job: Job, timeout: float = 240) -> str:
    state = job.wait(timeout=timeout, poll=1.0, quiet=True)
    if state != "COMPLETED":
        print(job.log(60))
    return state


def test_single_gpu_job_on_the_default_profile_completes(jobs_submitted, work):
    job = jobs_submitted["single"]
    assert finished(job) == "COMPLETED"
    res = job.result()
    assert res["world_size"] == 1 and res["steps"] == 6
    assert res["config"]["num_workers"] == "auto" and res["num_workers_used"] == 0  # auto on 1 CPU per task
    assert "job " in job.log(200) and "node1" in job.log(200)  # the script says where it runs


def test_gpu_monitor_writes_csv_and_is_stopped_by_its_pid(jobs_submitted, work):
    job = jobs_submitted["single"]
    assert finished(job) == "COMPLETED"
    csv = (work / "single" / "gpu_monitor.csv").read_text().splitlines()
    assert csv[0].startswith("timestamp") and len(csv) >= 2
    pids = [int(p) for p in (work / "smi.pids").read_text().split()]
    deadline = time.monotonic() + 10
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids and not any(_running(p) for p in pids), "the GPU monitor outlived its job"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_line_profile_job_saves_and_prints_the_report(jobs_submitted, work):
    job = jobs_submitted["single"]
    assert finished(job) == "COMPLETED"
    assert (work / "single" / "line_profile.lprof").stat().st_size > 0
    log = job.log(400)
    assert "Timer unit: 0.001 s" in log and "def fit" in log


def test_torchrun_on_one_node_runs_two_ranks(jobs_submitted):
    job = jobs_submitted["torchrun"]
    assert finished(job) == "COMPLETED"
    res = job.result()
    assert res["world_size"] == 2 and len(set(res["param_checksums"])) == 1


def test_two_node_ddp_ends_with_identical_parameters_on_four_ranks(jobs_submitted):
    job = jobs_submitted["multinode"]
    assert finished(job) == "COMPLETED"
    res = job.result()
    assert res["world_size"] == 4
    assert len(res["param_checksums"]) == 4 and len(set(res["param_checksums"])) == 1
    log = job.log(400)
    assert "rendezvous at node1:" in log and "node[1-2]" in log


def test_srun_task_per_gpu_spans_both_nodes_under_nsys(jobs_submitted, work):
    job = jobs_submitted["srun"]
    assert finished(job) == "COMPLETED"
    res = job.result()
    assert res["world_size"] == 2 and len(set(res["param_checksums"])) == 1
    assert res["config"]["nvtx"] is True
    for rank in (0, 1):  # nsys wrapped each task, with NVTX tracing
        opts = (work / f"nsys.{rank}").read_text().split()
        assert "--trace=cuda,nvtx,osrt" in opts


def test_job_array_sweep_collects_every_result(jobs_submitted):
    job = jobs_submitted["sweep"]
    assert finished(job) == "COMPLETED"
    assert len(job.states()) == 2
    results = job.results()
    assert [r["config"]["batch_size"] for r in results] == [8, 16]
    assert all(r["steps"] == 6 for r in results)


def test_failing_job_is_reported_failed_with_its_exit_code(jobs_submitted):
    job = jobs_submitted["fails"]
    assert job.wait(timeout=240, quiet=True) == "FAILED"
    assert job.exit_code() == 2
    assert "dataset 'cifar10' is not staged in" in job.log(50)


def test_job_at_its_time_limit_is_requeued_and_resumes_without_losing_a_step(jobs_submitted):
    job = jobs_submitted["requeue"]
    assert finished(job, timeout=300) == "COMPLETED"
    assert job.restarts() >= 1
    res = job.result()
    log = job.log(1000)
    assert res["steps"] == REQUEUE_STEPS and len(res["loss"]) == REQUEUE_STEPS
    assert res["resumed_from_step"] and REQUEUE_STALL_AT <= res["resumed_from_step"] < REQUEUE_STEPS
    assert f"stopped by SIGUSR1: checkpoint at step {res['resumed_from_step']}" in log
    assert "USR1: the time limit is near" in log and "requeueing job" in log
    assert f"resuming from step {res['resumed_from_step']}" in log


def test_ladder_job_array_trains_every_cpu_rung_and_gathers_into_the_table(jobs_submitted, work):
    job = jobs_submitted["ladder"]
    assert finished(job) == "COMPLETED"
    rows = ladder.gather(work / "ladder", LADDER)
    assert [r["rung"] for r in rows] == ["fp32", "bf16", "channels_last", "fused_adamw", "big_batch", "gpu_resident",
                                         "last_small_batch"]
    assert all(r["img_s"] > 0 and r["speedup"] > 0 for r in rows) and "| gpu_resident |" in ladder.markdown(rows)


def _site_bigger_than_the_cluster(work: Path) -> str:
    """A profile that promises 16 GPUs per node: the local nodes have 8."""
    text = (ROOT / "tutorial_lib" / "sites" / "local.yaml").read_text().replace("gpus_per_node: 8", "gpus_per_node: 16")
    path = work / "big.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case, extra, slurm_says", [
    ("gpus", dict(gpus_per_node=16), "Requested node configuration is not available"),
    ("partition", dict(partition="nope"), "invalid partition specified: nope"),
])
def test_impossible_request_is_refused_at_submit_with_slurms_words(work, case, extra, slurm_says):
    site = _site_bigger_than_the_cluster(work) if case == "gpus" else "local"
    cfg = tiny(work / "refused", parallel="ddp" if case == "gpus" else "none")
    path = jobs.write(f"t_refused_{case}", cfg, site=site, jobs_dir=work / "jobs", show=False, **extra)
    with pytest.raises(SubmitError) as err:
        jobs.submit(path)
    message = str(err.value)
    assert slurm_says.lower() in message.lower() and "sbatch refused" in message and "\nhint: " in message


def test_committed_job_files_are_accepted_by_the_scheduler():
    files = sorted((ROOT / "jobs").glob("*.sbatch"))
    assert files, "jobs/ holds no sbatch file"
    for path in files:
        # a site profile's own partition (the container profile's `accel`) does not exist here: the local one
        local = ["--partition=debug"] if "#SBATCH --partition=" in path.read_text() else []
        proc = subprocess.run(["sbatch", "--test-only", *local, str(path)], cwd=ROOT, capture_output=True,
                              text=True)
        assert proc.returncode == 0 and "to start at" in proc.stderr, f"{path.name}: {proc.stderr}"


# ---------------------------------------------------------------------------- the committed jobs, run
CPU_SIZES = ["model=resnet18_imagenet", "steps=6", "timing_warmup=1", "batch_size=8", "train_size=64", "val_size=32",
             "device=cpu", "log_every=2"]
SITE_WORDS = ("time", "partition", "account", "qos", "constraint", "cpus_per_task", "mem", "output", "error")


def cpu_sized(path: Path, work: Path) -> Path:
    """`path` rendered again from its own record, as its notebook renders it, with CPU sizes on the local site."""
    rec = jobs.render_record(path)
    cfg = load(None, [*rec["overrides"], *CPU_SIZES, f"out_dir={work}/committed/{rec['name']}"])
    if cfg.precision in ("fp16", "tf32"):  # CUDA-only modes
        cfg = cfg.replace(precision="fp32")
    kept = {k: v for k, v in rec["resources"].items() if k not in SITE_WORDS}
    log = f"{work}/logs/%x-%A_%a.out" if rec.get("sweep") else f"{work}/logs/%x-%j.out"
    return jobs.write(rec["name"], cfg, site="local", sweep=rec.get("sweep"), description=rec.get("description"),
                      jobs_dir=work / "committed_jobs", show=False, time="00:10:00", output=log, **kept)


# Notebooks 04-06 render their jobs through their own functions, and tests run those renders on this cluster:
# test_ladder_job_array_... (04), tests/test_jobs_05.py (05, with a fake apptainer and MNIST-format files),
# the scaling_jobs tests below (06). The jobs of notebooks 01-03 are run here, from their committed records.
COMMITTED = sorted(p for p in (ROOT / "jobs").glob("*.sbatch") if not p.name.startswith(("04_", "05_", "06_")))


@pytest.fixture(scope="module")
def committed_submitted(work):
    """Every committed job file, CPU-sized, submitted at once (nsys and nvidia-smi are the fakes above)."""
    fake = _fake_tools(work / "bin")
    env = f"--export=ALL,PATH={fake}:{os.environ['PATH']},FAKE_PIDS={work}/smi.pids,FAKE_NSYS_LOG={work}/nsys"
    submitted = {path.name: jobs.submit(cpu_sized(path, work), sbatch_args=[env]) for path in COMMITTED}
    yield submitted
    for job in submitted.values():
        subprocess.run(["scancel", job.id], capture_output=True)


# ---------------------------------------------------------------------------------------- notebook 06's jobs
@pytest.fixture(scope="module")
def scaling_jobs(work):
    """Notebook 06's jobs, written by the same functions with CPU sizes: one per GPU count (arrays of the weak,
    strong and traced points), one over both nodes, and the learning-rate rules; all submitted at once."""
    from tutorial_lib import scaling

    out = dict(output=f"{work}/logs/%x-%j.out", site="local", jobs_dir=work / "jobs06", show=False)
    cfg = tiny(work, parallel="none", eval=False)
    # 1 and 2 GPUs per node (the notebook renders 1, 2 and 4; the code is the same for any count): on two CPU
    # cores every rank is a process to start, and 4-rank jobs made this group the module's slowest
    paths = scaling.write_jobs(cfg, gpus=(1, 2), nodes=2, prefix="t06", out=str(work / "scaling"), **out)
    tta = tiny(work, eval_every=2, target_accuracy=0.99, lr_schedule="constant")
    paths.append(scaling.write_lr_job(tta, gpus=2, base_batch=8, warmup_images=16, prefix="t06",
                                      out=str(work / "lr_rules"), **out))
    submitted = {p.stem.removeprefix("t06_"): jobs.submit(p) for p in paths}
    yield submitted
    for job in submitted.values():
        subprocess.run(["scancel", job.id], capture_output=True)


@pytest.mark.parametrize("name", [p.name for p in COMMITTED])
def test_every_committed_job_runs_to_completed_with_cpu_sizes(committed_submitted, name):
    job = committed_submitted[name]
    assert finished(job, timeout=400) == "COMPLETED"
    record = jobs.render_record(ROOT / "jobs" / name)
    results = job.results()
    assert len(results) == len(record.get("sweep") or [None])  # a result.json for every task
    assert all(r["steps"] == 6 and r["throughput_img_s"] > 0 for r in results)
    if record.get("sweep"):  # the swept key reached each task
        for point, r in zip(record["sweep"], results):
            assert all(str(r["config"][k]) == v for k, v in point.items())


def test_scaling_jobs_complete_and_the_ledger_collects_every_point(scaling_jobs, work):
    from tutorial_lib import scaling

    for name in ("scaling_1gpu", "scaling_2gpu"):
        assert finished(scaling_jobs[name], timeout=400) == "COMPLETED", name
    two = scaling_jobs["scaling_2gpu"].results()
    assert [(r["world_size"], scaling.batch_per_gpu(r), r["config"]["profile"]) for r in two] == [
        (2, 8, False), (2, 4, False), (2, 8, True)]  # weak, strong (global 8), traced on every rank
    assert len(set(two[0]["param_checksums"])) == 1 and scaling.comm_share(work / "scaling" / "2gpu" / "traced")["ranks"] == 2
    rows = [r for r in scaling.ledger(work / "scaling") if r["world_size"] <= 2]  # the 2-node job: its own test
    assert len(rows) == 1 + 3
    weak = [r for r in rows if scaling.batch_per_gpu(r) == 8 and not r["config"]["profile"]]
    assert [p.gpus for p in scaling.scaling_points(weak, "weak")] == [1, 2]
    strong = [r for r in rows if r["global_batch"] == 8]
    assert [p.batch_per_gpu for p in scaling.scaling_points(strong, "strong")] == [8, 4]


def test_notebook06_two_node_job_trains_every_rank_of_both_nodes_in_step(scaling_jobs):
    job = scaling_jobs["multinode"]
    assert finished(job, timeout=400) == "COMPLETED"
    res = job.result()
    assert res["world_size"] == 4 and len(set(res["param_checksums"])) == 1  # 2 nodes x 2 GPUs
    log = job.log(400)
    assert "rendezvous at node1:" in log and "for 4 processes" in log


def test_lr_rules_job_runs_one_task_per_rule_with_its_accuracy_history(scaling_jobs):
    job = scaling_jobs["lr_rules"]
    assert finished(job, timeout=400) == "COMPLETED"
    results = job.results()
    assert [r["config"]["lr"] for r in results] == pytest.approx([2e-3, 4e-3, 2e-3 * 2 ** 0.5])  # none, linear, sqrt
    assert all(r["config"]["warmup_steps"] == 1 and [h[0] for h in r["val_history"]] == [2, 4, 6] for r in results)
