"""The doctor's checks of the GPUs (`tutorial_lib.doctor`): what torch and nvidia-smi see, the driver against
torch's CUDA, bf16, a real NCCL all-reduce between the GPUs; and the GPU node's reference record that
`python -m tutorial_lib doctor --out DIR [--reference]` writes (`save`). Torch itself runs in subprocesses (the
torch probe, the all-reduce), so that a broken torch is a FAIL line, not a crash of the doctor."""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from functools import cached_property
from pathlib import Path

from . import busbw, reference
from .config import ROOT, UserError
from .sitecheck import Check
from .sitecheck import run_command as _run
from .values import count

MIN_DRIVER = {11: (450, 80), 12: (525, 60), 13: (580, 65)}  # CUDA major -> oldest Linux driver that runs it
GPU_CHECKS = ("gpus", "driver", "bf16", "nccl")  # the lines a GPU node's reference record keeps


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


TORCH_PROBE = r"""
import json, sys
out = {}
try:
    import torch
    out.update(torch=torch.__version__, cuda=torch.version.cuda, available=torch.cuda.is_available())
    n = torch.cuda.device_count() if out["available"] else 0
    out["gpus"] = [[torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory / 2**30]
                   for i in range(n)]
    out["bf16"] = bool(n and torch.cuda.is_bf16_supported())
    out["nccl"] = bool(torch.distributed.is_available() and torch.distributed.is_nccl_available())
    import torchvision
    out["torchvision"] = torchvision.__version__
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


class GpuFacts:
    """What torch and nvidia-smi see, each found once when a check asks for it (the doctor's Context has them;
    `self.opts` is its doctor.Options)."""

    @cached_property
    def torch(self) -> dict:
        code, out = _run([sys.executable, "-c", TORCH_PROBE], timeout=max(self.opts.timeout, 120))
        try:
            facts = json.loads(out.splitlines()[-1]) if out else {}
        except ValueError:
            facts = {}
        if code != 0 or not facts:
            facts.setdefault("error", out.splitlines()[-1] if out else "the torch probe printed nothing")
        facts["stderr"] = "\n".join(out.splitlines()[:-1])
        return facts

    @cached_property
    def smi(self) -> dict | None:
        """nvidia-smi's view: GPUs, driver, MIG slices; None without nvidia-smi."""
        if shutil.which("nvidia-smi") is None:
            return None
        code, out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader,nounits"], self.opts.timeout)
        if code != 0:
            return {"error": out.splitlines()[-1] if out else "nvidia-smi failed", "gpus": [], "driver": None}
        rows = [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.count(",") == 2]
        _, listing = _run(["nvidia-smi", "-L"], self.opts.timeout)
        mig = re.findall(r"MIG (\S+)\s+Device", listing)
        return {"gpus": [(r[0], float(r[1]) / 1024) for r in rows], "driver": rows[0][2] if rows else None,
                "mig": mig}


def _gpu_skip(ctx: GpuFacts, name: str, what: str) -> Check | None:
    if "error" in ctx.torch:
        return Check(name, "SKIP", f"{what}: skipped, torch does not import")
    if not ctx.torch["gpus"] and not (ctx.smi and ctx.smi["gpus"]):
        return Check(name, "SKIP", f"{what}: skipped, no GPU visible")
    return None


def check_gpus(ctx: GpuFacts) -> Check:
    t, smi = ctx.torch, ctx.smi
    if "error" in t:
        return Check("gpus", "FAIL", f"torch does not import: {t['error']}", "make venv")
    if not t["gpus"] and not (smi and smi["gpus"]):
        return Check("gpus", "WARN", "no GPU visible (" + ("no nvidia-smi" if smi is None else "nvidia-smi lists "
                     "none") + f", torch {t['torch']} sees none): notebooks run with small sizes on the CPU; the "
                     "driver, bf16 and NCCL checks are skipped", "run on a GPU node for full sizes")
    if not t["gpus"]:
        return Check("gpus", "FAIL", f"nvidia-smi lists {count(len(smi['gpus']), 'GPU')} but torch sees none",
                     "see the driver line; check CUDA_VISIBLE_DEVICES")
    names = sorted({n for n, _ in t["gpus"]})
    memory = ", ".join(f"{m:.1f} GiB" for m in sorted({round(m, 1) for _, m in t["gpus"]}))
    mig = f"; MIG slices: {', '.join(smi['mig'])}" if smi and smi.get("mig") else ""
    return Check("gpus", "PASS", f"{count(len(t['gpus']), 'GPU')}: {', '.join(names)}, {memory} each{mig}")


def check_driver(ctx: GpuFacts) -> Check:
    skip = _gpu_skip(ctx, "driver", "driver vs torch's CUDA")
    if skip:
        return skip
    t, smi = ctx.torch, ctx.smi
    driver = smi.get("driver") if smi else None
    if t["cuda"] is None:
        return Check("driver", "FAIL", f"torch {t['torch']} is a CPU-only build", "make venv (the lock's CUDA torch)")
    need = MIN_DRIVER.get(int(t["cuda"].split(".")[0]))
    too_old = driver and need and _version_tuple(driver)[:2] < need
    if not t["available"] or too_old:
        why = f"driver {driver} is older than {need[0]}.{need[1]}" if too_old else "CUDA does not initialise"
        return Check("driver", "FAIL", f"torch {t['torch']} (CUDA {t['cuda']}) cannot use the GPUs: {why}",
                     "a newer NVIDIA driver on the node, or a torch built for an older CUDA")
    return Check("driver", "PASS", f"driver {driver or 'unknown (no nvidia-smi)'} runs torch's CUDA {t['cuda']}")


