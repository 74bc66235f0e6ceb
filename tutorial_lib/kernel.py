"""The workbook's Jupyter kernel, *Python (HPC workbook)*: ipykernel, started with what `%tensorboard` needs.

    python -m tutorial_lib.kernel install [--env NAME VALUE ...]   # register it for this user (make kernel)
    python -m tutorial_lib.kernel -f CONNECTION_FILE                # what Jupyter runs (the kernel spec's argv)

A kernel spec's `env` is written once, but each JupyterHub user's server has its own prefix
(JUPYTERHUB_SERVICE_PREFIX, /user/<name>/). So the kernel sets TENSORBOARD_PROXY_URL when it starts, from that
prefix: `%tensorboard` in any notebook run in this kernel, not only the workbook's, then shows its page through
the server's proxy instead of at 127.0.0.1, which a hub user's browser can't reach. The environment's bin/ goes
first on PATH too, as `%tensorboard` runs `tensorboard`. Then ipykernel's own launcher takes the process over.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .config import UserError
from .results import atomic_write_text
from .tensorboard import proxy_prefix

NAME, DISPLAY = "hpc-workbook", "Python (HPC workbook)"
USAGE = "usage: python -m tutorial_lib.kernel install [--env NAME VALUE ...] | -f CONNECTION_FILE"


def kernel_env() -> dict:
    """What the kernel adds to its environment: TENSORBOARD_PROXY_URL on JupyterHub (a value already set is kept),
    and this environment's bin/ first on PATH."""
    add = {}
    bin_dir, path = str(Path(sys.executable).parent), os.environ.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        add["PATH"] = os.pathsep.join(p for p in (bin_dir, path) if p)
    if os.environ.get("JUPYTERHUB_SERVICE_PREFIX") and not os.environ.get("TENSORBOARD_PROXY_URL"):
        add["TENSORBOARD_PROXY_URL"] = proxy_prefix() + "%PORT%/"  # the hub's prefix: no server to ask
    return add


def install(env: dict) -> Path:
    """Register the kernel for this user (ipykernel's spec, its argv starting this module instead of
    ipykernel_launcher); `env`: variables the kernel spec sets (PYTHONPATH of a clone run from a shared Python).
    Refused, with the fix, when the kernel could not import the workbook."""
    from ipykernel.kernelspec import install as ipykernel_install

    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([sys.executable, "-c", "import tutorial_lib.kernel"], cwd="/", env={**clean, **env},
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        raise UserError(f"{sys.executable} can't import tutorial_lib outside the workbook's folder, so the kernel "
                        f"would not start: from the top of your clone run python -m tutorial_lib.kernel install "
                        f"--env PYTHONPATH \"$PWD\" (or pip install -e . into this environment)")
    folder = Path(ipykernel_install(user=True, kernel_name=NAME, display_name=DISPLAY, env=env or None))
    spec = json.loads((folder / "kernel.json").read_text())
    spec["argv"][spec["argv"].index("ipykernel_launcher")] = "tutorial_lib.kernel"
    atomic_write_text(folder / "kernel.json", json.dumps(spec, indent=1) + "\n")
    return folder


def main(argv: list[str]) -> int:
    """`install [--env NAME VALUE ...]`: register the kernel; anything else: ipykernel's arguments, the kernel
    started with kernel_env."""
    if argv[:1] == ["install"]:
        rest, env = argv[1:], {}
        while rest[:1] == ["--env"] and len(rest) >= 3:
            env[rest[1]], rest = rest[2], rest[3:]
        if rest:
            print(f"{USAGE}\n(not understood: {' '.join(rest)})", file=sys.stderr)
            return 2
        try:
            folder = install(env)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"registered the kernel {DISPLAY!r} ({NAME}) in {folder}: it sets TENSORBOARD_PROXY_URL on JupyterHub")
        return 0
    os.environ.update(kernel_env())
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])
    return 0  # not reached: the launcher has taken the process over


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
