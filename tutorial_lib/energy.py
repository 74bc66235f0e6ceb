"""What a run cost in energy: each GPU's total-energy counter (NVML, in millijoules since the driver loaded) read
at three marks of the step clock (meters.StepClock): the loop's start, the start of the timed window (after the
warm-up) and its end (when the Result's timing is computed, right after the last step; with ckpt_every or a
resumed run, after the final checkpoint). The timed window gives joules per image; the whole loop, the energy to
a target accuracy. GPU-hours are arithmetic on the Result (results.costs); notebook 06's ledger shows both.

Where there is no counter, the energy is null and the Result says why (energy_note): a CPU run, no NVML library
(pip install nvidia-ml-py; torch 2.14's cuda-bindings also carry one), a GPU without the counter (before Volta)
or a MIG slice. The GPUs counted are those this process allocated memory on during the loop: its own GPU under
DDP, every GPU of a DataParallel run.
"""
from __future__ import annotations

import time

import torch

from . import distributed


class NoCounter(Exception):
    """Why this process can't read a GPU's energy counter (the Result's energy_note)."""


def _nvml():
    """(handle of a GPU by its UUID, total energy in mJ of a handle) from pynvml (nvidia-ml-py) or cuda.bindings."""
    errors = []
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByUUID, pynvml.nvmlDeviceGetTotalEnergyConsumption
    except Exception as e:  # noqa: BLE001  not installed, or no driver library
        errors.append(f"pynvml: {str(e).splitlines()[0][:80] if str(e) else type(e).__name__}")
    try:
        from cuda.bindings import nvml

        nvml.init_v2()
        return nvml.device_get_handle_by_uuid, nvml.device_get_total_energy_consumption
    except Exception as e:  # noqa: BLE001
        errors.append(f"cuda.bindings.nvml: {str(e).splitlines()[0][:80] if str(e) else type(e).__name__}")
    raise NoCounter("no NVML library could be loaded (" + "; ".join(errors) + "): pip install nvidia-ml-py")


_READER: list = []  # the NVML functions, found once per process


