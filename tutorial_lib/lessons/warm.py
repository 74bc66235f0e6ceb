"""`make warm`: the workbook's compiled configurations compiled once, ahead of the day, into the compile cache the
learners' runs share (tutorial_lib/compilecache.py); and the first compiled step measured cold against warm.

    make warm                                                # on a node of the hub's GPU type, before the day
    python -m tutorial_lib warm --list                       # what it compiles, and into which folder
    python -m tutorial_lib warm --cache DIR --only optimized,ladder_compile
    python -m tutorial_lib warm --config my.yaml key=value   # one configuration of yours instead (any device)
    python -m tutorial_lib warm --measure                    # configs/optimized.yaml's first step: cold, warm, and
                                                             # warm from a read-only copy (1 GPU, about 2 minutes)
    python -m tutorial_lib warm --measure --reference        # ... also notebooks/reference/04_compile_cache.json

Each configuration runs in a process of its own, as a learner's kernel would (`warm --child NAME ...`): a few steps
(the first compiles; reduce-overhead and cuda_graph record their graphs in the next ones), then the process saves
what it compiled as one mega-cache file and notes its first step in DIR/manifest.json. The caches hold code for one
torch version and one GPU type: warm again after either changes (the doctor's compile_cache line says when).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import ladder
from .. import compilecache, reference
from ..config import CONFIGS_DIR, ROOT, TrainConfig, UserError, load
from ..values import count
from ..sites import load_site
from ..meters import untimed_steps
from ..results import load_result

TIMED_STEPS = 2  # after the untimed ones: the run then has a throughput, and every graph has been recorded
CHILD_TIMEOUT_S = 900  # one configuration's compile: 20-60 s on a GPU, minutes on a CPU (max-autotune: longer)
MEASURED = ("cold", "warm", "read_only")


def folder_for(cache: str | None, site: str | None) -> Path:
    """The folder `warm` fills: --cache, else $WORKBOOK_COMPILE_CACHE, the site profile's compile_cache or the hub's
    shared folder (compilecache.where, compilecache.default_dir); made now."""
    profile = load_site(site)
    folder = compilecache.where(profile.compile_cache, profile.name)[0] if cache is None else Path(cache).absolute()
    folder = folder or compilecache.default_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"can't create the compile cache {folder} ({e.strerror}); give --cache DIR (or export "
                        f"{compilecache.ENV}=DIR), a folder you can write and the learners' servers can read") from None
    return folder


def short(cfg: TrainConfig, out: Path, name: str) -> TrainConfig:
    """`cfg` as a warming run: the steps that compile and record, two timed, nothing else written."""
    cfg = cfg.replace(timing_warmup=0, eval=False, tensorboard=False, progress=False, resume=False, ckpt_every=0,
                      out_dir=str(out / name))
    return cfg.replace(steps=untimed_steps(cfg, 0) + TIMED_STEPS)


def plan(out: Path) -> list[tuple[str, TrainConfig]]:
    """The workbook's compiled configurations on a GPU: configs/optimized.yaml (notebooks 04-06 start from it) and
    every compiled rung of notebook 04's ladder, each as a short run into `out`."""
    found = [("optimized", load(CONFIGS_DIR / "optimized.yaml"))]
    found += [(f"ladder_{rung.name}", cfg) for rung, cfg, reason in ladder.configs(ladder.GPU, device="cuda")
              if cfg.compile and reason is None and not rung.bare]
    return [(name, short(cfg, out, name)) for name, cfg in found]


def pick(configs: list[tuple[str, TrainConfig]], only: list[str] | None) -> list[tuple[str, TrainConfig]]:
    names = [n for n, _ in configs]
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        raise UserError(f"--only {unknown[0]!r} is not a configuration make warm compiles; they are {', '.join(names)}")
    return [(n, c) for n, c in configs if not only or n in only]


def run_child(name: str, cfg: TrainConfig, env: dict, log: Path) -> dict:
    """`cfg` trained in a fresh process with `env` (the cache's variables); its first step and wall time."""
    cmd = [sys.executable, "-m", "tutorial_lib", "warm", "--child", name, *cfg.to_overrides()]
    t0 = time.perf_counter()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, stdout=f,
                              stderr=subprocess.STDOUT, timeout=CHILD_TIMEOUT_S)
    said = log.read_text()
    if proc.returncode != 0:
        raise UserError(f"warming {name} failed (exit {proc.returncode}); its last lines ({log}):\n"
                        + "\n".join(said.splitlines()[-15:]))
    result = load_result(cfg.out_dir)
    cache_line = next((line for line in said.splitlines() if line.startswith("compile cache:")), "")
    return {"first_step_s": result.compile_time_s, "process_s": time.perf_counter() - t0, "device": result.device,
            "torch": result.torch_version, "cache": cache_line}


