"""The hang drill (notebook 05): one rank of a small DDP run freezes before a step's collective; the others wait
in that collective until `dist_timeout_s` runs out, and the run fails. Then the diagnosis: each rank's last
words (tutorial_lib/lastwords.py: its last completed step and the phase it was in) and PyTorch's flight recorder
(every rank's record of its collectives, read by torch's own reader, `torchfrtrace`) name the rank that stopped
and the collective the others waited in.

    report = tl.hang.drill(cfg, nproc=2, freeze_rank=1, at_step=3, dist_timeout_s=10)
    print(report)                                   # which rank, which collective, how long it took
    python -m tutorial_lib hang runs/my_job         # the same report for a job that hung on a cluster

The frozen rank is the drill's own doing (`freeze`, run by `python -m tutorial_lib drill` on each rank): the
training loop is the engine's, untouched.
"""
from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import lastwords
from ..config import TrainConfig, UserError
from ..results import read_record, shape_problem

FROZEN = "frozen by the drill (no collective)"
FR_PREFIX = "rank_"  # the flight recorder's files: <out_dir>/flight_recorder/rank_<R>


DUMP_WAIT_MS = 2000  # the dump of 2000 records takes well under a second: 4 x 2 s = 8 s after the timeout


def flight_recorder_env(out_dir: str | Path) -> dict:
    """The environment that turns PyTorch's flight recorder on for a run in `out_dir`: a record of each rank's
    last 2000 collectives, dumped into <out_dir>/flight_recorder/rank_<R> when a collective times out (NCCL does
    it itself; with gloo the workbook does: lastwords.py). torch >= 2.7 names the first two TORCH_FR_*."""
    import torch

    prefix = str(Path(out_dir).resolve() / "flight_recorder" / FR_PREFIX)
    new = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) >= (2, 7)
    return {("TORCH_FR_BUFFER_SIZE" if new else "TORCH_NCCL_TRACE_BUFFER_SIZE"): "2000",
            ("TORCH_FR_DUMP_TEMP_FILE" if new else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"): prefix,
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            # after a timeout NCCL's watchdog waits 4x this for every rank's dump before it ends the process: 60 s
            # by default, measured on 2 H100s as a run that failed 80 s after the freeze with dist_timeout_s=20
            "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": str(DUMP_WAIT_MS)}


def record_collectives(out_dir: str | Path, environ=None) -> None:
    """Turn the flight recorder on for a DDP run in `out_dir` (what `python -m tutorial_lib train` does for
    parallel=ddp, before the process group starts): flight_recorder_env's variables, where not already set
    (TORCH_FR_BUFFER_SIZE=0 turns it off)."""
    import os

    environ = os.environ if environ is None else environ
    for name, value in flight_recorder_env(out_dir).items():
        environ.setdefault(name, value)
    try:  # NCCL writes its dumps into this folder but does not make it
        (Path(out_dir) / "flight_recorder").mkdir(parents=True, exist_ok=True)
    except OSError:  # the run itself says why it can't write there
        pass


# ---------------------------------------------------------------------------------------- on each rank
class DrillStopped(UserError):
    """The frozen rank was told to stop (torchrun stops every rank once one has failed)."""


def freeze(run, rank: int, at_step: int, most_s: float) -> None:
    """Make `run` (an engine.Run) freeze on rank `rank` before step `at_step`: that rank stays in FROZEN, out of
    every collective, until it is told to stop (SIGTERM: torchrun's, once another rank failed) or `most_s`
    seconds have passed. The other ranks run on into the step's collective and wait there."""
    if run.env.rank != rank:
        return
    step = run.train_step

    def frozen_step(x, y):
        if run.step + 1 != at_step:
            return step(x, y)
        with lastwords.phase(FROZEN):
            deadline = time.monotonic() + most_s
            while not run.stop_requested and time.monotonic() < deadline:
                time.sleep(0.05)
            raise DrillStopped(f"rank {rank}: frozen by the drill before step {at_step}, then stopped by "
                               f"{run.stop_signal or f'the drill after {most_s:.0f} s'}")
    run.train_step = frozen_step


def rank_main(cfg: TrainConfig, freeze_rank: int, at_step: int) -> None:
    """What `python -m tutorial_lib drill` runs on every rank: the engine's run of `cfg`, `freeze_rank` frozen."""
    from .. import engine

    with engine.prepared_run(cfg) as run:
        freeze(run, freeze_rank, at_step, most_s=3 * cfg.dist_timeout_s + 30)
        run.fit()


# ---------------------------------------------------------------------------------------- the drill
def drill(cfg: TrainConfig, nproc: int = 2, freeze_rank: int = 1, at_step: int = 3,
          dist_timeout_s: int = 10) -> "HangReport":
    """Run `cfg` as DDP on `nproc` processes (tl.launch) with the flight recorder on and rank `freeze_rank`
    frozen before step `at_step`; the run must fail once `dist_timeout_s` has run out. Returns the diagnosis
    read from the run's folder (`report`), with the seconds from the freeze to the end of the run."""
    from ..launcher import launch

    if not 0 <= freeze_rank < nproc:
        raise UserError(f"freeze_rank={freeze_rank} is not one of the ranks 0..{nproc - 1}; pick one below nproc")
    cfg = cfg.replace(parallel="ddp", dist_timeout_s=dist_timeout_s, steps=max(cfg.steps or 0, at_step + 2),
                      resume=False, eval=False, ckpt_every=0)
    out = Path(cfg.out_dir)
    for old in (out / "ranks", out / "flight_recorder"):  # an earlier drill's files would mislead the reader
        shutil.rmtree(old, ignore_errors=True)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # torchrun's own account of the failure: shown below, shortened
        try:
            launch(cfg, nproc, extra_env=flight_recorder_env(out), timeout=3 * dist_timeout_s + 120,
                   command="drill", args=("--freeze-rank", str(freeze_rank), "--at-step", str(at_step)))
        except UserError as e:
            said = str(e)
        else:
            raise UserError(f"the drill's run finished: rank {freeze_rank} did not freeze (at_step={at_step} is "
                            f"past the run's {cfg.steps} steps?)")
    ended = time.time()
    report = read_report(out)
    frozen = report.rank(freeze_rank)
    report.after_freeze_s = ended - frozen["phase_since"] if frozen and frozen.get("phase_since") else None
    report.dist_timeout_s, report.log = dist_timeout_s, said
    return report


# ---------------------------------------------------------------------------------------- the diagnosis
@dataclass
class HangReport:
    """What a failed (or hanging) run's folder says: each rank's last words, the ranks that stopped, the
    collective the others waited in, and the flight recorder's reading."""
    out_dir: str
    words: list = field(default_factory=list)  # each rank's last words (lastwords.py), by rank
    suspects: list = field(default_factory=list)  # the ranks that stopped answering
    waited_in: str | None = None  # the phase / collective the other ranks failed in
    flight_recorder: str = ""  # torchfrtrace's analysis, or why there is none
    fr_missing_ranks: list | None = None  # the ranks the flight recorder found missing from a collective
    fr_collective: str | None = None  # that collective (e.g. gloo:all_reduce, sequence number 5)
    after_freeze_s: float | None = None  # the drill: seconds from the freeze to the end of the run
    dist_timeout_s: int | None = None
    log: str = ""  # the drill: what torchrun's failure said (the last lines of the ranks' output)

    def rank(self, r: int) -> dict | None:
        return next((w for w in self.words if w["rank"] == r), None)

    def __str__(self) -> str:
        if self.ended():  # no hang: the hang's commands would send the reader looking for one
            return "\n".join([*self.table(), "", self.verdict()])
        return "\n".join([*self.table(), "", self.verdict(), "", "flight recorder (torchfrtrace):",
                          self.flight_recorder, "", *commands(self)])

    def table(self) -> list[str]:
        rows = [f"{'rank':>4}  {'host':<12} {'pid':>7}  {'state':<8} {'steps done':>10}  for (s)  phase"]
        for w in self.words:
            spent = "" if not w.get("phase_since") else f"{w['written'] - w['phase_since']:.1f}"
            rows.append(f"{w['rank']:>4}  {w['host'][:12]:<12} {w['pid']:>7}  {w['state']:<8} "
                        f"{w['step_completed']:>10}  {spent:>7}  {_phase(w)}")
        return rows

    def verdict(self) -> str:
        ended = self.ended()
        if ended:
            return ended
        if not self.suspects:
            return "no rank stands out: every rank failed in the same place (see the flight recorder)"
        names = ", ".join(map(str, self.suspects))
        w = self.rank(self.suspects[0])
        line = (f"rank{'s' * (len(self.suspects) > 1)} {names} stopped answering: last completed step "
                f"{w['step_completed']}, then in '{w['phase']}'")
        if self.waited_in:
            line += f"; the other ranks waited in '{self.waited_in}' until the timeout"
        if self.fr_missing_ranks is not None:
            agree = "agrees" if sorted(self.fr_missing_ranks) == sorted(self.suspects) else "differs"
            line += (f". The flight recorder {agree}: {self.fr_collective} is missing rank"
                     f"{'s' * (len(self.fr_missing_ranks) > 1)} {', '.join(map(str, self.fr_missing_ranks))}")
        return line


    def ended(self) -> str | None:
        """What the last words say when no rank hung: every rank finished, was stopped by a signal, or failed
        with an error of its own (not a collective's timeout); else None."""
        states, steps = {w["state"] for w in self.words}, sorted({w["step_completed"] for w in self.words})
        at = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        if states == {"finished"}:
            return f"the run finished normally: every rank completed {at}; there is no hang to explain"
        if states == {"stopped"}:
            return (f"the run was stopped by a signal (scancel, a time limit) at {at}, with a checkpoint: no "
                    "hang; run the same command again to continue")
        errors = {(w["failure"] or {}).get("error") for w in self.words}
        if states == {"failed"} and None not in errors and not any(w["failure"]["collective"] for w in self.words):
            first = self.words[0]
            return (f"every rank failed with an error of its own at {at}, none in a collective: not a hang "
                    f"(rank {first['rank']}: {first['failure']['error'][:70]})")
        return None


def _phase(w: dict) -> str:
    failure = w.get("failure")
    if failure and failure.get("collective"):
        said = re.sub(r"^\[[^\]]*\]\s*", "", failure["error"])  # gloo's source file and line: no help here
        return f"{failure['in']}: {said[:90]}"
    return w["phase"]


def read_report(out_dir: str | Path) -> HangReport:
    """The diagnosis of the run in `out_dir` from its files: <out_dir>/ranks/rank*.json and, when the flight
    recorder was on, <out_dir>/flight_recorder/ (read with torch's reader)."""
    out = Path(out_dir)
    files = sorted((out / "ranks").glob("rank*.json"))
    if not files:
        raise UserError(f"no last words in {out / 'ranks'}: give the out_dir of a run of the workbook's engine "
                        "(every rank writes ranks/rank<R>.json there while it runs)")
    words = sorted(map(last_words, files), key=lambda w: w["rank"])
    report = HangReport(str(out), words)
    timed_out = [w for w in words if (w.get("failure") or {}).get("collective")]
    others = [w for w in words if w not in timed_out] or words
    low = min(w["step_completed"] for w in others)
    report.suspects = [w["rank"] for w in others if w["step_completed"] == low and w["state"] != "finished"]
    report.waited_in = timed_out[0]["failure"]["in"] if timed_out else None
    _read_flight_recorder(report, out / "flight_recorder", words[0].get("world_size", len(words)))
    return report


NUMBER, MAYBE = (int, float), (int, float, type(None))
WORDS = {"rank": int, "world_size": int, "host": str, "pid": int, "state": str, "step_completed": int,
         "phase": str, "phase_since": MAYBE, "written": NUMBER, "failure": (dict, type(None))}  # lastwords.words
FAILURE = {"in": str, "collective": (str, type(None)), "error": str}


def last_words(path: Path) -> dict:
    """One rank's last words (lastwords.py), or a one-line UserError naming the file when it is damaged (a copy
    cut short, a file of something else): what `hang` can't read, it says so rather than guess."""
    fix = (f"move it out of {path.parent} and run hang again: the other ranks' files still tell where they "
           "stopped")
    words = read_record(path, "a rank's last words", fix, WORDS)
    problem = words["failure"] is not None and shape_problem(words["failure"], FAILURE)
    if problem:
        raise UserError(f"{path}: its failure {problem}, so it is not a rank's last words; {fix}")
    return words


def _read_flight_recorder(report: HangReport, folder: Path, world_size: int) -> None:
    dumps = sorted(p for p in folder.glob(f"{FR_PREFIX}*") if p.name[len(FR_PREFIX):].isdigit())
    if not dumps:
        report.flight_recorder = (f"no dumps in {folder}: no collective timed out, or the flight recorder was "
                                  "off (set the variables of tl.hang.flight_recorder_env before the run starts)")
        return
    words = ["--allow-incomplete-ranks"] if len(dumps) < world_size else []
    said, failed = _fr_trace(folder, words)
    note = ""
    if failed and said and "name formatting error" in said[-1] and _renamed_gloo(dumps, None):
        # An older reader (torch 2.11's) knows NCCL's names only and stops at gloo's ("gloo:broadcast"): it
        # reads the same records under NCCL's names, and its answer is given back in gloo's.
        with tempfile.TemporaryDirectory() as tmp:
            _renamed_gloo(dumps, Path(tmp))
            said, failed = _fr_trace(Path(tmp), words)
        said = [l.replace("nccl:", "gloo:") for l in said]
        note = "(this torch's reader knows NCCL's records only: it read gloo's under NCCL's names)"
    if failed:  # the reader itself failed: its error, not its stack
        import torch

        report.flight_recorder = (f"the reader failed on these dumps (torch {torch.__version__}): "
                                  f"{said[-1] if said else 'no output'}; the ranks' last words "
                                  f"above still name the rank that stopped (the dumps are in {folder})")
        return
    report.flight_recorder = "\n".join(said[:20] + [note] * bool(note)) or \
        "(the reader found every collective joined by every rank)"
    text = "\n".join(said)
    missing = re.search(r"missing ranks: \{([\d, ]*)\}", text)
    if missing:
        report.fr_missing_ranks = [int(r) for r in missing.group(1).split(",") if r.strip()]
        op = re.search(r"collective: (\S+)", text)
        seq = re.search(r"sequence number: (\d+)", text)
        report.fr_collective = f"{op.group(1) if op else 'a collective'} (sequence number {seq.group(1) if seq else '?'})"


def _fr_trace(folder: Path, words: list[str]) -> tuple[list[str], bool]:
    """torch's flight recorder reader (torchfrtrace) on the dumps in `folder`: its lines, and whether it failed."""
    run = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "-p",
                          FR_PREFIX, *words], capture_output=True, text=True, timeout=120)
    said = [_short_path(l) for l in (run.stdout + run.stderr).splitlines()
            if l.strip() and "tabulate is not installed" not in l]
    return said, run.returncode != 0


