"""What a cluster user asks after the first multi-GPU job, checked on a GPU node as one study:

    python -m tutorial_lib study cluster --reference   # a node with 2 or more GPUs: about 6 minutes
    python -m tutorial_lib study cluster --small       # the same code on a CPU (gloo, no energy counter)

Three checks, each a record in the reference `06_cluster_checks` (the card named), shown in docs/performance.md:
  energy: configs/optimized.yaml trained on the first GPU for ENERGY_STEPS steps with nvidia-smi sampling its
          power.draw every 100 ms; NVML's energy counter over the timed window (result.json) beside the
          integral of those samples over the same window (tl.energy.against_monitor: they should agree within 5%);
  hang:   notebook 05's drill on 2 GPUs with NCCL (tl.hang.drill: rank 1 freezes): the seconds from the freeze
          to the end of the run against dist_timeout_s, and the rank and collective the diagnosis names;
  numa:   each GPU's NUMA node and nearby CPUs (tl.numa, as the doctor reads them); on a node with 2 or more
          GPUs, DDP on every GPU with DataLoader workers, unbound and bound (`python -m tutorial_lib.numa
          --exec-bound`), alternated twice: bound to each rank's NUMA node where the GPUs sit on two or more;
          where they share one, binding to it changes nothing, so each rank gets its own share of its cores
          (`--exec-bound --exclusive`, as torchrun's --numa-binding=exclusive).
A check that can't run here (no nvidia-smi, one GPU) records why instead of a figure.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .. import energy
from ..config import ROOT, TrainConfig, given_gpus, load
from ..launcher import torchrun_command
from ..values import is_whole
from . import hang, noise

ENERGY_STEPS, HANG_TIMEOUT_S = 4000, 20  # about 45 s of the timed window on an H100
NUMA_RUN = dict(loader="dataloader", num_workers=6, batch_size=256, steps=400, timing_warmup=150)


def study(size, out: Path) -> dict[str, dict]:
    """`python -m tutorial_lib study cluster`: the energy check, the hang drill, the NUMA binding."""
    gpus = _visible_gpus()
    base = load(ROOT / "configs" / "optimized.yaml").replace(eval=False, tensorboard=False, progress=False)
    if size.small:
        base = base.replace(model="resnet18_imagenet", device="cpu", precision="fp32", channels_last=False,
                            compile=False, cuda_graph=False, loader="dataloader", num_workers=0, batch_size=8,
                            train_size=256)
    return {"06_cluster_checks": {"energy": energy_check(base, size, out, gpus),
                                  "hang": hang_check(base, size, out, gpus),
                                  "numa": numa_check(base, size, out, gpus)}}


def _visible_gpus() -> list[int]:
    """The nvidia-smi indexes of the GPUs this process may use (CUDA_VISIBLE_DEVICES, else all)."""
    import torch

    count = torch.cuda.device_count()
    given = given_gpus()
    return [int(d) for d in given[:count]] if given and all(is_whole(d) for d in given) else list(range(count))


def energy_check(base: TrainConfig, size, out: Path, gpus: list[int]) -> dict:
    run_dir = out / "energy"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cfg = base.replace(out_dir=str(run_dir), steps=size.pick(12, ENERGY_STEPS), timing_warmup=size.pick(2, 200))
    monitor = None
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": str(gpus[0])} if gpus else {})}
    with open(run_dir / "gpu_monitor.csv", "w") as csv:
        if gpus and shutil.which("nvidia-smi"):
            monitor = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,index,power.draw", "--format=csv",
                                        "-lms", "100", "-i", str(gpus[0])], stdout=csv)
        try:
            subprocess.run([sys.executable, "-m", "tutorial_lib", "train", *cfg.to_overrides()], env=env,
                           check=True, stdout=subprocess.DEVNULL, timeout=size.pick(300, 240))
        finally:
            if monitor:
                monitor.terminate()
                monitor.wait()
    result = json.loads((run_dir / "result.json").read_text())
    rec = {k: result.get(k) for k in ("device", "throughput_img_s", "energy_j", "joules_per_image", "gpu_hours",
                                      "energy_note")}
    if not monitor:
        return {**rec, "why": "no GPU and nvidia-smi here: nothing to check the counter against"}
    try:
        rows = energy.against_monitor(str(run_dir), gpus=gpus[:1])
    except energy.NoCounter as e:
        return {**rec, "why": str(e)}
    return {**rec, **rows[0], "within_5_percent": rows[0]["ratio"] is not None and abs(rows[0]["ratio"] - 1) <= 0.05}


def hang_check(base: TrainConfig, size, out: Path, gpus: list[int]) -> dict:
    if 0 < len(gpus) < 2:
        return {"why": f"the drill needs 2 GPUs for NCCL; this node has {len(gpus)}"}
    cfg = base.replace(out_dir=str(out / "hang"), steps=40, log_every=1, timing_warmup=1, compile=False,
                       cuda_graph=False, **({} if size.small else {"batch_size": 256}))
    t = time.time()
    report = hang.drill(cfg, nproc=2, freeze_rank=1, at_step=size.pick(3, 10),
                        dist_timeout_s=size.pick(3, HANG_TIMEOUT_S))
    return {"backend": "nccl" if gpus else "gloo", "dist_timeout_s": report.dist_timeout_s,
            "after_freeze_s": report.after_freeze_s, "drill_s": time.time() - t, "suspects": report.suspects,
            "waited_in": report.waited_in, "fr_missing_ranks": report.fr_missing_ranks,
            "fr_collective": report.fr_collective, "verdict": report.verdict()}


def numa_check(base: TrainConfig, size, out: Path, gpus: list[int]) -> dict:
    said = subprocess.run([sys.executable, "-m", "tutorial_lib.numa", "--places"], capture_output=True, text=True,
                          check=True, timeout=60).stdout  # the doctor's reading (tutorial_lib/numa.py)
    places = [p for p in json.loads(said) if not gpus or p["gpu"] in gpus]
    where = {p["gpu"]: {"numa_node": p["numa_node"], "cpus": p["cpus"]} for p in places}
    nodes = {p["numa_node"] for p in places if p["numa_node"] is not None}
    if len(gpus) < 2:
        why = (f"no GPU here ({'no nvidia-smi' if not shutil.which('nvidia-smi') else 'none visible'})" if not gpus
               else "one GPU: DDP needs two")
        return {"gpus": where, "why": why}
    exclusive = len(nodes) < 2  # one NUMA node: its share of the node's cores for each rank
    mode = (f"each rank on its own share of the cores (every GPU sits on NUMA node {sorted(nodes) or ['?']}: "
            "binding to the node would change nothing)" if exclusive else "each rank on its GPU's NUMA node")
    runs = {}
    for i in (1, 2):  # alternated: a drift of the node shows as a spread, not as a binding effect
        for bound in (False, True):
            name = f"{'bound' if bound else 'unbound'}_{i}"
            cfg = base.replace(**NUMA_RUN, parallel="ddp", out_dir=str(out / "numa" / name))
            binder = ((sys.executable, "-m", "tutorial_lib.numa", "--exec-bound") + (("--exclusive",) if exclusive
                                                                                     else ())) if bound else ()
            words = torchrun_command(cfg, len(gpus), wrapper=binder)  # the binder runs the CLI in its place
            subprocess.run(words, check=True, stdout=subprocess.DEVNULL, timeout=180)
            runs[name] = json.loads((Path(cfg.out_dir) / "result.json").read_text())["throughput_img_s"]
    unbound = [v for k, v in runs.items() if k.startswith("unbound")]
    bound = [v for k, v in runs.items() if k.startswith("bound")]
    return {"gpus": where, "img_s": runs, "bound_over_unbound": sum(bound) / sum(unbound), "mode": mode,
            "verdict": binding_verdict(runs), "run": {**NUMA_RUN, "gpus": len(gpus)}}


def binding_verdict(img_s: dict) -> str:
    """Bound against unbound pair by pair (each pair run back to back), by the workbook's one rule (noise.compare:
    single runs, so only the cross-process floor judges them): an effect of binding only where both pairs agree;
    pairs that disagree mean the node drifts as much as binding could change."""
    pairs = [(img_s[f"bound_{i}"], img_s[f"unbound_{i}"]) for i in (1, 2)]
    words = ", ".join(f"x{b / u:.2f}" for b, u in pairs)
    rel = {noise.compare(noise.Figure.of(b), noise.Figure.of(u)).verdict for b, u in pairs}
    beyond = f"beyond the {noise.FLOOR:.0%} that two runs differ by anyway"
    if rel == {"higher"}:
        return f"bound is faster in both pairs ({words}), {beyond}"
    if rel == {"lower"}:
        return f"bound is slower in both pairs ({words}), {beyond}"
    if rel == {"equal"}:
        return f"within noise in both pairs ({words}): binding changes nothing measurable here"
    return (f"the two pairs disagree ({words}): the runs drift as much as binding could change them, so this "
            "measurement does not settle it")
