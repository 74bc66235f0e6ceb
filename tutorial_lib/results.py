"""What a run measured: `Result`, saved as <out_dir>/result.json, and read back anywhere, torch or not
(a login node collecting the results of batch jobs needs no GPU stack). Also the one atomic file write."""
from __future__ import annotations

import errno
import json
import math
import os
import secrets
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .config import UserError


@dataclass
class Result:
    """Everything a run measured. Saved as <out_dir>/result.json by rank 0."""
    config: dict
    device: str
    world_size: int
    steps: int
    global_batch: int
    throughput_img_s: float
    step_time_ms: dict
    data_wait_ms: float  # mean time a timed step waited for its batch (on a GPU: while it had nothing queued)
    loss: list
    final_loss: float
    val_accuracy: float | None
    peak_memory_mb: float | None
    param_checksums: list
    resumed_from_step: int | None
    wall_time_s: float
    torch_version: str
    compile_time_s: float | None = None  # the first step, where torch.compile compiles (left out of the timing)
    flops_per_image: float | None = None  # forward + backward, counted once by torch.utils.flop_counter
    mfu: float | None = None  # achieved FLOP/s / the card's dense peak for the precision (None: CPU, unknown card)
    fp16_skipped_steps: int | None = None  # optimizer steps the GradScaler skipped (inf/NaN gradients); fp16 only
    data_wait_fraction: float | None = None  # share of the timed time the loop waited for batches
    num_workers_used: int | None = None  # DataLoader workers the run had (num_workers=auto resolved)
    val_history: list = field(default_factory=list)  # [step, training seconds, val accuracy] per eval_every
    host_parts_ms: dict | None = None  # time_parts=true: host ms per timed step of each labelled phase, and "step"
    stopped_by: str | None = None  # why the run ended: steps (its length), target_accuracy or patience
    # What the run cost (energy.py; the GPU-hours are worked out from the fields above: costs below)
    gpus: int | None = None  # GPUs the run used (0 on a CPU; every GPU of a DataParallel run)
    energy_j: float | None = None  # the timed window's energy, all GPUs (NVML's counter); null: energy_note says why
    energy_per_gpu_j: list | None = None  # the same, per GPU
    energy_note: str | None = None  # why there is no energy figure (a CPU run, no NVML, no counter on this GPU)
    joules_per_image: float | None = None  # energy_j / the images of the timed window
    energy_loop_j: float | None = None  # from the first step to the end of the loop (warm-up, validation included)
    loop_s: float | None = None  # host seconds of that loop
    energy_window_unix: list | None = None  # [start, end] of the timed window's energy, Unix time (rank 0)
    gpu_hours: float | None = None  # gpus x wall_time_s
    gpu_hours_timed: float | None = None  # gpus x the timed seconds (of the slowest rank)
    gpu_hours_to_target: float | None = None  # stopped by target_accuracy: gpus x the loop's seconds to it
    kwh_to_target: float | None = None  # and the loop's energy to it, in kWh

    def __post_init__(self):
        if self.gpus is not None:
            self.__dict__.update(costs(self))

    def summary(self) -> str:
        acc = "n/a" if self.val_accuracy is None else f"{100 * self.val_accuracy:.1f}%"
        mem = "n/a (CPU)" if self.peak_memory_mb is None else f"{self.peak_memory_mb:,.0f} MiB"
        first = f"{self.loss[0]:.3f}" if self.loss else "n/a"
        extra = "" if self.mfu is None else f" | MFU {100 * self.mfu:.0f}%"
        if self.compile_time_s is not None:
            extra += f" | compile {self.compile_time_s:.0f} s"
        ms = {k: "n/a" if v is None or v != v else f"{v:.1f}"  # None or NaN: no timed step
              for k, v in ((k, self.step_time_ms.get(k)) for k in ("median", "p10", "p90"))}
        rate = self.throughput_img_s
        rate = "n/a" if rate is None or rate != rate else f"{rate:,.0f}"
        return (f"{rate} img/s on {self.device} x{self.world_size} | step {ms['median']} ms (p10 {ms['p10']}, "
                f"p90 {ms['p90']}){self._waited()} | loss {first} -> {self.final_loss:.3f} | "
                f"val acc {acc} | peak mem {mem}{extra}")

    def _waited(self) -> str:
        if self.data_wait_fraction is None:
            return ""
        return f" | data wait {self.data_wait_ms:.1f} ms/step ({100 * self.data_wait_fraction:.0f}%)"

    def __repr__(self) -> str:
        return f"Result({self.summary()})"

    def save(self, out_dir: str | os.PathLike) -> Path:
        return atomic_write_text(Path(out_dir) / "result.json", json.dumps(_finite(asdict(self)), indent=1))


def costs(r: Result) -> dict:
    """GPU-hours from a Result's own fields: GPUs x wall time, GPUs x the timed seconds; and for a run stopped by
    its target_accuracy (not resumed: its loop is the whole run), GPU-hours and kWh from the loop's start to the
    validation pass that reached it (validation passes are billed too)."""
    hours = lambda seconds: None if seconds is None else round(r.gpus * seconds / 3600, 6)  # noqa: E731
    timed = (r.step_time_ms or {}).get("slowest_rank_total_s")
    reached = r.stopped_by == "target_accuracy" and r.resumed_from_step is None
    return {"gpu_hours": hours(r.wall_time_s), "gpu_hours_timed": hours(timed),
            "gpu_hours_to_target": hours(r.loop_s) if reached else None,
            "kwh_to_target": r.energy_loop_j / 3.6e6 if reached and r.energy_loop_j is not None else None}


