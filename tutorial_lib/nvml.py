"""What the GPUs are doing while something runs, read from NVML: the library under nvidia-smi and
torch.cuda.utilization, power_draw, temperature and clock_rate, here opened through ctypes, so it needs no Python
package, only the driver's libnvidia-ml.so.1.

    with nvml.Sampler([0, 1], every_s=0.2) as gpus:   # NVML's GPU indexes, the same as nvidia-smi's
        ...                                            # a thread takes a Sample of each GPU every 0.2 s
    nvml.window_figures(gpus.samples, 2, end, seconds) # mean utilisation and peak memory over a timed window
    nvml.start_and_end(gpus.samples)                   # clock, power and temperature at the start and the end

Without NVML (a CPU machine, no driver) the sampler takes no sample and its `note` says why. The case runner of
the GPU studies and the baseline study sample through it; a job's own monitor stays nvidia-smi's CSV, written by
the job's bash (templates), so that a job needs no Python beside its training to record its GPUs.
"""
from __future__ import annotations

import ctypes
import statistics
import threading
import time
from typing import NamedTuple

LIBRARY = "libnvidia-ml.so.1"
CLOCK_SM, TEMPERATURE_GPU = 1, 0  # nvmlClockType_t NVML_CLOCK_SM, nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU


class Sample(NamedTuple):
    t: float  # Unix time
    gpu: int  # NVML's index (nvidia-smi's)
    util_pct: float | None  # the share of the last sample period in which a kernel ran, in %
    mem_used_mib: float | None  # device memory in use, MiB (2**20 bytes)
    sm_clock_mhz: float | None
    power_w: float | None
    temperature_c: float | None


class NoNvml(Exception):
    """Why NVML can't be read here (the sampler's note)."""


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]  # nvmlUtilization_t


class Memory(ctypes.Structure):  # nvmlMemory_t, in bytes
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Nvml:
    """NVML's C functions (`lib`: the loaded library, or anything with the same functions) for what a Sample holds."""

    def __init__(self, lib=None):
        if lib is None:
            try:
                lib = ctypes.CDLL(LIBRARY)
            except OSError as e:
                raise NoNvml(f"no NVML here: {LIBRARY}, the NVIDIA driver's library, does not load ({e})") from None
            lib.nvmlErrorString.restype = ctypes.c_char_p
        self.lib = lib
        self._check(lib.nvmlInit_v2(), "nvmlInit_v2")

    def _check(self, code: int, what: str) -> None:
        if code != 0:  # NVML_SUCCESS
            said = self.lib.nvmlErrorString(code)
            raise NoNvml(f"NVML's {what} failed: {said.decode() if isinstance(said, bytes) else said} (code {code})")

    def handle(self, index: int) -> ctypes.c_void_p:
        device = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.pointer(device)),
                    f"nvmlDeviceGetHandleByIndex_v2 for GPU {index}")
        return device

    def read(self, device: ctypes.c_void_p) -> tuple:
        """(util %, memory used MiB, SM clock MHz, power W, temperature C) of a device; None for a figure this GPU
        does not report (NVML_ERROR_NOT_SUPPORTED: power on some cards, utilisation of a MIG slice)."""
        util, memory, clock, power, temp = Utilization(), Memory(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        lib, p = self.lib, ctypes.pointer
        codes = [lib.nvmlDeviceGetUtilizationRates(device, p(util)),
                 lib.nvmlDeviceGetMemoryInfo(device, p(memory)),
                 lib.nvmlDeviceGetClockInfo(device, CLOCK_SM, p(clock)),
                 lib.nvmlDeviceGetPowerUsage(device, p(power)),
                 lib.nvmlDeviceGetTemperature(device, TEMPERATURE_GPU, p(temp))]
        values = (float(util.gpu), memory.used / 2**20, float(clock.value), power.value / 1000, float(temp.value))
        return tuple(v if code == 0 else None for v, code in zip(values, codes))  # power: NVML gives milliwatts

    def shutdown(self) -> None:
        self.lib.nvmlShutdown()


class Sampler:
    """A Sample of each GPU of `gpus` every `every_s` seconds, in a thread, while in use (`with`, or start/stop).
    `nvml`: an Nvml to read (default: the driver's). Without NVML it takes none and `note` says why."""

    def __init__(self, gpus, every_s: float = 1.0, nvml: Nvml | None = None):
        self.gpus, self.every_s, self.samples, self.note = list(gpus), every_s, [], None
        self._nvml, self._own, self._stop, self._thread = nvml, nvml is None, threading.Event(), None

    def start(self) -> Sampler:
        try:
            self._nvml = self._nvml or Nvml()
            handles = [(gpu, self._nvml.handle(gpu)) for gpu in self.gpus]
        except NoNvml as e:
            self.note = str(e)
            return self
        self._thread = threading.Thread(target=self._run, args=(handles,), daemon=True)
        self._thread.start()
        return self

    def _run(self, handles: list) -> None:
        while not self._stop.is_set():
            now = time.time()
            self.samples += [Sample(now, gpu, *self._nvml.read(device)) for gpu, device in handles]
            self._stop.wait(self.every_s)

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            if self._own:
                self._nvml.shutdown()
        return self.samples

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def window_figures(samples: list, gpus: int, end: float | None, seconds: float | None) -> dict:
    """Per GPU 0..gpus-1: mean utilisation (%) over every sample in [end - seconds, end] (a sample at 0% counts),
    and the peak memory used (MiB)."""
    if end is None or not seconds:
        return {}
    inside = [s for s in samples if end - seconds <= s[0] <= end and s[1] < gpus]
    by_gpu = {i: [s for s in inside if s[1] == i and s[2] is not None] for i in range(gpus)}
    if not all(by_gpu.values()):
        return {"note": f"fewer than one sample per GPU in the {seconds:.1f} s timed window"}
    return {"util_pct": [round(sum(s[2] for s in v) / len(v), 1) for v in by_gpu.values()],
            "mem_used_mib": [max(s[3] for s in v) for v in by_gpu.values()],
            "samples_per_gpu": min(len(v) for v in by_gpu.values())}


def start_and_end(samples: list[Sample]) -> dict:
    """The median SM clock (MHz), power (W) and temperature (C) over the first and the last tenth of the samples
    (at least one each): whether a long run slows down as the card heats up. Figures a GPU did not report: left out."""
    tenth, out = max(1, len(samples) // 10), {}
    for part, some in (("start", samples[:tenth]), ("end", samples[-tenth:])):
        for what in ("sm_clock_mhz", "power_w", "temperature_c"):
            values = [getattr(s, what) for s in some if getattr(s, what) is not None]
            if values:
                out[f"{part}_{what}"] = statistics.median(values)
    return out
