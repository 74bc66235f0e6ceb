"""Starting processes: `tl.launch` runs a config as DDP through torchrun from a notebook cell (notebook 05),
streams the ranks' output into the cell, keeps its timeout and stops the ranks as Slurm stops a job; and
`python -m tutorial_lib.launcher` is torchrun for a run on one node with its stores on the loopback address.

torchrun's rendezvous store, and the store its ranks share, listen on every interface (PyTorch's own behaviour,
also under --standalone): anyone who reaches the node could talk to them while the run lasts. With
--standalone, `python -m tutorial_lib.launcher` runs torchrun itself (torch.distributed.run) with those stores
bound to 127.0.0.1 (and the ranks told to find them there): tl.launch and the one-node jobs of tl.jobs run it.
Across nodes the stores must be reachable from the other nodes: the multi-node jobs run torchrun as it is.
"""
from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import distributed
from .config import TrainConfig, UserError, usable_cpus
from .results import Result, load_result


def torchrun_command(cfg: TrainConfig, nproc: int, command: str = "train", args: tuple = (),
                     wrapper: tuple = ()) -> list[str]:
    """torchrun (on one node, its stores on 127.0.0.1: main below) and the CLI with the config as key=value:
    tl.launch's command, and the GPU studies' (lessons/cases). `wrapper`: a program each rank runs, which then
    runs the CLI in its place (the arguments it takes before the CLI's python), e.g. numa's --exec-bound."""
    start = [sys.executable, "-m", "tutorial_lib.launcher", "--standalone", f"--nproc_per_node={nproc}"]
    cli = ["-m", "tutorial_lib", command, *args, *cfg.to_overrides()]
    if wrapper:  # torchrun --no-python runs the wrapper as the rank's program
        return [*start, "--no-python", *wrapper, sys.executable, *cli]
    return [*start, *cli]


def launch(cfg: TrainConfig, nproc: int, extra_env: dict | None = None, timeout: float | None = None,
           command: str = "train", args: tuple = ()) -> Result | None:
    """Run `cfg` as DDP with `nproc` processes through torchrun, streaming their output into the cell
    (notebook 05). Returns the run's result (rank 0's result.json); command="bench" runs the bench on every
    rank instead (`args`: its options, e.g. ("--steps", "40")) and returns None: read <out_dir>/bench.json.

    Functions defined in a notebook can't be spawned, so the processes run the package's CLI
    (`-m tutorial_lib train`) with the config as key=value overrides; the line printed is the torchrun command
    that does the same from a shell (here torchrun runs with its stores on 127.0.0.1: see above). `timeout`
    (seconds, from the start): the processes are stopped then (as scancel stops a job: a training rank
    checkpoints) and the error says so; interrupting the cell stops them the same way."""
    if not (isinstance(nproc, int) and not isinstance(nproc, bool) and nproc > 0):
        raise UserError(f"nproc={nproc!r} must be a positive whole number: the processes to start, e.g. nproc=2")
    parallel = "fsdp" if cfg.parallel == "fsdp" else "ddp"  # the model sharded, or DDP
    words = torchrun_command(cfg.replace(parallel=parallel, progress=False), nproc, command, args)  # no bar in a pipe
    print("$ torchrun " + " ".join(words[3:]), flush=True)
    threads = max(1, usable_cpus() // nproc)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), **(extra_env or {})}
    proc = subprocess.Popen(words, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    lines, timed_out = stream_until(proc, timeout)
    if timed_out:
        raise UserError(f"torchrun did not finish within timeout={timeout} s: its processes were stopped (a rank "
                        f"that was training wrote a checkpoint in {cfg.out_dir}: launch the same config again to "
                        "continue); what they said:\n" + distributed.failure_lines(lines))
    if proc.returncode != 0:
        raise UserError(f"torchrun exited with code {proc.returncode}; what its processes said:\n"
                        + distributed.failure_lines(lines))
    return load_result(cfg.out_dir) if command == "train" else None


def stream_until(proc, timeout: float | None) -> tuple[list[str], bool]:
    """Print `proc`'s output as it comes, until it ends or `timeout` seconds have passed; then (also when the
    cell is interrupted) stop it with stop_processes. Its lines, and whether the timeout stopped it."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
    deadline, said = None if timeout is None else time.monotonic() + timeout, []
    try:
        while True:
            try:
                line = lines.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:  # the timeout
                stop_processes(proc)
                return said, True
            if line is None:
                proc.wait()
                return said, False
            said.append(line)
            print(line, end="", flush=True)
    except BaseException:  # KeyboardInterrupt: the cell was interrupted
        stop_processes(proc)
        raise


def stop_processes(proc, grace_s: float = 45) -> None:
    """Stop a torchrun started in a session of its own, as Slurm stops a job: SIGTERM to it (it passes it on to
    its ranks, which checkpoint and exit; it kills them after 30 s), then SIGKILL to whatever is left of it and
    every process below it after `grace_s` (those that are still the processes they were: same start time)."""
    below = {pid: _started(pid) for pid in _descendants(proc.pid)}
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    below.update({pid: _started(pid) for pid in _descendants(proc.pid)})
    for pid, started in below.items():
        if started is not None and _started(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _started(pid: int) -> str | None:
    """The start time of process `pid` (a PID reused by another process has another), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun's ranks live in sessions of their own), read from /proc."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    found, todo = [], [pid]
    while todo:
        below = todo.pop()
        children = [child for child, ppid in parent.items() if ppid == below]
        found += children
        todo += children
    return found


# ---------------------------------------------------------------------------- torchrun, its stores on 127.0.0.1
_LISTENERS: list = []  # the sockets the stores serve on: kept open for the life of the process


def loopback_stores() -> None:
    """From now on, every TCPStore server this process starts (torchrun's rendezvous store, the store it shares
    with its ranks) listens on 127.0.0.1 only: a socket bound there is handed to the store (master_listen_fd),
    which otherwise binds every interface."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend  # torchrun's own: only its process

    class LoopbackStore(dist.TCPStore):
        def __init__(self, host_name, port, *args, **kwargs):
            server = kwargs.get("is_master", args[1] if len(args) > 1 else False)
            if server and kwargs.get("master_listen_fd") is None:
                listener = socket.socket()
                listener.bind(("127.0.0.1", port))
                listener.listen(128)
                _LISTENERS.append(listener)
                host_name, port, kwargs["master_listen_fd"] = "127.0.0.1", listener.getsockname()[1], listener.fileno()
            super().__init__(host_name, port, *args, **kwargs)

    dist.TCPStore = c10d_rendezvous_backend.TCPStore = LoopbackStore


def main(argv: list[str]) -> None:
    """`python -m tutorial_lib.launcher ARGS`: torchrun ARGS; with --standalone (one node) its stores listen on
    127.0.0.1 and the ranks find them there (--local-addr)."""
    from torch.distributed import run  # torchrun's own: only this process needs it

    if "--standalone" in argv:
        loopback_stores()
        if not any(a.startswith(("--local-addr", "--local_addr")) for a in argv):
            argv = ["--local-addr=127.0.0.1", *argv]
    sys.argv[0] = "torchrun"
    run.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
