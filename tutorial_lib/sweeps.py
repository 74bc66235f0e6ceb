"""A sweep as a Slurm job array (tl.jobs.write(..., sweep=...)): its points, from a grid {key: [values]} or a
list [{key: value}]; each point's values as the config reads them, checked as the run checks itself at its
start, so that a task that would fail in the queue fails at render time; and each point's out_dir and its
words in the job file. No torch here: jobs are rendered on login nodes.
"""
from __future__ import annotations

import itertools
import re
import shlex

from .config import ConfigError, TrainConfig, UserError, check_one_line, check_world, format_value, load
from .history import check_eval_every


def sweep_points(sweep: dict[str, list] | list[dict] | None) -> list[dict[str, str]]:
    """A grid {key: [values]} or a list of points [{key: value}], as points of key -> value strings."""
    if not sweep:
        return []
    if isinstance(sweep, dict):
        keys = list(sweep)
        for key in keys:
            if not isinstance(sweep[key], (list, tuple)) or not sweep[key]:
                raise UserError(f"sweep[{key!r}] must be a non-empty list of values, e.g. {{'{key}': [32, 64]}}")
        sweep = [dict(zip(keys, values)) for values in itertools.product(*(sweep[k] for k in keys))]
    points = [{str(k): format_value(v) for k, v in point.items()} for point in sweep]
    for point in points:
        for key, value in point.items():
            check_one_line(f"sweep key {key!r}", key)
            check_one_line(key, value)
    if len(points) > 1000:
        raise UserError(f"the sweep has {len(points)} points; a job array of at most 1000 tasks, please")
    return points


def as_read(cfg: TrainConfig, points: list[dict[str, str]], world_size: int,
            launched: bool | None = None) -> list[dict[str, str]]:
    """Each point's values as the config reads them (` 2` is 2, `1e-3` is 0.001, `yes` is true), so that what
    the job file says is what runs; a point the run would refuse (at its start, on `world_size` processes) is
    refused now."""
    out = []
    for point in points:
        try:
            read = load(None, [*cfg.to_overrides(), *(f"{k}={v}" for k, v in point.items())])
            check_as_in_the_job(read, world_size, launched)
        except ConfigError as e:
            raise UserError(f"sweep point {point}: {e}") from None
        out.append({k: format_value(getattr(read, k)) for k in point})
    return out


def check_as_in_the_job(cfg: TrainConfig, world_size: int, launched: bool | None = None) -> None:
    """The checks the run makes at its start (on a GPU, unless device=cpu), made now: a job that would fail in the
    queue fails here, with the same one-line error. launched: the job starts its processes through a launcher
    (torchrun, srun tasks), also when it starts one; unset, when it starts several."""
    check_world(cfg.parallel, world_size)
    launched = world_size > 1 if launched is None else launched
    cfg.check_runtime("cpu" if cfg.device == "cpu" else "cuda", world_size, launched=launched)
    check_eval_every(cfg, cfg.steps or 2**62)  # steps unset: the epochs' steps are checked by the run


def sweep_words(cfg: TrainConfig, points: list[dict[str, str]], base_out: str) -> list[dict]:
    rendered = []
    for point in points:
        try:
            load(None, [*cfg.to_overrides(), *(f"{k}={v}" for k, v in point.items())])
        except ConfigError as e:
            raise UserError(f"sweep point {point}: {e}") from None
        label = "_".join(f"{k}-{re.sub(r'[^A-Za-z0-9.]+', '-', v)}" for k, v in point.items() if k != "out_dir")
        out_dir = point.get("out_dir") or f"{base_out}/{label}"
        words = [shlex.quote(f"{k}={v}") for k, v in point.items() if k != "out_dir"]
        workers = point.get("num_workers") if point.get("num_workers", "auto") != "auto" else None
        rendered.append({"out_dir": out_dir, "words": words, "workers": workers})
    return rendered
