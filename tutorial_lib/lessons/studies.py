"""The GPU studies behind the notebooks' reference figures, each one entry point:

    python -m tutorial_lib study --list                 # every study, its notebook and the GPUs it wants
    python -m tutorial_lib study NAME --small           # tiny sizes on this machine (CPU: gloo, 2 processes)
    python -m tutorial_lib study NAME --reference       # full sizes on a GPU node: notebooks/reference/*.json
    python -m tutorial_lib study NAME --reference --only CASE,...   # just those cases, merged into that record
    python -m tutorial_lib study NAME --compare OLD.json   # a rerun: the committed record against an older one

A study is a function `study(size, out) -> {reference name: figures}` in a lessons module, registered in
STUDIES below. It measures with the workbook's own loop (engine.train / engine.launch, bench, scaling), writes
whatever tables and logs it likes under `out`, and returns its figures ({} when its tables are all it leaves);
this runner writes each as a reference record: into `out` always, and into notebooks/reference/ with
--reference (full sizes, a CUDA GPU visible). Its sizes come from the one switch, lessons.size. The small mode is
what `make test` runs for every study, so the code behind a notebook's GPU figures is tested; scripts/gpu/*.sh
are the launch lines of these studies on a GPU node.
`--only` (studies whose function takes `select`: their records keep every case) runs the cases named and keeps
every other case's record from the existing record (notebooks/reference/ with --reference, else `out`), which
must come from the same card, GPU count and torch: a missing case is recorded later without running the rest.
"""
from __future__ import annotations

import importlib
import inspect
import json
import time
from dataclasses import dataclass
from pathlib import Path

from .. import reference
from ..config import UserError
from ..values import count
from . import noise  # the one rule that says whether two figures differ
from .scaling import figure as band  # a run's img/s as an estimate of its mean, with its interval
from .size import Size


@dataclass(frozen=True)
class Study:
    name: str
    target: str  # "module:function" inside tutorial_lib.lessons
    notebook: str  # the notebook that shows its figures
    gpus: int  # GPUs its full size wants (it runs on fewer, saying so)
    about: str  # one line: what it measures
    launcher: str | None = None  # its launch line on a GPU node, scripts/gpu/NAME.sh (older records name it)

    def function(self):
        module, func = self.target.split(":")
        return getattr(importlib.import_module(f"{__package__}.{module}"), func)

    def scripts(self) -> tuple[str, ...]:
        """What a record of this study names as its `script`: the entry point, or (records made before the study
        moved into tutorial_lib) its launch script."""
        return (f"python -m tutorial_lib study {self.name}",) + ((self.launcher,) if self.launcher else ())


STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("spine", "checks:spine", "01", 2, "fp32 vs bf16 on one GPU, DDP on 1 and 2 GPUs: the CLI's first runs",
          "scripts/gpu/spine.sh"),
    Study("measure", "checks:measure", "01", 1, "one way to measure: train, bench and TensorBoard agree; verdicts",
          "scripts/gpu/measure.sh"),
    Study("traces", "traces:study", "02", 2, "profiled runs (fp32, bf16, DDP per rank) and the GPU trace fixture",
          "scripts/gpu/profiling.sh"),
    Study("timeline", "timeline:study", "02", 1, "the timeline of two profiled steps (fp32, bf16) and its GPU idle "
          "share; nsys stats of the timed window where nsys is installed", "scripts/gpu/timeline.sh"),
    Study("data_loading", "data_loading:study", "03", 2, "IO / SYNTHETIC / FULL of every loader at batch 256 and 1024",
          "scripts/gpu/data_loading.sh"),
    Study("ladder", "ladder:study", "04", 1, "the optimization ladder rung by rung, traces of its key rungs, and the "
          "bench at configs/optimized.yaml", "scripts/gpu/ladder.sh"),
    Study("baseline", "baseline:study", "01", 1, "the fp32 baseline step by hand and in the engine, short and long "
          "runs, beside the GPU's clock: why one configuration can read differently in 01, 02 and 04"),
    Study("dpddp", "dpddp:study", "05", 4, "DataParallel against DDP on every GPU of the node (2 or 4), the trap, "
          "DDP's knobs", "scripts/gpu/dp_vs_ddp.sh"),
    Study("scaling", "scaling_study:study", "06", 4, "weak and strong scaling, the race to a target accuracy, the "
          "all-reduce's cost, notebook 01's baseline", "scripts/gpu/scaling.sh"),
    Study("cluster", "cluster:study", "06", 2, "what a cluster user asks next: the energy counter against power.draw, "
          "the hang drill on NCCL, CPU binding on the node's NUMA nodes", "scripts/gpu/cluster.sh"),
    Study("ddp_probe", "ddp_probe:study", "05", 4, "DDP at batch 256 per GPU form by form, and its gap traced by "
          "kernel class", "scripts/gpu/ddp_probe.sh"),
)}


