"""The spawner of the workbook's local hub: batchspawner's SlurmSpawner, set up for a workshop.

Each learner's server is a Slurm job: the hub submits it as the learner (`runuser -u <learner> -- sbatch`),
waits for it to run, and talks to the server on the job's node. What this class adds to SlurmSpawner:

- the server binds 127.0.0.1 (here every node is this machine; on a real cluster set `ip` to "0.0.0.0" or
  the node's interface, so the hub on another host reaches it);
- the job has a name per learner (`<hub>-server-<learner>`), its log in the learner's home
  (`~/.jupyterhub-<job id>.log`), and the limits the hub's config gives (time, CPUs, memory, GPUs);
- the progress page names the job, where it waits and why (`squeue`'s reason);
- a start that fails says which part failed and what to do, on the hub's page: the cluster refused the job
  (sbatch's own words), the job ended before the server answered (its state, exit code and the end of its
  log), or it waited in the queue longer than the hub waits;
- when a running server's job ends (time limit, cancelled, node failure...), the hub's "not running" page
  says how it ended and what to do (templates/not_running.html reads `ended_message`).
"""
from __future__ import annotations

import asyncio
import html
import re
from pathlib import Path

from batchspawner import SlurmSpawner
from tornado import web
from traitlets import Integer, Unicode, default

# Slurm's end states, as a learner should read them
ENDINGS = {
    "TIMEOUT": "its time limit ({time_limit}) passed",
    "CANCELLED": "it was cancelled (by the hub, an administrator or scancel)",
    "FAILED": "the server exited with an error (exit code {exit_code})",
    "OUT_OF_MEMORY": "it used more memory than the job's limit",
    "NODE_FAIL": "its node failed",
    "PREEMPTED": "a job with a higher priority took its node",
    "BOOT_FAIL": "its node did not start",
    "DEADLINE": "it reached its deadline",
    "COMPLETED": "the server exited",
}
SAVED = ("Your files are safe in your home folder; notebooks are saved every two minutes, so only what you "
         "typed since the last save is lost. The kernel's variables are gone: run the notebook from the top.")


def _duration(seconds: int) -> str:
    """An idle limit as a learner reads it: '1 h', '90 min', '45 s'."""
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


class LearnerError(web.HTTPError):
    """A failure the hub shows on the learner's page: what happened, then what to do (plain and HTML). An
    HTTPError, so that the hub shows it as it is (any other exception is "Unhandled error starting server")."""

    def __init__(self, what: str, todo: str, details: str = ""):
        super().__init__(500, reason="Your server did not start")
        self.jupyterhub_message = f"{what} {todo}" + (f"\n{details}" if details else "")
        self.jupyterhub_html_message = (
            f'<p class="workbook-what">{html.escape(what)}</p>'
            + (f'<pre class="workbook-details">{html.escape(details)}</pre>' if details else "")
            + f'<p class="workbook-todo"><strong>What to do:</strong> {html.escape(todo)}</p>')


def slurm_fields(text: str) -> dict[str, str]:
    """`scontrol show job -o` output as a dict (JobState, Reason, ExitCode, TimeLimit, NodeList, ...)."""
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))


def ending(fields: dict[str, str]) -> str:
    """How a job ended, in words: 'TIMEOUT: its time limit (01:00:00) passed'."""
    state = fields.get("JobState", "UNKNOWN")
    why = ENDINGS.get(state, "Slurm reports this state").format(
        time_limit=fields.get("TimeLimit", "?"), exit_code=fields.get("ExitCode", "?").split(":")[0])
    reason = fields.get("Reason", "None")
    return f"{state}: {why}" + (f" (reason: {reason})" if reason not in ("None", "") else "")


