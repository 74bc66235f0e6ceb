"""For every pytest run of the workbook (tests/ and notebooks/ under nbval): processes the run starts are
stopped when it ends. TensorBoards started by tests and by the notebooks' kernels (which inherit this
environment) are recorded in build/test-state/<worker>, not in the user's own state, and stopped at the end.

`make test` runs two pytest-xdist workers (much of the suite waits on Slurm jobs, browsers and subprocesses).
Each test file, and each notebook, runs whole on one worker, in its order, as a plain pytest run would run it;
the files that submit to the local Slurm cluster share one worker, so their jobs never queue behind each other's."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("KINETO_LOG_LEVEL", "99")
os.environ.setdefault("WORKBOOK_STATE_DIR",
                      str(ROOT / "build" / "test-state" / os.environ.get("PYTEST_XDIST_WORKER", "main")))
SLURM_FILES = {"test_slurm.py", "test_slurm_signals.py", "test_slurm_binding.py", "test_jobs_05.py",
               "test_hang_drill.py", "test_hub.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """One xdist group per file (for --dist loadgroup), the Slurm files one group together."""
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("slurm" if name in SLURM_FILES else name))


def pytest_sessionfinish(session, exitstatus):
    from tutorial_lib import tensorboard

    tensorboard.stop()  # every TensorBoard recorded in WORKBOOK_STATE_DIR: those this session started