def get(name: str) -> Study:
    if name not in STUDIES:
        raise UserError(f"no study named {name!r}; the studies are: {', '.join(sorted(STUDIES)) or '(none)'} "
                        "(python -m tutorial_lib study --list)")
    return STUDIES[name]


def listing() -> str:
    width = max((len(n) for n in STUDIES), default=0)
    return "\n".join(f"{s.name:<{width}}  notebook {s.notebook}, {count(s.gpus, 'GPU')} at full size: {s.about}"
                     for s in sorted(STUDIES.values(), key=lambda s: (s.notebook, s.name)))


def run(name: str, size: Size, out: str | Path, write_reference: bool = False,
        only: list[str] | None = None) -> dict[str, Path]:
    """Run study `name` at `size` into `out`; returns where each reference record went. `only`: just those
    cases, the others' records kept from the existing record (see the module's docstring)."""
    study = get(name)
    import torch  # only here: `study --list` and a bad name answer without it

    if write_reference and (size.small or not torch.cuda.is_available()):
        raise UserError(f"study {name}: --reference records full-size GPU figures; run it on a GPU node without "
                        f"--small (now: {size.name} sizes, {size.why}; "
                        f"{'a' if torch.cuda.is_available() else 'no'} CUDA GPU visible)")
    out = Path(out)
    kwargs = {"select": selection(study, size, out, write_reference, only)} if only else {}
    out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count()
    card = torch.cuda.get_device_name(0) if gpus else "CPU"
    print(f"study {name} (notebook {study.notebook}): {size.name} sizes ({size.why}); torch {torch.__version__} | "
          f"{f'{gpus} x {card}' if gpus else 'no CUDA GPU'}", flush=True)
    started = time.time()
    figures_by_name = study.function()(size, out, **kwargs)
    script = f"python -m tutorial_lib study {name}"
    # the record in `out` names what ran: a GPU at full sizes as reference.write reads it, else the mode too
    mode = {} if gpus and not size.small else {"card": f"{card} ({'small mode' if size.small else 'full sizes'})",
                                               "gpus": gpus, "torch_version": torch.__version__}
    written = {}
    for ref_name, figures in figures_by_name.items():
        written[ref_name] = reference.write(ref_name, figures, script=script, folder=out, **mode)
        if write_reference:
            written[ref_name] = reference.write(ref_name, figures, script=script)
    nothing = "no reference record (this study's figures are its tables in " + str(out) + ")"
    print(f"study {name} ({size.name} sizes) done in {time.time() - started:.0f} s; "
          f"wrote {', '.join(str(p) for p in written.values()) or nothing}")
    later = over_budget(figures_by_name)
    if later:
        print(f"{count(len(later), 'case')} did not fit in this call's budget; the record keeps what ran. Run them in "
              f"another call: python -m tutorial_lib study {name}{' --reference' if write_reference else ''} "
              f"--only {','.join(later)}" + ("" if write_reference else f" --out {out}"))
    return written


