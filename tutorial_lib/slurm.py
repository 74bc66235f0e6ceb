"""Submit sbatch files and follow the jobs: state, wait, the tail of the log, the run's result.json.

    job = tl.slurm.submit("jobs/01_single_gpu.sbatch")  # runs sbatch from the top of the workbook
    job.wait(timeout=900)       # polls `scontrol show job` until the job ends; returns e.g. 'COMPLETED'
    job.log()                   # the last lines of its output
    job.result()                # its result.json, as a dict (job.results() for every task of an array)

When sbatch refuses a file, its message is shown word for word with a hint; on a machine without Slurm
the caller (tl.jobs.submit) says how to run the same training without it. This is a plain Slurm client: it
knows nothing of how the files are rendered. No torch here: this runs on login nodes.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .config import ROOT, UserError
from .results import read_result

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE", "REVOKED", "SPECIAL_EXIT")


def available() -> bool:
    """True when jobs can be submitted from here: sbatch is on PATH and the Slurm controller answers."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return False
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return False
    return ping.returncode == 0 and " is UP" in ping.stdout


class SubmitError(UserError):
    """sbatch refused the file; the message holds sbatch's own words and a hint."""


class NoSlurm(UserError):
    """sbatch is not on PATH: this machine has no Slurm."""


def submit(path: str | Path, *, cwd: str | Path | None = None, sbatch_args: list[str] | tuple = (),
           out_dirs: list[str] | None = None) -> "Job":
    """sbatch `path` from the top of the workbook (or `cwd`); returns the Job. Creates the log folder.
    `out_dirs`: where each task of the job writes its result.json (for Job.result)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist; write it first with tl.jobs.write(...) or "
                        "`python -m tutorial_lib jobs render ...`")
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise NoSlurm(f"sbatch is not on PATH: this machine has no Slurm, so {path} can't be submitted here")
    cwd = Path(cwd) if cwd is not None else ROOT
    for folder in log_folders(path, cwd):
        folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sbatch, "--parsable", *sbatch_args, str(path.resolve())], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        raise SubmitError(refusal_message(path, proc.stderr or proc.stdout))
    return Job(proc.stdout.strip().split(";")[0], path, out_dirs)


def log_folders(path: Path, cwd: Path) -> list[Path]:
    """The folders of the file's --output/--error paths (Slurm writes no log at all when they are missing)."""
    folders = []
    for line in path.read_text().splitlines():
        m = re.match(r"#SBATCH\s+(?:--output|--error|-o|-e)[= ](\S+)", line)
        if m and "%" not in str(Path(m.group(1)).parent):
            folders.append(cwd / Path(m.group(1)).parent)
    return folders


HINTS = [
    (r"node count specification invalid", "this job asks for more nodes than its partition has; the nodes "
     "here: {nodes}. Ask for at most that many (nodes=N), or another partition"),
    (r"invalid partition", "the partitions here: {partitions}; set partition=NAME (or change the site profile)"),
    (r"requested node configuration is not available|more processors requested than permitted",
     "no node offers what one node of this job asks for (GPUs, CPUs or memory); the nodes here: {nodes}. "
     "Ask for less per node (gpus_per_node, cpus_per_task, mem) and more nodes (nodes=N)"),
    (r"invalid account|account.*not permitted", "give account=PROJECT; `sacctmgr show assoc user=$USER "
     "format=account` lists the accounts you may use"),
    (r"invalid qos", "give qos=NAME; `sacctmgr show assoc user=$USER format=qos` lists yours"),
    (r"time limit", "ask for less time (the partitions' limits: `sinfo -o '%P %l'`) and use requeue=SECONDS "
     "to continue from a checkpoint in the next job"),
    (r"invalid generic resource|invalid gres|gres", "this cluster wants GPUs asked for another way: set "
     "gpu_request in the site profile to gpus-per-node, gres or gpus, as its documentation says"),
    (r"unable to contact slurm controller|connection refused|socket timed out",
     "the Slurm controller does not answer: on the workbook's test cluster run `make slurm-up` as root; "
     "elsewhere try again, or ask the cluster's admins"),
]


def refusal_message(path: Path, stderr: str) -> str:
    text = stderr.strip()
    for pattern, hint in HINTS:
        if re.search(pattern, text, re.IGNORECASE):
            break
    else:
        hint = f"compare the #SBATCH lines of {path} with your cluster's documentation (and `man sbatch`)"
    return f"sbatch refused {path}:\n{text}\nhint: " + hint.format(partitions=_sinfo("%P"), nodes=_sinfo(
        "%P: %D nodes, %c CPUs, %m MB, GRES %G"))


def _sinfo(fmt: str) -> str:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", fmt], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "(sinfo failed)"
    return "; ".join(line.strip() for line in out.splitlines() if line.strip()) or "(sinfo shows none)"