class WorkbookSlurmSpawner(SlurmSpawner):
    # batchspawner starts from this trait's default, not from config: loopback only on this one machine
    ip = Unicode("127.0.0.1", help="where the server listens (the job's node)").tag(config=True)

    exec_prefix = Unicode("runuser -u {username} --").tag(config=True)  # the hub runs as root; no sudo needed
    batch_query_cmd = Unicode("squeue -h -j {job_id} -o '%T %r %B'").tag(config=True)  # state, reason, node
    req_srun = Unicode("").tag(config=True)  # the server is the job's main process: scancel reaches it at once

    hub_name = Unicode("workbook", help="names the servers' jobs: <hub_name>-server-<learner>").tag(config=True)
    req_prologue = Unicode(help="shell lines before the server starts: the learners' environment").tag(config=True)
    idle_limit = Integer(0, help="the hub's idle limit in seconds (0: none), to tell learners").tag(config=True)
    queue_wait = Integer(240, help="seconds a server's job may wait in the queue before the start fails with "
                                   "a message (below start_timeout)").tag(config=True)

    req_job_name = Unicode()

    @default("req_job_name")
    def _job_name(self):
        return f"{self.hub_name}-server-{self.user.name}"

    batch_script = Unicode("""#!/bin/bash
#SBATCH --job-name={{job_name}}
#SBATCH --output={{homedir}}/.jupyterhub-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if gres %}#SBATCH --gres={{gres}}
{% endif %}{% if account %}#SBATCH --account={{account}}
{% endif %}{% if reservation %}#SBATCH --reservation={{reservation}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
# A learner's Jupyter server, started by the hub as a Slurm job (scripts/hub/workbook_spawner.py).
set -euo pipefail
# Jobs the learner submits from the server inherit its environment, but not the export list of this job:
# srun in those jobs reads SLURM_EXPORT_ENV and would pass on nothing else (no PATH, no PYTHONPATH)
unset SLURM_EXPORT_ENV
{{prologue}}
echo "server job $SLURM_JOB_ID on $(hostname) for $USER: ${SLURM_CPUS_PER_TASK:-?} CPUs, GPUs ${CUDA_VISIBLE_DEVICES:-none}, until $(squeue -h -j "$SLURM_JOB_ID" -o %e)"
exec {{cmd}}
""").tag(config=True)

    ended_message = Unicode("", help="how the last server's job ended, for the hub's pages")
    _last_job = ""

    # ------------------------------------------------------------------ start
    async def start(self):
        self.ended_message, self._last_job = "", ""
        try:
            return await asyncio.wait_for(super().start(), timeout=self.queue_wait)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            error = await self._start_failure(e)
            self.log.error("server of %s did not start: %s", self.user.name, error.jupyterhub_message)
            if self.job_id:  # still queued or running: take it back
                await self.cancel_batch_job()
                self.clear_state()
            raise error from e

    async def submit_batch_script(self):
        job = await super().submit_batch_script()
        self._last_job = job
        return job

    async def _start_failure(self, e: Exception) -> LearnerError:
        job = self._last_job
        if not job:  # sbatch refused: its own words say which request
            said = str(e).strip().splitlines()
            return LearnerError(
                "The cluster refused to start your server: " + (said[-1] if said else f"{type(e).__name__}"),
                "This is a setting of the hub or of your account, not of your notebooks: send this message to "
                "your instructor, and start your server again from the hub's home page once it is fixed.")
        log = self.job_log(job, lines=8)
        if isinstance(e, asyncio.TimeoutError) and self.state_ispending():
            reason = (self.job_status.split() + ["?", "?"])[1]
            return LearnerError(
                f"Your server's Slurm job {job} waited {self.queue_wait} s in the queue without starting "
                f"(Slurm's reason: {reason}).",
                "The cluster's nodes are busy (or the request is larger than any node): start your server again "
                "from the hub's home page in a few minutes, and tell your instructor if it keeps waiting.")
        if isinstance(e, asyncio.TimeoutError) and self.state_isrunning():
            return LearnerError(
                f"Your server's Slurm job {job} runs, but the server in it did not answer within {self.queue_wait} s.",
                f"Start your server again from the hub's home page. If it happens again, send your instructor "
                f"this message; the whole log is "
                f"~/.jupyterhub-{job}.log in your home folder.", details=log)
        fields = await self.job_fields(job)
        return LearnerError(
            f"Your server's Slurm job {job} ended before the server answered: {ending(fields)}.",
            f"Start your server again from the hub's home page. If it fails again, send your instructor this "
            f"message; the whole log is "
            f"~/.jupyterhub-{job}.log in your home folder.",
            details=log)

    async def progress(self):
        while True:
            job, status = self.job_id, (self.job_status or "").split()
            if self.state_ispending():
                reason = status[1] if len(status) > 1 else "?"
                yield {"message": f"Your server is Slurm job {job}, waiting in the queue (reason: {reason})"}
            elif self.state_isrunning():
                node = status[-1] if status else "?"
                yield {"message": f"Slurm job {job} runs on {node}: your server is starting"}
                return
            else:
                yield {"message": "Submitting your server's job to Slurm"}
            await asyncio.sleep(1)

    # ------------------------------------------------------------------ running, stopping
    async def poll(self):
        job = self.job_id
        status = await super().poll()
        if status is not None and job and not self.ended_message:
            fields = await self.job_fields(job)
            start, end = (fields.get(k, "?").replace("T", " ") for k in ("StartTime", "EndTime"))
            self.ended_message = (f"Your last server ran as Slurm job {job} on {fields.get('NodeList', '?')} "
                                  f"from {start} to {end} and ended: {ending(fields)}.")
            self.log.warning("server job %s of %s ended: %s", job, self.user.name, ending(fields))
        return status

    async def stop(self, now=False):
        if not self.job_id:  # its job has already ended (poll cleared it): nothing to cancel
            return
        limit = f" or had been idle for longer than the hub's limit ({_duration(self.idle_limit)})" \
            if self.idle_limit else ""
        self.ended_message = (f"The hub stopped your server (Slurm job {self.job_id}): you logged out{limit}.")
        await super().stop(now=now)

    # the hub makes a new spawner object after a stop: how the last job ended travels in the saved state
    def get_state(self):
        state = super().get_state()
        if self.ended_message:
            state["ended_message"] = self.ended_message
        return state

    def load_state(self, state):
        super().load_state(state)
        self.ended_message = state.get("ended_message", "")

    # ------------------------------------------------------------------ facts about a job
    async def job_fields(self, job: str) -> dict[str, str]:
        """`scontrol show job` of `job` (finished jobs stay there MinJobAge seconds); {} when Slurm forgot it."""
        try:
            proc = await asyncio.create_subprocess_exec(
                "scontrol", "show", "job", "-o", job, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT)
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=15)
        except (OSError, asyncio.TimeoutError) as e:
            self.log.warning("scontrol show job %s: %s", job, e)
            return {}
        return slurm_fields(out.decode(errors="replace")) if proc.returncode == 0 else {}

    def job_log(self, job: str, lines: int) -> str:
        path = Path(self.req_homedir) / f".jupyterhub-{job}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e.strerror})"