def over_budget(figures_by_name: dict) -> list[str]:
    """The cases each record skipped because the study's time budget ran out (a device call's limit), in order."""
    return [name for figures in figures_by_name.values() for group in ("runs", "cases")
            for name, rec in (figures.get(group) or {}).items()
            if isinstance(rec, dict) and rec.get("over_budget")]


def selection(study: Study, size: Size, out: Path, write_reference: bool, only: list[str]):
    """The cases.Selection for `--only`: the names, and the case records of the existing record, which must have
    been made on this machine's kind of node (card, GPU count, torch)."""
    from .cases import Selection  # cases imports the engine (torch): see run()

    if "select" not in inspect.signature(study.function()).parameters:
        able = [s.name for s in STUDIES.values() if "select" in inspect.signature(s.function()).parameters]
        raise UserError(f"study {study.name} does not keep its cases' records one by one, so --only can't merge "
                        f"into it; run it whole (--only works for: {', '.join(able)})")
    names = [n.strip() for n in ",".join(only).split(",") if n.strip()]
    folder = reference.FOLDER if write_reference else out
    records = [r for r in map(_record, sorted(Path(folder).glob("*.json")))
               if r and r["script"] == f"python -m tutorial_lib study {study.name}" and _cases_of(r["figures"])]
    if len(records) != 1:
        raise UserError(f"--only merges into the study's existing record, but {count(len(records), 'record')} of study "
                        f"{study.name} lie in {folder}: run the whole study first")
    rec, here = records[0], _machine(size)
    there = {k: rec.get(k) for k in here}
    if there != here:
        raise UserError(f"--only: the existing record was made on {there}, this machine is {here}; a record mixes "
                        "no cards, GPU counts or torch versions: run the whole study here")
    return Selection(frozenset(names), _cases_of(rec["figures"]))


def _record(path: Path) -> dict | None:
    """A reference record, or None for any other JSON file of the folder (a study's cases.json, say)."""
    try:
        return reference.load(path.stem, path.parent)
    except UserError:
        return None


def _cases_of(figures: dict) -> dict:
    return figures.get("cases") or figures.get("runs") or {}


def _machine(size: Size) -> dict:
    """The record fields that must match for a merge: card, GPU count and torch version, as `run` records them
    on this machine at this size."""
    import torch  # as in run(): `study --list` answers without it

    gpus = torch.cuda.device_count()
    card = torch.cuda.get_device_name(0) if gpus else "CPU"
    if size.small or not gpus:
        card = f"{card} ({'small mode' if size.small else 'full sizes'})"
    return {"card": card, "gpus": gpus, "torch": torch.__version__}


# ------------------------------------------------------------------------------------------ a rerun, compared
def entries(record: dict) -> dict[str, tuple]:
    """A record's throughputs, each as (img/s, the band its step times allow, its configuration or None): the
    cases of a study that keeps them (runs / cases), the rungs of a ladder (rows), else its figures named *img_s
    (a band of the noise floor, no step times). An entry whose figures are not numbers is left out."""
    figures, out = record["figures"], {}
    cases = _cases_of(figures)
    for name, rec in (cases.items() if isinstance(cases, dict) else ()):
        r = rec.get("result") if isinstance(rec, dict) else None
        if isinstance(r, dict) and r.get("throughput_img_s") and r.get("step_time_ms"):
            config = rec.get("config")
            _add(out, name, r, config if isinstance(config, dict) else None)
    rows = figures.get("rows")
    for row in (rows if isinstance(rows, list) else ()):
        if isinstance(row, dict) and row.get("img_s") and not row.get("skipped"):
            steps = {"median": row.get("step_ms"), "p10": row.get("step_ms_p10"), "p90": row.get("step_ms_p90")}
            _add(out, f"rung {row.get('rung')}", {"throughput_img_s": row["img_s"], "step_time_ms": steps}, None)
    if not out:
        for key, value in figures.items():
            if key.endswith("img_s") and isinstance(value, (int, float)) and value > 0:
                _add(out, key, {"throughput_img_s": value, "step_time_ms": {}}, None)
    return out