def _finite(value):
    """NaN and infinity are not JSON: they are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


RESULT_KEYS = {"config": dict, "step_time_ms": dict,  # what every reader of a result.json relies on
               "throughput_img_s": (int, float, type(None))}  # null: no timed step (NaN is written as null)


def load_result(out_dir: str | os.PathLike) -> Result:
    """The Result of the run in `out_dir` (its result.json). (Notebook 01 teaches it.)"""
    path = Path(out_dir) / "result.json"
    if not path.is_file():
        raise UserError(f"no result.json in {str(out_dir)!r}: the run did not finish (see its log)")
    values = read_result(path, "run the same training command again: it writes it again (from its checkpoint "
                         "when the run kept one, else by training)")
    known = {f.name for f in fields(Result)}
    try:
        return Result(**{k: v for k, v in values.items() if k in known})
    except TypeError as e:  # a field the constructor needs is missing
        raise UserError(f"{path} is not a workbook result ({e}); run the same training command again") from None


def read_result(path: str | os.PathLike, fix: str) -> dict:
    """A result.json as a dict (a Result's fields), or read_record's one-line error with `fix`."""
    return read_record(path, "a workbook result", fix, RESULT_KEYS)


JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "true or false", type(None): "null", object: "any value"}


def read_record(path: str | os.PathLike, what: str, fix: str, keys: dict | None = None) -> dict:
    """The JSON object in `path` (a result.json, a rank's last words, a reference record, ...), or a UserError of
    one line that names the file, what is wrong with it and `fix`, what to do: a file that is missing, can't be
    read, is not text (binary), is not complete JSON (cut short), holds another JSON value than an object, or
    lacks one of `keys` (name -> the type or types its value must have). `what`: what the file should be, in
    the user's words ("a workbook result"). Every command that reads such a record reads it here."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
        record = json.loads(text)
    except FileNotFoundError:
        problem = "does not exist"
    except OSError as e:
        problem = f"can't be read ({e.strerror or e})"
    except UnicodeDecodeError:
        problem = "is not text (a binary file?)"
    except json.JSONDecodeError as e:
        problem = "is empty" if not text.strip() else \
            f"is not complete JSON (cut short? {e.msg} at line {e.lineno}, column {e.colno})"
    else:
        problem = shape_problem(record, keys or {})
        if problem is None:
            return record
    raise UserError(f"{path} {problem}, so it is not {what}; {fix}")


def shape_problem(record, keys: dict) -> str | None:
    """What is wrong with the shape of a record read from JSON (see read_record), or None."""
    if not isinstance(record, dict):
        return f"holds {JSON_NAMES.get(type(record), 'another value')}, not an object"
    missing = [k for k in keys if k not in record]
    if missing:
        return f"lacks {', '.join(missing)}"
    for key, kinds in keys.items():
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if not isinstance(record[key], kinds) or (type(record[key]) is bool and not {bool, object} & set(kinds)):
            allowed = " or ".join(dict.fromkeys(JSON_NAMES[k] for k in kinds))
            return f"has {key}={json.dumps(record[key])[:40]}, not {allowed}"
    return None


def result_line(res: dict) -> str:
    """One line on a result.json (as a dict): throughput with its device, loss, accuracy. (Notebook 01 teaches it.)"""
    acc = "n/a" if res.get("val_accuracy") is None else f"{100 * res['val_accuracy']:.1f}%"
    loss = "n/a" if res.get("final_loss") is None else f"{res['final_loss']:.3f}"
    return (f"{res['throughput_img_s']:,.0f} img/s on {res['device']} x{res['world_size']}, {res['steps']} steps, "
            f"final loss {loss}, val acc {acc} ({res['config']['out_dir']})")


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` so that a crash never leaves a half-written file: a fresh temporary file beside it
    (fresh_file), then one rename. A full disk or quota is a one-line UserError; no partial file is left."""
    path, tmp = Path(path), None
    try:
        f, tmp = fresh_file(path)
        with f:
            f.write(text.encode())
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(write_problem(path, e)) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return path


def fresh_file(path: Path):
    """A new, empty file beside `path` for one write, and its name: a random name, created with O_EXCL (never a
    file that exists, nor a link planted under that name: in a shared, group-writable folder anyone may create
    one) and O_NOFOLLOW. Renamed over `path` once written, which replaces a link there rather than its target."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.fdopen(os.open(tmp, flags, 0o666), "wb"), tmp
        except FileExistsError:  # a name someone else holds: draw another
            continue


def disk_problem(folder: Path, e: BaseException | None = None) -> str | None:
    """'no space left on <folder>' or 'disk quota exceeded on <folder>' when that is why a write failed (also
    when the error does not say so but the disk is full: torch's writer reports an iostream error); else None."""
    code = getattr(e, "errno", None)
    if code == errno.EDQUOT:
        return f"disk quota exceeded on {folder}"
    if code == errno.ENOSPC:
        return f"no space left on {folder}"
    try:
        full = code is None and shutil.disk_usage(existing(folder)).free < 1 << 20
    except OSError:
        full = False
    return f"no space left on {folder}" if full else None


def write_problem(path: Path, e: OSError) -> str:
    """The one-line reason `path` could not be written, with the fix."""
    problem = disk_problem(path.parent, e)
    if problem:
        return f"{problem} while writing {path.name}; free space, or write somewhere else"
    return f"could not write {path} ({e.strerror or e}); check that its folder exists and that you can write it"


def make_folder(path: str | os.PathLike, name: str, fix: str) -> Path:
    """Create the folder `path` (and its parents) where something will be written, or a one-line error: `name`
    (e.g. "out_dir='runs/x'") can't be used, why, and `fix`. Checked before the work that fills it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied")
    except OSError as e:
        why = disk_problem(existing(path), e) or e.strerror or str(e)
        raise UserError(f"{name} can't be used ({why}); {fix}") from None
    return path


def existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (where a folder to be made would live)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
