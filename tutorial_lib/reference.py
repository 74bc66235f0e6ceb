"""Reference figures: what a cell printed on a GPU, for notebooks whose committed outputs come from a CPU.

A GPU script (scripts/gpu/*.sh) runs the lesson on a real card and writes `notebooks/reference/<name>.json`:

    {"card": "NVIDIA H200", "gpus": 4, "torch": "2.11.0+cu130", "date": "2026-11-26",
     "script": "scripts/gpu/mixed_precision.sh", "figures": {"fp32_img_s": 8938.2, ...}}

How figures get there: a notebook cell that measures something calls `tl.reference.record(name, key=value)`.
On a CPU (CI, laptops) that does nothing. Under the GPU runner (scripts/gpu/notebooks.sh sets
WORKBOOK_REFERENCE_DIR) it adds the figures to <that dir>/<name>.json, and the runner stores a fingerprint of
every cell that records into `name` ("cells"), so a test can tell when a notebook changed after its reference
run. A cell shows them with `tl.reference.show(name, ...)`: the figures always carry the card, the torch
version and the date of the run that produced them; nothing is typed by hand. No torch imported at module level.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from .config import ROOT, UserError
from .results import atomic_write_text, read_record

FOLDER = ROOT / "notebooks" / "reference"
KEYS = ("card", "gpus", "torch", "date", "script", "figures")
SHAPE = {**dict.fromkeys(KEYS, object), "gpus": int, "script": str, "figures": dict}  # what its readers rely on
ENV = "WORKBOOK_REFERENCE_DIR"  # set by the GPU runner: record() writes there


def path(name: str, folder: str | os.PathLike | None = None) -> Path:
    return Path(folder or FOLDER) / f"{name}.json"


def load(name: str, folder: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The reference record `name`, or None when no GPU run has written it yet."""
    p = path(name, folder)
    if not p.is_file():
        return None
    return read(p)


def read(p: str | os.PathLike, fix: str = "run its GPU script again (the 'script' named in it, or scripts/gpu/), "
         "or write it with tl.reference.write") -> dict[str, Any]:
    """The reference record in the file `p`, or a one-line UserError naming it and `fix` (results.read_record)."""
    return read_record(p, "a reference record", fix, SHAPE)


def write(name: str, figures: dict[str, Any], *, script: str, card: str | None = None, gpus: int | None = None,
          torch_version: str | None = None, folder: str | os.PathLike | None = None) -> Path:
    """Record `figures` measured on this machine's GPU (card, count and torch version are read here)."""
    if card is None or gpus is None or torch_version is None:
        import torch  # only the GPU scripts call write(); notebooks and login nodes only read

        if not torch.cuda.is_available() and card is None:
            raise UserError("reference.write records GPU figures, but no CUDA GPU is visible here")
        card = card or torch.cuda.get_device_name(0)
        gpus = torch.cuda.device_count() if gpus is None else gpus
        torch_version = torch_version or torch.__version__
    entry = {"card": card, "gpus": gpus, "torch": torch_version, "date": datetime.date.today().isoformat(),
             "script": script, "host": host_cpu(), "figures": figures}
    p = path(name, folder)
    old = load(name, folder) if p.is_file() else None
    if old and "cells" in old:
        entry["cells"] = old["cells"]
    p.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(p, json.dumps(entry, indent=1, sort_keys=False) + "\n")


