""".ci/run measures a newcomer's `make test`: it starts from empty compile caches (torch's and the workbook's) and
leaves the caches of the machine it runs on as they were."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

# A `make` that reports what `make test` would have found: its arguments, the cache variables, what the cache folders
# hold; and writes into torch's cache, as a compiled test would
FAKE_MAKE = """#!/usr/bin/env bash
{
  echo "args=$*"
  echo "inductor=$TORCHINDUCTOR_CACHE_DIR"
  echo "triton=$TRITON_CACHE_DIR"
  echo "workbook=$WORKBOOK_COMPILE_CACHE"
  echo "inductor_files=$(find "$TORCHINDUCTOR_CACHE_DIR" -type f 2>/dev/null | wc -l)"
  echo "triton_files=$(find "$TRITON_CACHE_DIR" -type f 2>/dev/null | wc -l)"
} > "$REPORT"
mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && echo kernel > "$TORCHINDUCTOR_CACHE_DIR/kernel.so"
exit "${FAKE_STATUS:-0}"
"""


def _ci_run(tmp_path: Path, status: int) -> tuple[subprocess.CompletedProcess, dict]:
    clone, bin_dir = tmp_path / "clone", tmp_path / "bin"
    (clone / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", clone / ".ci" / "run")
    bin_dir.mkdir()
    (bin_dir / "make").write_text(FAKE_MAKE)
    (bin_dir / "make").chmod(0o755)
    warm = tmp_path / "warm"  # the caches this machine holds: warm, and chosen by the caller's variables
    (warm / "inductor").mkdir(parents=True)
    (warm / "inductor" / "old.so").write_text("compiled before")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REPORT": str(tmp_path / "report"),
           "FAKE_STATUS": str(status), "TMPDIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(warm / "inductor"),
           "TRITON_CACHE_DIR": str(warm / "triton"), "WORKBOOK_COMPILE_CACHE": str(warm / "workbook")}
    p = subprocess.run(["bash", str(clone / ".ci" / "run")], capture_output=True, text=True, env=env, timeout=60)
    report = dict(line.split("=", 1) for line in (tmp_path / "report").read_text().splitlines())
    return p, report


@pytest.mark.parametrize("status", [0, 2], ids=["passed", "failed"])
def test_ci_runs_make_test_from_empty_compile_caches_and_leaves_the_machines_alone(tmp_path, status):
    p, report = _ci_run(tmp_path, status)
    assert p.returncode == status, p.stdout + p.stderr
    assert report["args"] == "test"
    inductor, triton = Path(report["inductor"]), Path(report["triton"])
    assert inductor.parent == triton.parent and inductor.parent.parent == tmp_path  # a new folder of its own
    assert report["inductor_files"] == report["triton_files"] == "0"  # empty when make test starts
    assert report["workbook"] == "off"  # the workbook's shared folder is neither read nor filled
    assert not inductor.parent.exists(), "the run's own caches are left behind"
    assert (tmp_path / "warm" / "inductor" / "old.so").read_text() == "compiled before"  # the machine's: untouched
    assert "compile caches: empty" in p.stdout
