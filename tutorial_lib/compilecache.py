"""The compile cache a workshop shares: torch.compile's work done once, ahead of the day, and found by every run.

A compiled run's first step traces the model, lowers it and compiles its kernels (Triton on a GPU, C++ on a CPU):
20-60 s on a GPU before anything trains, for every learner and every compiled rung. PyTorch keeps what it compiled
in on-disk caches (TORCHINDUCTOR_CACHE_DIR: FX graphs, AOT autograd, C++ kernels; TRITON_CACHE_DIR: GPU kernels)
and can pack it into one file (its "mega-cache", torch.compiler.save_cache_artifacts). `make warm` (python -m
tutorial_lib warm, lessons/warm.py) compiles the workbook's compiled configurations into one folder; a run with
compile=true then uses it (`use`, called by engine.prepared_run before anything compiles):

- a folder it may write: both caches point into it (DIR/inductor, DIR/triton), so hits are whole and what
  this run compiles anew is there for the next one;
- a folder it may only read (the hub's shared copy, or WORKBOOK_COMPILE_CACHE_READONLY=1): its own caches stay
  torch's per-user default and the mega-cache files warmed for this torch and this device are loaded into them.

Which folder: $WORKBOOK_COMPILE_CACHE (off, none or 0: none), else a site profile's `compile_cache` (a job
exports it; the face passes it here), else the hub's shared folder $WORKBOOK_HUB_HOME/compile-cache
(/opt/hpc-workbook/compile-cache) once it exists; else none: torch's own per-user cache in /tmp.
DIR/manifest.json says what was warmed (torch version, device, each configuration's first step); the doctor's
`compile_cache` line reads it. No torch at import: the doctor reads the manifest without it.
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from .config import UserError
from .results import atomic_write_text, read_record

ENV = "WORKBOOK_COMPILE_CACHE"
READONLY_ENV = "WORKBOOK_COMPILE_CACHE_READONLY"
MANIFEST = "manifest.json"
OFF = ("off", "none", "0", "false")


def default_dir() -> Path:
    """The hub's shared folder for it (scripts/hub: $WORKBOOK_HUB_HOME, /opt/hpc-workbook)."""
    return Path(os.environ.get("WORKBOOK_HUB_HOME") or "/opt/hpc-workbook") / "compile-cache"


def where(site_dir: str | None = None, site_name: str | None = None) -> tuple[Path | None, str]:
    """(the cache folder or None, where that choice came from). `site_dir`: a site profile's compile_cache."""
    value = (os.environ.get(ENV) or "").strip()
    if value.lower() in OFF:
        return None, f"${ENV}={value} (off)"
    if value:
        return Path(value).expanduser().absolute(), f"${ENV}"
    if site_dir:
        return Path(os.path.expandvars(site_dir)).expanduser().absolute(), f"site profile {site_name!r}"
    if default_dir().is_dir():
        return default_dir(), "the hub's shared folder"
    return None, f"none set (${ENV}, a site profile's compile_cache, or {default_dir()} once it exists)"


def writable(folder: Path) -> bool:
    """This process may add to `folder` (made if missing), unless $WORKBOOK_COMPILE_CACHE_READONLY is set."""
    if (os.environ.get(READONLY_ENV) or "").strip().lower() not in ("", *OFF):
        return False
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def tag(torch_version: str, device: str) -> str:
    """The name of a torch version and device's mega-cache files: torch-2.14.1_cu130-nvidia_h100_80gb_hbm3."""
    return re.sub(r"[^a-z0-9_.-]+", "_", f"torch-{torch_version}-{device}".lower()).strip("_")


def this_device() -> str:
    import torch  # only a run that compiles asks

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def use() -> str | None:
    """Point this process's compile caches at the shared folder (see the module's docstring) before anything
    compiles; one line saying what it did, or None when no folder is set."""
    folder, source = where()
    if folder is None:
        return None
    if writable(folder):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
        os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
        return f"compile cache: {folder} ({source})"
    import torch  # only a compiled run gets here

    files = sorted((folder / "megacache" / tag(torch.__version__, this_device())).glob("*.bin"))
    loaded = sum(load_artifacts(path) for path in files)
    if not files:
        return (f"compile cache: {folder} ({source}, read-only) holds nothing warmed for torch {torch.__version__} on "
                f"{this_device()}: this run compiles from scratch")
    return f"compile cache: {folder} ({source}, read-only): {loaded} artifacts of {len(files)} warmed runs loaded"


def load_artifacts(path: Path) -> int:
    """Load one mega-cache file into this process's caches; the number of artifacts it held (0: none usable)."""
    import torch  # only a compiled run gets here

    if not hasattr(torch.compiler, "load_cache_artifacts"):  # torch < 2.7: only the shared folder itself helps
        return 0
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except (OSError, RuntimeError, ValueError) as e:
        print(f"compile cache: {path} not loaded ({type(e).__name__}: {e}); compiling instead", flush=True)
        return 0
    return sum(len(keys) for keys in info.artifacts.values()) if info is not None else 0


def save_artifacts(folder: Path, name: str) -> Path | None:
    """Write what this process compiled as one mega-cache file, DIR/megacache/<tag>/<name>.bin (None: nothing)."""
    import torch  # the warming process has compiled

    if not hasattr(torch.compiler, "save_cache_artifacts"):
        return None
    saved = torch.compiler.save_cache_artifacts()
    if saved is None or not saved[0]:
        return None
    path = folder / "megacache" / tag(torch.__version__, this_device()) / f"{name}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(saved[0])
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------- the manifest
def read_manifest(folder: Path) -> dict:
    """DIR/manifest.json: {"entries": {tag: {"torch", "device", "updated", "configs": {name: figures}}}}."""
    path = folder / MANIFEST
    if not path.is_file():
        return {"entries": {}}
    return read_record(path, "a compile cache manifest", "delete it and run make warm again", {"entries": dict})


def record(folder: Path, name: str, torch_version: str, device: str, figures: dict) -> Path:
    """Note in the manifest that configuration `name` was warmed for this torch and device, with its figures."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(folder)
    entry = manifest["entries"].setdefault(tag(torch_version, device),
                                           {"torch": torch_version, "device": device, "configs": {}})
    entry["configs"][name] = figures
    entry["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def share(folder: Path) -> None:
    """Every file of `folder` readable and every folder in it enterable by everyone: the learners' servers read it
    (a file this user does not own is left as it is)."""
    for root, dirs, names in os.walk(folder):
        for path, bits in [(root, 0o555), *((os.path.join(root, d), 0o555) for d in dirs),
                           *((os.path.join(root, n), 0o444) for n in names)]:
            try:
                mode = os.lstat(path).st_mode
                if mode & bits != bits and not os.path.islink(path):
                    os.chmod(path, mode | bits)
            except OSError:
                pass


def size_bytes(folder: Path) -> int:
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total
