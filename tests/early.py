"""Studies that tests read, started at idle priority as the session begins (tests/conftest.py): this suite keeps
both cores busy, except while a browser, a hub, Slurm or a single-threaded step is waited for, and a study
started early runs in those idle moments instead of in the foreground later. Each runs as its command line
(`python -m tutorial_lib study NAME --small --out DIR`); a module run alone starts its studies when it needs them.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the test module -> the studies it reads, with the intra-op threads each runs on (None: torch's default)
STUDIES = {
    "test_profiling.py": {"traces": 1},
    "test_studies.py": {"measure": 1, "spine": 1},
    "test_studies_05_06.py": {"dpddp": None, "ddp_probe": None, "scaling": None},
}

_STARTED: dict[str, tuple[Path, object, subprocess.Popen]] = {}


def start(module: str, tmp_path_factory, background: bool = False) -> None:
    """Start the studies `module` reads that are not running yet, all at once (each mostly runs its cases one
    after another in one process, and this machine has two cores); in the `background` at idle priority
    (SCHED_IDLE, inherited by their ranks), so that they get only the CPU time the running tests leave."""
    for name, threads in STUDIES[module].items():
        if name in _STARTED:
            continue
        folder = tmp_path_factory.mktemp(name)
        log = open(folder / "study.log", "w")
        env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
        _STARTED[name] = (folder, log, subprocess.Popen(
            [sys.executable, "-m", "tutorial_lib", "study", name, "--small", "--out", str(folder)], cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_idle_priority if background else None))


def _idle_priority() -> None:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def finished(module: str, name: str, tmp_path_factory) -> tuple[Path, str, list[Path]]:
    """Study `name` of `module` once it has ended well (started now if it was not started early): its output
    folder, what it printed, and the files its last line says it wrote."""
    start(module, tmp_path_factory)
    folder, log, proc = _STARTED[name]
    code = proc.wait(timeout=600)
    log.close()
    said = (folder / "study.log").read_text()
    assert code == 0, f"study {name} --small failed ({code}):\n{said[-3000:]}"
    done = [line for line in said.splitlines() if line.startswith(f"study {name} ") and " done in " in line]
    assert done, f"study {name} did not say it was done:\n{said[-3000:]}"
    wrote = done[-1].split("; wrote ", 1)[1]
    return folder, said, [Path(p) for p in re.split(r", ", wrote) if p.startswith("/")]