def warm(configs: list[tuple[str, TrainConfig]], folder: Path, out: Path) -> list[dict]:
    """Compile each configuration into `folder`, one process each; a row per configuration."""
    rows, failed = [], []
    for i, (name, cfg) in enumerate(configs, 1):
        print(f"[{i}/{len(configs)}] {name}: {' '.join(cfg.to_overrides())}", flush=True)
        try:
            row = {"name": name, **run_child(name, cfg, {compilecache.ENV: str(folder), compilecache.READONLY_ENV: ""},
                                             out / "logs" / f"{name}.log")}
        except UserError as e:  # one configuration that fails (out of memory, a bad override) spoils no other
            print(f"    {e}", flush=True)
            failed.append(name)
            continue
        print(f"    first step {row['first_step_s']:.1f} s, process {row['process_s']:.0f} s on {row['device']}",
              flush=True)
        rows.append(row)
    size = compilecache.size_bytes(folder) / 2**20
    print(f"warmed {count(len(rows), 'configuration')} into {folder} ({size:,.0f} MiB); manifest {folder / compilecache.MANIFEST}")
    if failed:
        raise UserError(f"{count(len(failed), 'configuration')} could not be warmed: {', '.join(failed)} (their logs: "
                        f"{out / 'logs'}); the others are in the cache")
    return rows


def child(name: str, cfg: TrainConfig) -> None:
    """`warm --child NAME key=value ...`: train `cfg` (the loop uses the cache: compilecache.use), then save what
    was compiled as DIR/megacache/<torch>-<device>/NAME.bin and note the first step in the manifest."""
    import torch  # the child trains

    from .. import engine

    result = engine.train(cfg)
    folder, _ = compilecache.where()
    if folder is None or not compilecache.writable(folder):
        return
    saved = compilecache.save_artifacts(folder, name)
    compilecache.record(folder, name, torch.__version__, compilecache.this_device(),
                        {"first_step_s": result.compile_time_s, "overrides": cfg.to_overrides(),
                         "megacache": saved.name if saved else None})


def measure(cfg: TrainConfig, out: Path, ways: tuple[str, ...] = MEASURED) -> dict:
    """The first compiled step of `cfg` in three fresh processes: cold (an empty cache folder), warm (the same
    folder, now filled: a run that may write there) and read_only (that folder read-only, the process's own caches
    empty: it loads the mega-cache files, as a learner on the hub does). Figures in seconds and their ratios.
    `ways`: cold and those of the others to run (each is one more compile: a minute of a small CPU)."""
    shared, own = out / "shared_cache", out / "own_cache"
    for folder in (shared, own):
        shutil.rmtree(folder, ignore_errors=True)
    writable = {compilecache.ENV: str(shared), compilecache.READONLY_ENV: ""}
    envs = {"cold": writable, "warm": writable,
            "read_only": {compilecache.ENV: str(shared), compilecache.READONLY_ENV: "1",
                          "TORCHINDUCTOR_CACHE_DIR": str(own / "inductor"), "TRITON_CACHE_DIR": str(own / "triton")}}
    rows = {}
    for way in [w for w in MEASURED if w == "cold" or w in ways]:
        print(f"-- {way}: {' '.join(cfg.to_overrides())}", flush=True)
        rows[way] = run_child("measure", cfg.replace(out_dir=str(out / way)), envs[way], out / f"{way}.log")
        print(f"   first step {rows[way]['first_step_s']:.1f} s ({rows[way]['cache'] or 'no cache line'})", flush=True)
    figures = {"device": rows["cold"]["device"], "torch": rows["cold"]["torch"], "overrides": cfg.to_overrides(),
               **{f"{w}_first_step_s": rows[w]["first_step_s"] for w in rows},
               **{f"{w}_process_s": rows[w]["process_s"] for w in rows}}
    if "read_only" in rows:
        figures["read_only_cache_line"] = rows["read_only"]["cache"]
    for way in [w for w in ("warm", "read_only") if w in rows]:
        figures[f"cold_over_{way}"] = figures["cold_first_step_s"] / max(figures[f"{way}_first_step_s"], 1e-9)
    (out / "measure.json").write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def verdict(figures: dict, target: float = 3.0) -> str:
    """The measurement in words: each warm way against cold, and against the target."""
    lines = [f"first compiled step on {figures['device']} (torch {figures['torch']}): cold "
             f"{figures['cold_first_step_s']:.1f} s"]
    for way, words in (("warm", "warm (the shared folder, writable)"),
                       ("read_only", "warm from a read-only copy (its mega-cache files loaded)")):
        ratio = figures[f"cold_over_{way}"]
        lines.append(f"  {words}: {figures[f'{way}_first_step_s']:.1f} s; cold took {ratio:.1f}x as long "
                     f"({'meets' if ratio >= target else 'below'} the {target:g}x target); one process each")
    return "\n".join(lines)


def measure_cli(cfg: TrainConfig | None, out: Path, write_reference: bool) -> int:
    """`warm --measure`: `cfg` (default configs/optimized.yaml) measured cold and warm, the verdict printed; with
    --reference on a GPU also notebooks/reference/04_compile_cache.json."""
    import torch  # to know whether a GPU is here

    if cfg is None and not torch.cuda.is_available():
        raise UserError("no CUDA GPU here for configs/optimized.yaml; give a configuration this machine runs with "
                        "compile=true (e.g. model=mnist_cnn dataset=mnist compile=true device=cpu)")
    cfg = cfg or load(CONFIGS_DIR / "optimized.yaml")
    if not cfg.compile:
        raise UserError("compile=false: nothing is compiled, so there is no cache to measure; add compile=true")
    if write_reference and not torch.cuda.is_available():
        raise UserError("--reference records GPU figures, but no CUDA GPU is visible here")
    figures = measure(short(cfg, out, "measure"), out)
    print(verdict(figures))
    if write_reference:
        print(f"wrote {reference.write('04_compile_cache', figures, script='python -m tutorial_lib warm --measure')}")
    return 0
