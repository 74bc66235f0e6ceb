"""For every pytest run of the workbook (tests/ and notebooks/ under nbval): processes the run starts are
stopped when it ends. TensorBoards started by tests and by the notebooks' kernels (which inherit this
environment) are recorded in build/test-state, not in the user's own state, and stopped at the end.

`make test` runs the files on several pytest-xdist workers, a whole file on one worker (--dist loadfile: a
notebook's cells share one kernel, a module's fixtures one process). Each worker keeps its own state folder,
build/test-state/<worker>, so that a worker that ends stops only its own TensorBoards."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent
os.environ.setdefault("KINETO_LOG_LEVEL", "99")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # set by pytest-xdist before it reads this file
os.environ.setdefault("WORKBOOK_STATE_DIR", str(ROOT / "build" / "test-state" / (_WORKER or "")))

# The files that take longest on a 2-core machine, longest first (the slowest tests --durations prints): the
# workers take files in collection order, so these start first and the short ones fill the gaps at the end.
SLOW_FIRST = [
    "tests/test_slurm.py", "tests/test_hub.py", "notebooks/04_mixed_precision.ipynb",
    "notebooks/05_dp_vs_ddp.ipynb", "notebooks/06_scaling.ipynb", "tests/test_browser.py",
    "tests/test_slurm_fsdp.py", "tests/test_slurm_signals.py", "notebooks/01_single_gpu.ipynb",
    "notebooks/03_data_loading.ipynb", "notebooks/08_when_it_does_not_fit.ipynb", "tests/test_jobs.py",
    "tests/test_fsdp.py", "tests/test_compile_cache.py", "tests/test_bench.py", "tests/test_jobs_05.py",
    "tests/test_studies_05_06.py", "tests/test_studies.py", "tests/test_ddp.py", "tests/test_card.py",
]


def pytest_collection_modifyitems(session, config, items):
    """The files of SLOW_FIRST first, in its order; the others after them, in their own order."""
    rank = {name: n for n, name in enumerate(SLOW_FIRST)}

    def key(item):
        path = Path(str(item.fspath)).resolve()
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        return rank.get(name, len(rank))
    items[:] = sorted(items, key=key)  # sorted is stable: a file's items keep their order


def pytest_sessionfinish(session, exitstatus):
    from tutorial_lib import tensorboard

    tensorboard.stop()  # every TensorBoard recorded in WORKBOOK_STATE_DIR: those this session started