def read_mj(index: int) -> int:
    """GPU `index`'s (as torch numbers it) total energy counter in mJ, or NoCounter with the reason."""
    if not _READER:
        _READER.append(_nvml())
    by_uuid, energy = _READER[0]
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    if not uuid:
        raise NoCounter(f"torch {torch.__version__} does not give GPU {index}'s UUID, which NVML needs")
    try:
        return int(energy(by_uuid(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")))
    except Exception as e:  # noqa: BLE001  NVML's errors differ by binding
        raise NoCounter(f"NVML has no energy counter for {props.name} ({str(e).splitlines()[0][:80]}): "
                        "before Volta, or a MIG slice") from None


def _allocations(index: int) -> int:
    return int(torch.cuda.memory_stats(index).get("allocation.all.allocated", 0))


class EnergyMeter:
    """The energy counters of this process's GPUs at the step clock's marks ("loop", "window", "end")."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: dict = {}  # name -> (host seconds, {gpu: mJ}, {gpu: allocations so far})
        self.wall: dict = {}  # name -> Unix time
        self.note = None if self.cuda else "no GPU: a CPU run has no energy counter"

    def mark(self, name: str) -> None:
        now, gpus = time.perf_counter(), range(torch.cuda.device_count()) if self.cuda and not self.note else ()
        self.wall[name] = time.time()  # the same moment on the wall clock (to line it up with nvidia-smi's samples)
        try:
            self.marks[name] = (now, {i: read_mj(i) for i in gpus}, {i: _allocations(i) for i in gpus})
        except NoCounter as e:
            self.note, self.marks[name] = str(e), (now, {}, {})

    def _seconds(self) -> float | None:
        return self.marks["end"][0] - self.marks["loop"][0] if {"loop", "end"} <= set(self.marks) else None

    def mine(self) -> dict:
        """This process's share: {"gpus": GPUs it used, "window_j": [J per GPU], "loop_j": J, "loop_s": s, "note"}."""
        seconds = self._seconds()
        if not self.cuda:
            return {"gpus": 0, "window_j": [], "loop_j": 0.0, "loop_s": seconds, "note": self.note}
        if self.note or not {"loop", "window", "end"} <= set(self.marks):
            return {"gpus": 1, "window_j": [], "loop_j": 0.0, "loop_s": seconds,
                    "note": self.note or "the run ended before its timed window"}
        (_, loop, a0), (_, window, _), (_, end, a1) = (self.marks[k] for k in ("loop", "window", "end"))
        used = [i for i in end if a1[i] > a0[i]] or list(end)[:1]  # the GPUs this process allocated on
        return {"gpus": len(used), "window_j": [(end[i] - window[i]) / 1000 for i in used],
                "loop_j": sum(end[i] - loop[i] for i in used) / 1000, "loop_s": seconds, "note": None}


def fields(meter: EnergyMeter, env: distributed.DistEnv, images_timed: int) -> dict:
    """The Result's energy fields, over every rank (notebook 06's ledger): GPUs used, the timed window's energy
    (all GPUs, and per GPU), joules per image, the whole loop's energy and seconds; null with energy_note where
    a rank has no counter."""
    meter.mark("end")
    every = distributed.all_gather(meter.mine(), env)
    note = next((m["note"] for m in every if m["note"]), None)
    per_gpu = None if note else [round(j, 3) for m in every for j in m["window_j"]]
    energy = None if note else sum(per_gpu)
    seconds = [m["loop_s"] for m in every if m["loop_s"] is not None]
    return dict(gpus=sum(m["gpus"] for m in every), energy_j=energy, energy_per_gpu_j=per_gpu, energy_note=note,
                joules_per_image=energy / images_timed if energy is not None and images_timed else None,
                energy_loop_j=None if note else sum(m["loop_j"] for m in every),
                loop_s=max(seconds) if seconds else None,
                energy_window_unix=[meter.wall.get("window"), meter.wall.get("end")])


def against_monitor(out_dir: str, gpus: list[int] | None = None) -> list[dict]:
    """A check of the energy counter: per GPU, the run's timed-window energy (result.json) beside the integral of
    the power.draw samples of the job's GPU monitor (<out_dir>/gpu_monitor.csv: a job with gpu_monitor=, or
    nvidia-smi run by hand with the same --query-gpu and --format=csv) over the same window, and their ratio.
    `gpus`: the monitor's GPU indexes that ran the ranks, in rank order (default 0..gpus-1)."""
    import csv
    from datetime import datetime
    from pathlib import Path

    from .results import read_record

    result = read_record(Path(out_dir) / "result.json", "a workbook result",
                         "run the same training command again: it writes it again")
    t0, t1 = result.get("energy_window_unix") or (None, None)
    if result.get("energy_per_gpu_j") is None or t0 is None:
        raise NoCounter(f"{out_dir}/result.json has no energy: {result.get('energy_note')}")
    samples: dict = {}
    with open(Path(out_dir) / "gpu_monitor.csv") as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            when = datetime.strptime(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            watts = row.get("power.draw [W]", "").split(" ")[0]
            if watts.replace(".", "", 1).isdigit():
                samples.setdefault(int(row["index"]), []).append((when, float(watts)))
    out = []
    for rank, (gpu, nvml) in enumerate(zip(gpus or range(len(result["energy_per_gpu_j"])),
                                           result["energy_per_gpu_j"])):
        smi = integrate(sorted(samples.get(gpu, [])), t0, t1)
        out.append({"rank": rank, "gpu": gpu, "nvml_j": nvml, "power_draw_j": smi, "window_s": t1 - t0,
                    "ratio": None if not smi else nvml / smi})
    return out


def integrate(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """The integral over [t0, t1] of the line through (time, watts) samples, in joules; None with fewer than
    two samples inside the window."""
    if sum(t0 <= t <= t1 for t, _ in samples) < 2:
        return None

    def at(t):  # watts at time t, on the line between the samples around it
        before = [s for s in samples if s[0] <= t][-1:] or samples[:1]
        after = [s for s in samples if s[0] >= t][:1] or samples[-1:]
        (ta, wa), (tb, wb) = before[0], after[0]
        return wa if tb == ta else wa + (wb - wa) * (t - ta) / (tb - ta)
    points = [(t0, at(t0))] + [s for s in samples if t0 < s[0] < t1] + [(t1, at(t1))]
    return sum((tb - ta) * (wa + wb) / 2 for (ta, wa), (tb, wb) in zip(points, points[1:]))