def _parse_record(line: str) -> dict[str, str]:
    """One line of `scontrol show job -o`: Key=Value pairs, where a value may hold spaces."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(.*?)(?=\s[A-Za-z][\w:/]*=|$)", line.strip()))


@dataclass
class Job:
    """A submitted job (or job array): ask Slurm about it, wait for it, read what it left."""
    id: str
    path: Path | None = None  # the sbatch file, when known
    out_dirs: list[str] | None = None  # each task's out_dir (tl.jobs.submit knows them from the file)

    def __repr__(self) -> str:
        return f"Job({self.id}" + (f", {self.path}" if self.path else "") + ")"

    def records(self) -> list[dict[str, str]]:
        """`scontrol show job` of the job, one record per job or array task (sacct once it is forgotten)."""
        proc = subprocess.run(["scontrol", "show", "job", "-o", self.id], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            return [_parse_record(line) for line in proc.stdout.splitlines() if line.strip()]
        return self._sacct_records(proc.stderr.strip())

    def _sacct_records(self, why: str) -> list[dict[str, str]]:
        proc = subprocess.run(["sacct", "-n", "-P", "-X", "-j", self.id, "-o", "JobID,State,ExitCode,WorkDir"],
                              capture_output=True, text=True, timeout=60)
        rows = [line.split("|") for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode != 0 or not rows:
            raise UserError(f"job {self.id} is unknown to Slurm ({why}; sacct: "
                            f"{proc.stderr.strip() or 'no record'}); check the id with `squeue --me` or `sacct`")
        return [{"JobId": r[0], "JobState": r[1].split()[0], "ExitCode": r[2], "WorkDir": r[3]} for r in rows]

    def states(self) -> dict[str, str]:
        """Job or array task id -> state (PENDING, RUNNING, COMPLETED, FAILED, TIMEOUT, ...)."""
        return {_task_label(r): r.get("JobState", "UNKNOWN") for r in self.records()}

    def state(self) -> str:
        """One state for the job; for an array: RUNNING/PENDING while any task is, then COMPLETED only if all did."""
        states = list(self.states().values())
        if all(s in TERMINAL for s in states):
            return next((s for s in states if s != "COMPLETED"), "COMPLETED")
        return "RUNNING" if "RUNNING" in states else next(s for s in states if s not in TERMINAL)

    def exit_code(self) -> int | None:
        """The exit code of the batch script (the first non-zero one of an array); None while it runs."""
        codes = [r.get("ExitCode", "") for r in self.records() if r.get("JobState") in TERMINAL]
        values = [int(c.split(":")[0]) for c in codes if c]
        return next((v for v in values if v), values[0] if values else None)

    def restarts(self) -> int:
        return max(int(r.get("Restarts", 0) or 0) for r in self.records())

    def wait(self, timeout: float | None = 600, poll: float = 1.0, quiet: bool = False) -> str:
        """Poll until the job has ended; prints each change of state. Returns the final state."""
        start, last = time.monotonic(), None
        while True:
            state = self.state()
            if state != last and not quiet:
                print(f"job {self.id}: {state} ({time.monotonic() - start:.0f} s)", flush=True)
            last = state
            if state in TERMINAL:
                return state
            if timeout is not None and time.monotonic() - start > timeout:
                raise UserError(f"job {self.id} is still {state} after {timeout:.0f} s; follow it with "
                                f"`squeue -j {self.id}`, read job.log(), or cancel it with `scancel {self.id}`")
            time.sleep(poll)

    def log_path(self, task: int | None = None) -> Path:
        rec = self._record(task)
        path = rec.get("StdOut", "")
        if not path:
            raise UserError(f"Slurm does not say where job {self.id} writes its output (StdOut)")
        return Path(path)

    def log(self, lines: int = 20, task: int | None = None) -> str:
        """The last `lines` lines of the job's output (of array task `task`)."""
        path = self.log_path(task)
        if not path.is_file():
            return f"(no log yet at {path}: the job is {self.state()})"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def result(self, task: int | None = None) -> dict:
        """The run's result.json as a dict (array task `task` of a sweep)."""
        return read_result(self._result_path(task), f"submit {self.path or 'the job'} again: its run writes it again "
                           "(from its checkpoint when it kept one)")

    def results(self) -> list[dict]:
        """Every task's result.json, in task order (one for a plain job)."""
        return [self.result(i) for i in range(len(self._out_dirs()))]

    def _out_dirs(self) -> list[str]:
        if self.out_dirs is None:
            raise UserError(f"Job({self.id}) does not know where its results go; use tl.jobs.attach(id, path) "
                            "with the job's sbatch file to read them")
        if not self.out_dirs:
            raise UserError(f"{self.path} runs a command, not the training: it leaves no result.json to read")
        return self.out_dirs

    def _result_path(self, task: int | None) -> Path:
        dirs = self._out_dirs()
        index = task if task is not None else 0
        if not 0 <= index < len(dirs):
            raise UserError(f"task={task}: {self.path} has tasks 0-{len(dirs) - 1}")
        work = Path(self._record(task).get("WorkDir") or ROOT)
        path = work / dirs[index] / "result.json"
        if not path.is_file():
            raise UserError(f"no result.json at {path}: job {self.id} is {self.state()}; its log ends with:\n"
                            + self.log(10, task))
        return path

    def _record(self, task: int | None) -> dict[str, str]:
        records = self.records()
        if task is None:
            return records[0]
        for rec in records:
            if rec.get("ArrayTaskId") == str(task):
                return rec
        return records[0]  # a task still pending shares one record with its siblings


def _task_label(rec: dict[str, str]) -> str:
    if rec.get("ArrayTaskId"):
        return f"{rec.get('ArrayJobId')}_{rec['ArrayTaskId']}"
    return rec.get("JobId", "?")