def _add(out: dict, name: str, result: dict, config: dict | None) -> None:
    """out[name] = (img/s, its band, config), unless the figures are not numbers (a damaged or hand-edited
    record): such an entry can't be compared."""
    value = result["throughput_img_s"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return
    try:
        out[name] = (value, band(result), config)
    except (TypeError, AttributeError, ZeroDivisionError):  # step times that are not numbers: no band
        pass


KEPT = "the same figures: kept, not rerun"


def compare(old: dict, new: dict) -> list[dict]:
    """Two records of one study on one kind of node, entry by entry (entries): each in both, its img/s then and
    now with its band, and whether they differ beyond those bands (tl.scaling.judge). An entry whose
    configuration changed between the records is named, not compared; one whose figures are the same in both
    was kept by a partial rerun (--only), not measured again, and says so."""
    before, now, rows = entries(old), entries(new), []
    for name in [n for n in now if n in before]:
        (a, ba, ca), (b, bb, cb) = before[name], now[name]
        changed = sorted(k for k in set(ca or {}) & set(cb or {}) if k != "out_dir" and ca[k] != cb[k])
        if changed:
            verdict = "another configuration (" + ", ".join(changed[:3]) + ")"
        elif (a, ba) == (b, bb):
            verdict = KEPT
        else:
            r = noise.compare(bb, ba)
            verdict = {"equal": "within the run-to-run spread", "higher": "faster now",
                       "lower": "slower now"}.get(r.verdict) or r.words()
        rows.append({"case": name, "before": a, "before_band": ba, "now": b, "now_band": bb, "ratio": b / a,
                     "verdict": verdict})
    return rows


def comparison_lines(old: dict, new: dict) -> list[str]:
    """compare() as the lines `study NAME --compare` prints: where each record was made, a table, a summary."""
    out = [f"before: {reference.where(old)}", f"now:    {reference.where(new)}"]
    if (old.get("card"), old.get("gpus")) != (new.get("card"), new.get("gpus")):
        out.append("another card or GPU count: not a rerun of the same node, so differences are not noise alone")
    rows = compare(old, new)
    out += ["| case | before img/s | now img/s | now / before | verdict |", "| --- | ---: | ---: | ---: | --- |"]
    out += [f"| {r['case']} | {noise.shown(r['before_band'])} | {noise.shown(r['now_band'])} | "
            f"{noise.compare(r['now_band'], r['before_band'])} | {r['verdict']} |" for r in rows]
    kept = sum(r["verdict"] == KEPT for r in rows)
    same = sum(r["verdict"] == "within the run-to-run spread" for r in rows)
    if not rows:
        out.append("no case has a throughput in both records: nothing to compare")
    elif kept == len(rows):
        out.append("every case has the same figures in both records (kept, not rerun): nothing to compare")
    else:
        out.append(f"{same} of {len(rows) - kept} cases that ran in both records are within the run-to-run spread"
                   + (f" ({kept} kept from before, not rerun)" if kept else ""))
    return out


def counterpart(old: dict, folder=None, scripts: tuple[str, ...] | None = None) -> dict:
    """The committed record (notebooks/reference/ by default) that a rerun of `old` replaced: made by the same
    study (`scripts`: the names its records give it, Study.scripts(); default old's own), on the same card with
    as many GPUs."""
    folder, scripts = Path(folder or reference.FOLDER), scripts or (old.get("script"),)
    same = [r for r in map(_record, sorted(folder.glob("*.json"))) if r and r["script"] in scripts
            and (r.get("card"), r.get("gpus", 1)) == (old.get("card"), old.get("gpus", 1))]
    distinct = {json.dumps(r["figures"], sort_keys=True): r for r in same}  # a copy under a second name is one
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    raise UserError(f"--compare: {len(distinct)} records in {folder} come from {' or '.join(scripts)} on "
                    f"{old.get('gpus', 1)}x {old.get('card')}; the rerun's record must replace exactly one "
                    "(rerun the study with --reference on the same kind of node first)")
