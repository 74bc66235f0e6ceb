"""The one GPU sampler of the studies (tutorial_lib/nvml.py): NVML's C functions through ctypes, here a fake library
with the same functions (no GPU on CI), the sampler's thread, and the figures the case runner and the baseline
study keep from its samples."""
import ctypes
import time

import pytest

from tutorial_lib import nvml
from tutorial_lib.lessons import cases

NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


class FakeNvml:
    """NVML's functions as ctypes calls them: results written through the pointers given, 0 for success. GPU i
    reports utilisation 40 + 10 i %, 1.5 GiB + i MiB in use, 1980 MHz, 500.25 W (in mW) and 45 C; `no_power`: GPUs
    whose power is not supported."""

    def __init__(self, gpus=2, no_power=(), init=0):
        self.gpus, self.no_power, self.init, self.calls = gpus, set(no_power), init, []

    def nvmlInit_v2(self):
        return self.init

    def nvmlErrorString(self, code):
        return {999: b"Unknown Error", 2: b"Invalid Argument"}[code]

    def nvmlShutdown(self):
        self.calls.append("shutdown")
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, out):
        if index.value >= self.gpus:
            return 2
        out.contents.value = 1000 + index.value  # a handle: any pointer value NVML chooses
        return 0

    def gpu(self, device):
        return device.value - 1000

    def nvmlDeviceGetUtilizationRates(self, device, out):
        out.contents.gpu, out.contents.memory = 40 + 10 * self.gpu(device), 7
        return 0

    def nvmlDeviceGetMemoryInfo(self, device, out):
        out.contents.total, out.contents.used = 80 * 2**30, 3 * 2**29 + self.gpu(device) * 2**20
        return 0

    def nvmlDeviceGetClockInfo(self, device, clock, out):
        assert clock == nvml.CLOCK_SM
        out.contents.value = 1980
        return 0

    def nvmlDeviceGetPowerUsage(self, device, out):
        if self.gpu(device) in self.no_power:
            return NOT_SUPPORTED
        out.contents.value = 500250
        return 0

    def nvmlDeviceGetTemperature(self, device, sensor, out):
        assert sensor == nvml.TEMPERATURE_GPU
        out.contents.value = 45
        return 0


def test_each_figure_is_read_in_its_unit_and_a_figure_not_supported_is_none():
    lib = nvml.Nvml(FakeNvml(no_power={1}))
    assert lib.read(lib.handle(0)) == (40.0, 1536.0, 1980.0, 500.25, 45.0)  # MiB of 2**20 bytes, W from mW
    assert lib.read(lib.handle(1)) == (50.0, 1537.0, 1980.0, None, 45.0)
    with pytest.raises(nvml.NoNvml, match=r"nvmlDeviceGetHandleByIndex_v2 for GPU 5 failed: Invalid Argument \(code 2\)"):
        lib.handle(5)
    with pytest.raises(nvml.NoNvml, match=r"NVML's nvmlInit_v2 failed: Unknown Error"):
        nvml.Nvml(FakeNvml(init=999))


def test_the_sampler_samples_every_gpu_until_stopped():
    fake = FakeNvml()
    with nvml.Sampler([0, 1], every_s=0.01, nvml=nvml.Nvml(fake)) as sampler:
        deadline = time.time() + 10
        while len(sampler.samples) < 6 and time.time() < deadline:
            time.sleep(0.01)
    taken = len(sampler.samples)
    time.sleep(0.05)
    assert taken >= 6 and len(sampler.samples) == taken and sampler.note is None  # none after the stop
    assert {s.gpu for s in sampler.samples} == {0, 1}
    assert sampler.samples[0]._replace(t=0) == nvml.Sample(0, 0, 40.0, 1536.0, 1980.0, 500.25, 45.0)
    assert "shutdown" not in fake.calls  # an Nvml given is the caller's to shut down


def test_without_nvml_the_sampler_says_why_and_the_case_monitor_keeps_the_note(monkeypatch):
    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    with nvml.Sampler([0]) as sampler:
        pass
    assert sampler.samples == [] and sampler.note.startswith("no NVML here: libnvidia-ml.so.1, the NVIDIA driver's "
                                                             "library, does not load (libnvidia-ml.so.1: cannot open")
    monitor = cases.Monitor(2)
    assert monitor.stop(time.time(), 1.0) == {"note": sampler.note}


def test_the_case_monitor_keeps_the_timed_windows_utilisation_and_peak_memory(monkeypatch):
    real = nvml.Nvml
    monkeypatch.setattr(nvml, "Nvml", lambda: real(FakeNvml()))  # the driver's library, as the fake
    monitor = cases.Monitor(2)
    deadline = time.time() + 10
    while len(monitor.sampler.samples) < 4 and time.time() < deadline:  # every 200 ms: two rounds of two GPUs
        time.sleep(0.05)
    got = monitor.stop(time.time(), 60.0)
    assert got["util_pct"] == [40.0, 50.0] and got["mem_used_mib"] == [1536.0, 1537.0] and got["samples_per_gpu"] >= 1


def test_start_and_end_are_the_medians_of_the_first_and_last_tenth():
    samples = [nvml.Sample(t, 0, 90.0, 1000.0, 1980.0 - t, 400.0 + t, 40.0 + t) for t in range(20)]
    samples[-1] = samples[-1]._replace(power_w=None)  # a figure not reported is left out, not counted as 0
    got = nvml.start_and_end(samples)
    assert got == {"start_sm_clock_mhz": 1979.5, "start_power_w": 400.5, "start_temperature_c": 40.5,
                   "end_sm_clock_mhz": 1961.5, "end_power_w": 418.0, "end_temperature_c": 58.5}
    assert nvml.start_and_end([]) == {}