def _renamed_gloo(dumps: list[Path], into: Path | None) -> bool:
    """Whether the dumps hold gloo's records ("gloo:broadcast"); with `into`, copies of them there, each record
    under NCCL's name ("nccl:broadcast"), for a reader that knows no other."""
    import pickle

    gloo = False
    for path in dumps:
        record = pickle.loads(path.read_bytes())
        for entry in record.get("entries", []):
            name = str(entry.get("profiling_name", ""))
            if name.startswith("gloo:"):
                gloo, entry["profiling_name"] = True, "nccl:" + name[len("gloo:"):]
        if into is not None:
            (into / path.name).write_bytes(pickle.dumps(record))
    return gloo


def _short_path(line: str) -> str:
    """A stack frame's file as a reader wants it: from the package (site-packages/...) or the workbook's root."""
    from ..config import ROOT

    return re.sub(r"\S*/site-packages/", "", line.replace(f"{ROOT}/", ""))


def commands(report: HangReport) -> list[str]:
    """The three commands that diagnose a hang on a cluster, filled in for this run."""
    out = report.out_dir
    lines = ["on a cluster, while the job hangs or after it failed:",
             f"  1. python -m tutorial_lib hang {out}       # every rank's last words: who stopped, where",
             f"  2. torchfrtrace {out}/flight_recorder -p {FR_PREFIX}   # the flight recorder: which collective, "
             "which ranks missing"]
    for r in report.suspects[:2] or [0]:
        w = report.rank(r) or {"host": "<node>", "pid": "<pid>"}
        lines.append(f"  3. srun --jobid=$SLURM_JOB_ID --overlap -w {w['host']} py-spy dump --pid {w['pid']}"
                     f"   # rank {r}'s Python stack, live (pip install py-spy)")
    return lines