def host_cpu(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str | None:
    """'AMD EPYC 9454 48-Core Processor, 16 CPUs' for this node: a launch-bound step's figure depends on the CPU
    that queues its kernels as much as on the GPU, so two records on one card can differ by their hosts.
    None where the model is not readable (not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return f"{' '.join(model.group(1).split())}, {len(os.sched_getaffinity(0))} CPUs" if model else None


def record(name: str, **figures: Any) -> dict[str, Any]:
    """Note figures a notebook cell measured. Written only under the GPU runner ($WORKBOOK_REFERENCE_DIR set and
    a CUDA GPU visible), merged into that folder's <name>.json; elsewhere nothing is written. Returns `figures`."""
    folder = os.environ.get(ENV)
    if not folder:
        return figures
    import torch  # only a recording cell on a GPU node gets here (see write)

    if not torch.cuda.is_available():
        return figures
    old = load(name, folder) or {"figures": {}}
    write(name, {**old["figures"], **figures}, script=os.environ.get("WORKBOOK_REFERENCE_SCRIPT", "a notebook"),
          folder=folder)
    return figures


def cell_fingerprint(sources: list[str]) -> str:
    """A short hash of the source of the cells that record into one reference file (the runner stores it)."""
    return hashlib.sha256("\n\x00".join(s.strip() for s in sources).encode()).hexdigest()[:16]


def recording_cells(notebook: str | os.PathLike) -> dict[str, list[str]]:
    """reference name -> the sources of the notebook's code cells that call tl.reference.record(name, ...)."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    out: dict[str, list[str]] = {}
    for cell in cells:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code":
            for name in re.findall(r"reference\.record\(\s*[\"']([\w.-]+)[\"']", src):
                out.setdefault(name, []).append(src)
    return out


def stamp(notebook: str | os.PathLike, folder: str | os.PathLike | None = None) -> list[str]:
    """After a GPU run of `notebook`: store the fingerprint of its recording cells in each of its reference
    files (the GPU runner calls this). Returns the names stamped."""
    stamped = []
    for name, sources in recording_cells(notebook).items():
        rec = load(name, folder)
        if rec is not None:
            rec["cells"] = cell_fingerprint(sources)
            atomic_write_text(path(name, folder), json.dumps(rec, indent=1) + "\n")
            stamped.append(name)
    return stamped


def stale(notebook: str | os.PathLike, folder: str | os.PathLike | None = None) -> list[str]:
    """Why the reference files of `notebook` are missing or older than its recording cells ([] when fresh)."""
    problems = []
    for name, sources in recording_cells(notebook).items():
        rec = load(name, folder)
        if rec is None:
            problems.append(f"{Path(notebook).name}: no reference file {path(name, folder).name}")
        elif rec.get("cells") != cell_fingerprint(sources):
            problems.append(f"{Path(notebook).name}: cells recording {name!r} changed after its reference run "
                            f"({rec['date']})")
    return problems


def where(record: dict[str, Any]) -> str:
    """'4x NVIDIA H200, torch 2.11.0+cu130, 2026-11-26' for a record."""
    count = f"{record['gpus']}x " if record.get("gpus", 1) > 1 else ""
    return f"{count}{record['card']}, torch {record['torch']}, {record['date']}"


def show(name: str, keys: list[str] | tuple[str, ...] | None = None, fmt: str = "{:,.0f}", units: str = "",
         folder: str | os.PathLike | None = None) -> None:
    """Print the reference figures `keys` (all when None) of `name` with where they were measured, once (it
    returns nothing, so a cell ending with it shows the figures once; `load(name)` gives them to code), or a
    sentence saying that no GPU run has written them yet."""
    record = load(name, folder)
    if record is None:
        print(f"(no GPU reference run recorded yet for {name}: run scripts/gpu/ on a GPU node to write "
              f"notebooks/reference/{name}.json)")
        return
    figures = record["figures"]
    chosen = list(figures) if keys is None else list(keys)
    unknown = [k for k in chosen if k not in figures]
    if unknown:
        raise UserError(f"reference {name} has no figure {unknown[0]!r}; it has {', '.join(figures)}")
    print(f"On {where(record)} ({record['script']}) this printed:")
    width = max(len(k) for k in chosen) if chosen else 0
    for k in chosen:
        v = figures[k]
        text = fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
        print(f"  {k:<{width}}  {text}{' ' + units if units else ''}")


# ------------------------------------------------------------------------ where a notebook's GPU figures come from
NOTES = FOLDER / "README.md"  # why a reference run's torch differs from the lock's: "- **2.11**: why"
LOCK = FOLDER.parents[1] / "requirements.lock"


def names_for(notebook: str | os.PathLike, folder: str | os.PathLike | None = None,
              missing: bool = False) -> list[str]:
    """The reference files whose figures `notebook` shows: those named in its code (record, show, load) and
    those named after it (`NN_*.json` for notebook `NN_...`) that exist; missing=True: those named in its code
    that no run has written yet."""
    nb = Path(notebook)
    named = set(re.findall(r'reference\.(?:record|show|load)\(\s*\\?["\']([\w.-]+)', nb.read_text()))
    if missing:
        return sorted(n for n in named if not path(n, folder).is_file())
    named |= {p.stem for p in Path(folder or FOLDER).glob(nb.stem.split("_", 1)[0] + "_*.json")}
    return sorted(n for n in named if path(n, folder).is_file())


def minor(version: str) -> str:
    """'2.11' for '2.11.0+cu130'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def lock_torch(lock: str | os.PathLike | None = None) -> str:
    """The torch version requirements.lock pins."""
    m = re.search(r"^torch==([\w.+]+)$", Path(lock or LOCK).read_text(), re.M)
    if not m:
        raise UserError(f"{lock or LOCK} pins no torch (a line torch==X.Y.Z)")
    return m.group(1)


def torch_notes(notes: str | os.PathLike | None = None) -> dict[str, str]:
    """torch minor -> why reference runs used it rather than the lock's, from the notes file's '- **X.Y**: why'."""
    p = Path(notes or NOTES)
    text = p.read_text() if p.is_file() else ""
    found = re.finditer(r"^- \*\*(\d+\.\d+)\*\*: (.+(?:\n  +\S.*)*)", text, re.M)  # indented lines continue it
    return {m.group(1): " ".join(m.group(2).split()) for m in found}


def banner(notebook: str | os.PathLike, folder: str | os.PathLike | None = None,
           lock: str | os.PathLike | None = None, notes: str | os.PathLike | None = None) -> str:
    """The line a notebook's first cell carries: where and when its GPU figures were last verified (card, GPUs,
    torch, dates), in one line; the README says once why a torch other than the lock's (from the notes file)."""
    names, missing = names_for(notebook, folder), names_for(notebook, folder, missing=True)
    later = (f" Not recorded yet: {', '.join(missing)} (its GPU study writes it; until then the cells that show it "
             "say so)." if missing else "")
    if not names:
        return ("**GPU figures:** none; every figure in this notebook is measured by its own cells." if not missing
                else "**GPU figures:**" + later)
    groups: dict[tuple, list] = {}
    for name in names:
        rec = load(name, folder)
        groups.setdefault((rec.get("gpus", 1), rec["card"], rec["torch"]), []).append(rec["date"])
    parts = []
    for (gpus, card, torch_version), dates in groups.items():
        dates = sorted(set(dates))
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        parts.append(f"{gpus}x {card}, torch {torch_version}, {when}")
    pinned = minor(lock_torch(lock))
    other = any(minor(t) != pinned for _, _, t in groups)
    return ("**GPU figures:** " + "; ".join(parts) + (" (the README says why this torch)" if other else "") + "."
            + later)


def torch_problems(notebooks, folder: str | os.PathLike | None = None, lock: str | os.PathLike | None = None,
                   notes: str | os.PathLike | None = None) -> list[str]:
    """Reference files whose torch minor differs from the lock's without a note saying why ([] when fine)."""
    pinned, said, out = minor(lock_torch(lock)), torch_notes(notes), []
    for nb in notebooks:
        for name in names_for(nb, folder):
            m = minor(load(name, folder)["torch"])
            if m != pinned and m not in said:
                out.append(f"{name}.json was run with torch {m}, the lock pins {pinned}, and "
                           f"{Path(notes or NOTES).name} has no line '- **{m}**: why'")
    return sorted(set(out))