def check_bf16(ctx: GpuFacts) -> Check:
    skip = _gpu_skip(ctx, "bf16", "bf16 support (notebook 04)")
    if skip:
        return skip
    if ctx.torch["bf16"]:
        return Check("bf16", "PASS", "bf16 supported (notebook 04's bf16 runs use it)")
    return Check("bf16", "WARN", "this GPU has no bf16: notebook 04's bf16 cells fall back slowly",
                 "use precision=fp16 on this GPU (Volta, Turing)")


def check_nccl(ctx: GpuFacts) -> Check:
    skip = _gpu_skip(ctx, "nccl", "NCCL all-reduce (notebooks 05, 06)")
    if skip:
        return skip
    if len(ctx.torch["gpus"]) < 2:
        return Check("nccl", "SKIP", "1 GPU visible: the all-reduce between GPUs is skipped")
    if not ctx.torch["nccl"]:
        return Check("nccl", "FAIL", "this torch has no NCCL", "a CUDA build of torch (make venv)")
    ok, text = allreduce("nccl", len(ctx.torch["gpus"]), timeout=max(ctx.opts.timeout, 120))
    return Check("nccl", "PASS" if ok else "FAIL", text,
                 "" if ok else "NCCL_DEBUG=INFO python -m tutorial_lib doctor shows why; check NCCL_* variables")


def allreduce(backend: str, nproc: int, timeout: float) -> tuple[bool, str]:
    """A real all-reduce over `nproc` processes (nccl: one per visible GPU) in a subprocess: (ok, its line)."""
    code = f"from tutorial_lib.gpucheck import _allreduce_main; _allreduce_main({backend!r}, {nproc})"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=ROOT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"{backend} all-reduce over {nproc} processes did not finish within {timeout:.0f} s"
    lines = (p.stdout + p.stderr).strip().splitlines()
    ok = p.returncode == 0 and bool(lines) and lines[-1].startswith("all-reduce")
    return ok, lines[-1] if lines else f"exit code {p.returncode}, no output"


def _allreduce_main(backend: str, nproc: int) -> None:
    import torch.multiprocessing as mp  # torch only in the probe's subprocess: a broken torch is a FAIL line

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_allreduce_rank, args=(backend, nproc, port), nprocs=nproc)


def _allreduce_rank(rank: int, backend: str, nproc: int, port: int) -> None:
    import torch  # in the probe's processes only (see _allreduce_main)
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)  # else every rank's NCCL communicator starts on GPU 0
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nproc,
                            timeout=datetime.timedelta(seconds=60))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    x = torch.full((1,), float(rank + 1), device=device)
    dist.all_reduce(x)
    big = torch.ones((64 if backend == "nccl" else 1) * 2**18, device=device)  # 64 MiB (nccl) or 1 MiB of fp32
    seconds = busbw.timed_allreduce(big, 5)  # the card's measurement too (lessons/allreduce.py)
    expected = nproc * (nproc + 1) / 2
    if rank == 0:
        if x.item() != expected:
            raise SystemExit(f"wrong all-reduce result {x.item()} (expected {expected})")
        print(f"all-reduce over {nproc} {backend} ranks correct; {busbw.words(big.numel() * 4, seconds, nproc)}, "
              f"on {device.type}", flush=True)
    dist.destroy_process_group()


def save(report, out: Path, write_reference: bool = False) -> list[Path]:
    """`--out`: the report (a doctor.Report) as JSON and as the table, and its GPU lines as the reference record `doctor` (in
    out/reference/; with --reference also in notebooks/reference/, only from a machine with a CUDA GPU)."""
    (out / "reference").mkdir(parents=True, exist_ok=True)
    paths = [out / "doctor.json", out / "doctor.txt"]
    paths[0].write_text(report.to_json() + "\n")
    paths[1].write_text(report.table() + "\n")
    figures = {c.name: f"{c.status}: {c.message}" for c in report.checks if c.name in GPU_CHECKS}
    figures["seconds_all_checks"] = round(sum(c.seconds for c in report.checks), 1)
    gpus = report.torch.get("gpus") or []
    where = {"card": gpus[0][0] if gpus else "none (no CUDA GPU visible)", "gpus": len(gpus),
             "torch_version": report.torch.get("torch", "not importable")}
    script = "python -m tutorial_lib doctor --out"
    paths.append(reference.write("doctor", figures, script=script, folder=out / "reference", **where))
    if write_reference:
        if not gpus:
            raise UserError("--reference records a GPU node's checks, but no CUDA GPU is visible here")
        paths.append(reference.write("doctor", figures, script=script, **where))
    return paths
