"""For every pytest run of the workbook (tests/ and notebooks/ under nbval): processes the run starts are
stopped when it ends. TensorBoards started by tests and by the notebooks' kernels (which inherit this
environment) are recorded in build/test-state, not in the user's own state, and stopped at the end."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("KINETO_LOG_LEVEL", "99")
os.environ.setdefault("WORKBOOK_STATE_DIR", str(ROOT / "build" / "test-state"))


def pytest_sessionfinish(session, exitstatus):
    from tutorial_lib import tensorboard

    tensorboard.stop()  # every TensorBoard recorded in WORKBOOK_STATE_DIR: those this session started
