"""Profiling: traces per rank, the offline summary (CPU, GPU, DDP), TensorBoard's profiler plugin, line_profiler."""
import gzip
import json
import time
from pathlib import Path

import pytest

from conftest import tiny
from tutorial_lib import engine, profiling, tensorboard
from tutorial_lib.config import UserError
from tutorial_lib.lessons import size, studies
from tutorial_lib.trace_summary import PARTS, summarize

FIXTURES = Path(__file__).parent / "fixtures"
GPU_FIXTURE = FIXTURES / "gpu_resnet18_bf16.pt.trace.json.gz"
TOLERANCE = 0.01  # the parts of a step add up to the step time within 1%
PROFILE = dict(profile=True, profile_wait=1, profile_warmup=1, profile_active=2, steps=5, eval=False)


def assert_parts_add_up(summary):
    for step in summary.steps:
        assert step.step_ms > 0
        assert sum(step.parts_ms.values()) == pytest.approx(step.step_ms, rel=TOLERANCE), step
        assert all(v >= 0 for v in step.parts_ms.values()), step


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A short single-process CPU run with profile=true (trained once for the tests below)."""
    out = tmp_path_factory.mktemp("prof") / "cpu"
    engine.train(tiny(out, tensorboard=True, **PROFILE))
    return out


def test_profile_true_writes_one_gzipped_trace_for_the_rank(cpu_run):
    files = list(profiling.trace_dir(cpu_run).iterdir())
    assert [f.name.split(".")[0] for f in files] == ["rank0"] and files[0].name.endswith(".pt.trace.json.gz")
    events = json.load(gzip.open(files[0]))["traceEvents"]
    steps = [e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # wait 1 + warmup 1, then 2 recorded steps


def test_cpu_trace_summary_splits_each_step_into_parts_that_add_up(cpu_run):
    s = summarize(cpu_run)
    assert len(s) == 1 and s[0].worker == "rank0" and s[0].view == "host" and s[0].device == "CPU"
    assert len(s[0].steps) == 2
    assert_parts_add_up(s[0])
    parts = s[0].parts_ms
    # the engine's phase labels reached the trace: each phase of the step is found
    assert parts["compute"] > 0 and parts["optimizer"] > 0 and parts["copy"] > 0 and parts["data"] > 0
    assert s[0].top_kernels == [] and "no GPU kernels" in s[0].kernels_table()
    assert s[0].top_ops[0]["self_cpu_ms"] > 0 and s[0].top_ops[0]["name"].startswith("aten::")
    text = str(s)
    assert "ms/step" in text and "CPU" in text and "compute (fwd + bwd)" in text


def test_summary_figure_has_one_bar_per_step_and_part(cpu_run):
    import matplotlib

    matplotlib.use("Agg")
    fig = summarize(cpu_run).plot()
    left = fig.axes[0]
    assert len(left.patches) == 2 * len(PARTS)
    matplotlib.pyplot.close(fig)


def test_tensorboard_lists_the_run_in_the_profiler_plugin(cpu_run):
    tb = profiling.start_tensorboard(cpu_run.parent)
    run = f"{cpu_run.name}/tb/profile"
    try:
        runs = profiling.profiler_runs(tb, wait_for=run, timeout=90)
    finally:
        tensorboard.stop(tb)
    assert "Overview" in runs.get(run, []), runs


def test_profiling_two_cycles_warns_nothing_and_writes_a_trace_per_cycle(tmp_path):
    import warnings

    out = tmp_path / "two"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's "Profiler clears events at the end of each cycle"
        engine.train(tiny(out, **{**PROFILE, "steps": 9, "profile_repeat": 2}))
    files = sorted(profiling.trace_dir(out).iterdir(), key=lambda f: f.stat().st_mtime)
    steps = [[e["name"] for e in json.load(gzip.open(f))["traceEvents"]
              if e.get("name", "").startswith("ProfilerStep#")] for f in files]
    assert steps == [["ProfilerStep#2", "ProfilerStep#3"], ["ProfilerStep#6", "ProfilerStep#7"]]  # each its own


STALL_S = 6.0  # the slow trace writer's pause: far above 6 tiny steps, even on a loaded 2-core machine


def test_writing_a_trace_file_is_left_out_of_the_step_times(tmp_path, monkeypatch, one_thread):
    """A trace file takes seconds to write, in the middle of the timed steps: a profiled run would report a
    throughput (and, under DDP, every rank would wait for the writing one) that no training step had."""
    import torch

    real = torch.profiler.tensorboard_trace_handler

    def slow_writer(*args, **kwargs):
        write = real(*args, **kwargs)

        def handler(prof):
            time.sleep(STALL_S)
            write(prof)
        return handler
    monkeypatch.setattr(torch.profiler, "tensorboard_trace_handler", slow_writer)
    result = engine.train(tiny(tmp_path / "slow", **{**PROFILE, "steps": 7, "timing_warmup": 1}))
    assert result.step_time_ms["timed_steps"] == 6  # every step after the warm-up is timed; the writing is not
    assert result.step_time_ms["slowest_rank_total_s"] < STALL_S, result.step_time_ms  # 6 steps of < 1 s each


def test_too_few_steps_for_the_profiler_schedule_names_the_fix(tmp_path):
    from tutorial_lib.distributed import DistEnv

    with pytest.raises(UserError, match="use steps=4 or more"):
        with profiling.profiler(tiny(tmp_path / "short", **{**PROFILE, "steps": 3}), DistEnv()):
            pass


def test_the_traces_study_profiles_one_device_and_each_ddp_rank(tmp_path, one_thread, capsys):
    """`python -m tutorial_lib study traces --small` (scripts/gpu/profiling.sh on a GPU): the fixture, the baseline
    and a 2-rank DDP run (one trace per rank, summarised side by side), each checked, in a table and two plots."""
    assert studies.run("traces", size.Size(True, "test"), tmp_path) == {}  # tables only, no reference record
    record = json.loads((tmp_path / "traces.json").read_text())
    assert list(record) == ["fixture", "baseline_fp32", "ddp_2ranks"]
    fixture = tmp_path / "fixtures" / "cpu_resnet18_imagenet_fp32.pt.trace.json.gz"
    assert fixture.stat().st_size < 700_000 and summarize(fixture)[0].steps  # a file the repository can hold
    for name, r in record.items():
        for step, parts in zip(r["step_ms"], r["parts_ms"]):
            assert sum(parts.values()) == pytest.approx(step, rel=TOLERANCE, abs=0.01), name
    ddp = record["ddp_2ranks"]
    assert ddp["ranks"] == 2 and all(p["comm"] > 0 for p in ddp["parts_ms"])  # gloo all-reduce of the gradients
    assert "rank1" in capsys.readouterr().out  # side by side
    assert {f.name for f in (tmp_path / "figures").iterdir()} == {"baseline_fp32.png", "ddp_2ranks.png"}
    table = (tmp_path / "traces.md").read_text()
    assert "| ddp_2ranks | rank1 |" in table and "| baseline_fp32 | rank0 |" in table


def test_summarize_names_the_fix_when_there_is_no_trace(tmp_path):
    with pytest.raises(UserError, match="profile=true"):
        summarize(tmp_path)


def test_line_profile_reports_the_training_steps_lines_with_hit_counts(tmp_path):
    start = time.perf_counter()
    report = profiling.line_profile(engine.Run.train_step, engine.train, tiny(tmp_path / "lp", steps=3, eval=False))
    wall = time.perf_counter() - start
    assert isinstance(report.result, engine.Result)
    assert report.hits("self.scaler.scale(loss).backward()") == 3
    assert report.hits("loss = self.criterion(self.model(x), y)") == 3
    assert 0 < report.seconds("self.scaler.scale(loss).backward()") < wall  # seconds, not timer units
    assert report.seconds("no such line") == 0
    assert "self.scaler.scale(loss).backward()" in str(report) and "Hits" in str(report)


# ---------------------------------------------------------------------- GPU traces
def synthetic_gpu_trace(path):
    """One 100 us step with known answers: host phases, kernels on two streams, an NCCL all-reduce that
    overlaps backward and the optimizer, a host-to-device copy. Timestamps in microseconds."""
    host = dict(pid=100, tid=1)
    autograd = dict(pid=100, tid=2)
    gpu, side = dict(pid=0, tid=7), dict(pid=0, tid=8)

    def x(cat, name, ts, dur, where, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **where, "args": args}

    events = [
        x("user_annotation", "ProfilerStep#1", 0, 100, host),
        x("user_annotation", "data wait", 0, 20, host), x("user_annotation", "h2d copy", 15, 5, host),
        x("user_annotation", "forward", 20, 20, host), x("user_annotation", "backward", 40, 30, host),
        x("user_annotation", "optimizer", 70, 20, host),
        x("cpu_op", "aten::to", 15, 3, host), x("cuda_runtime", "cudaMemcpyAsync", 16, 1, host, correlation=1),
        x("cpu_op", "aten::convolution", 22, 8, host), x("cuda_runtime", "cudaLaunchKernel", 23, 1, host, correlation=2),
        x("cpu_op", "aten::convolution_backward", 42, 18, autograd),
        x("cuda_runtime", "cudaLaunchKernel", 43, 1, autograd, correlation=3),
        x("cpu_op", "record_param_comms", 62, 1, autograd),
        x("cuda_runtime", "cudaLaunchKernel", 62.5, 0.2, autograd, correlation=4),
        x("cpu_op", "aten::_foreach_add_", 72, 8, host), x("cuda_runtime", "cudaLaunchKernel", 73, 1, host, correlation=5),
        x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 17, 2, gpu, correlation=1, device=0),
        x("kernel", "void conv_fwd<float>(float*)", 24, 14, gpu, correlation=2, device=0),
        x("kernel", "void conv_bwd<float>(float*)", 44, 22, gpu, correlation=3, device=0),
        x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 63, 12, side,
          correlation=4, device=0),
        x("kernel", "void multi_tensor_apply_kernel<Adam>()", 74, 11, gpu, correlation=5, device=0),
        {"ph": "i", "name": "[memory]", "pid": 100, "tid": 1, "ts": 30, "s": "t",
         "args": {"Total Allocated": 3 * 2**20, "Device Type": 1, "Device Id": 0}},
    ]
    with gzip.open(path, "wt") as f:
        json.dump({"deviceProperties": [{"id": 0, "name": "Fake GPU"}], "traceEvents": events}, f)
    return path


def test_gpu_view_of_a_synthetic_trace_gives_the_known_parts(tmp_path):
    s = summarize(synthetic_gpu_trace(tmp_path / "rank0.1.pt.trace.json.gz"))[0]
    assert (s.view, s.device, s.peak_memory_mb) == ("gpu", "Fake GPU", {"GPU 0": 3.0})
    us = {p: round(v * 1000, 6) for p, v in s.parts_ms.items()}
    # compute: the two convolution kernels; optimizer: the Adam kernel; copy: the memcpy; comm: the part of
    # the all-reduce hidden by neither (66-74); data: GPU idle while the host fetched (0-17, 19-20); idle: rest
    assert us == {"compute": 36, "optimizer": 11, "copy": 2, "comm": 8, "data": 18, "idle": 25}
    assert [k["name"] for k in s.top_kernels][:2] == ["void conv_bwd<float>(float*)",
                                                     "void conv_fwd<float>(float*)"]
    assert s.top_ops[0]["name"] == "aten::convolution_backward" and s.top_ops[0]["device_ms"] == pytest.approx(0.022)


def test_kernels_launched_before_the_profiled_steps_are_not_counted_as_theirs(tmp_path):
    """A GPU behind the host still runs the profiler's warm-up steps when the trace starts; their kernels are
    recorded, but the per-step kernel table is the profiled steps' own work."""
    path = synthetic_gpu_trace(tmp_path / "rank0.1.pt.trace.json.gz")
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    trace["traceEvents"] += [  # one launched before the steps; one whose launch the trace did not record
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": -50, "dur": 1, "pid": 100, "tid": 1,
         "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "void warmup_step_kernel()", "ts": 1, "dur": 10, "pid": 0, "tid": 8,
         "args": {"correlation": 9, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "void earlier_step_kernel()", "ts": 2, "dur": 5, "pid": 0, "tid": 8,
         "args": {"correlation": 8, "device": 0}}]
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    s = summarize(path)[0]
    assert not {"void warmup_step_kernel()", "void earlier_step_kernel()"} & {k["name"] for k in s.top_kernels}
    assert sum(k["calls"] for k in s.top_kernels) == 4


def test_host_view_of_a_synthetic_trace_gives_the_known_parts(tmp_path):
    s = summarize(synthetic_gpu_trace(tmp_path / "rank0.1.pt.trace.json.gz"), view="host")[0]
    us = {p: round(v * 1000, 6) for p, v in s.parts_ms.items()}
    # copy 15-20, data 0-15, optimizer 70-90, comm 62-63 (the thread ran no operator), compute the rest of
    # forward and backward, idle 90-100
    assert us == {"copy": 5, "data": 15, "optimizer": 20, "comm": 1, "compute": 49, "idle": 10}


def test_recorded_gpu_trace_summary(tmp_path):
    if not GPU_FIXTURE.exists():
        pytest.skip("fixture not recorded yet: python -m tutorial_lib study traces records it on a GPU")
    s = summarize(GPU_FIXTURE)[0]
    assert s.view == "gpu" and s.steps
    assert_parts_add_up(s)
    assert s.parts_ms["compute"] > 0 and s.top_kernels and s.top_kernels[0]["ms"] > 0
    if s.peak_memory_mb:  # recorded with profile_memory=true
        assert s.peak_memory_mb.get("GPU 0", 0) > 0, s.peak_memory_mb
    host = summarize(GPU_FIXTURE, view="host")[0]
    assert_parts_add_up(host)


def test_gpu_view_follows_the_gpu_when_it_runs_behind_the_host(tmp_path):
    """Compute-bound: the host queues each 10 us step while the GPU needs 35 us for it. The GPU-view steps
    must be the GPU's (0-40, 40-75), not the host's (0-10, 10-20), or the step time would be understated."""
    host, gpu = dict(pid=100, tid=1), dict(pid=0, tid=7)

    def x(cat, name, ts, dur, where, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **where, "args": args}

    events = [
        x("user_annotation", "ProfilerStep#1", 0, 10, host), x("user_annotation", "ProfilerStep#2", 10, 10, host),
        x("cuda_runtime", "cudaLaunchKernel", 1, 1, host, correlation=1),
        x("cuda_runtime", "cudaLaunchKernel", 11, 1, host, correlation=2),
        x("kernel", "void conv<float>()", 5, 35, gpu, correlation=1, device=0),
        x("kernel", "void conv<float>()", 40, 35, gpu, correlation=2, device=0),
    ]
    path = tmp_path / "rank0.1.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = summarize(path)[0]
    assert [round(st.step_ms * 1000) for st in s.steps] == [40, 35]
    assert [round(st.parts_ms["compute"] * 1000) for st in s.steps] == [35, 35]
    assert_parts_add_up(s)


def test_time_parts_cut_the_step_on_the_host_clock_without_a_profiler(tmp_path):
    """time_parts=true: the host time of each labelled phase per timed step, in result.json; on a CPU, where the
    host does all the work, the phases cover nearly all of the step."""
    res = engine.train(tiny(tmp_path / "parts", steps=10, timing_warmup=2, time_parts=True))
    parts = dict(res.host_parts_ms)
    step = parts.pop("step")
    assert {"forward", "backward", "optimizer", "data wait"} <= set(parts), parts
    assert 0.8 < sum(parts.values()) / step <= 1.0, res.host_parts_ms
    assert abs(step / res.step_time_ms["mean"] - 1) < 0.25, (step, res.step_time_ms)
    assert engine.train(tiny(tmp_path / "off", steps=4, timing_warmup=1)).host_parts_ms is None
    traced = engine.train(tiny(tmp_path / "traced", time_parts=True, **PROFILE))  # writing the trace: no step
    assert abs(traced.host_parts_ms["step"] / traced.step_time_ms["mean"] - 1) < 0.25, traced.host_parts_ms


def test_host_parts_leave_out_the_phases_inside_them():
    from tutorial_lib.meters import PARTS

    PARTS.enabled = True
    try:
        PARTS.reset()
        with profiling.nvtx_range("outer", False):
            time.sleep(0.05)
            with profiling.nvtx_range("inner", False):
                time.sleep(0.1)
        PARTS.tick()
        parts = PARTS.per_step_ms(1)
    finally:
        PARTS.enabled = False
    assert 40 <= parts["outer"] < 90 and 95 <= parts["inner"] < 150, parts
    assert parts["step"] >= parts["outer"] + parts["inner"]


def _notebook_02_cell(fragment: str) -> str:
    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "02_profiling.ipynb").read_text())
    return next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code" and fragment in "".join(c["source"]))


def test_notebook_02_gpu_lines_and_peak_memory_read_right_with_h200_figures(capsys):
    """Notebook 02's GPU-only lines, run with the figures of its H200 run (torch 2.11): the line profiler's forward,
    backward and optimizer lines (23.5 ms) against the mean step *without* its wait for data (48.0 ms of which
    the first batch's wait for the starting workers was most; the lines of train_step never contain it: printed
    as '49% of the 48.0 ms mean step'), and the whole run's peak against the trace's GPU peak, not its CPU's."""
    from types import SimpleNamespace as NS

    import tutorial_lib as tl

    result = NS(step_time_ms={"mean": 48.0}, data_wait_ms=19.3, device="NVIDIA H200", peak_memory_mb=5_095.0)
    line_ms = {"forward": 8.13, "backward": 9.09, "optimizer": 6.30}
    exec(_notebook_02_cell("the three lines"), {"tl": tl, "report": NS(result=result), "line_ms": line_ms})
    here = capsys.readouterr().out.splitlines()[-1]
    assert here == "here, NVIDIA H200: the three lines 23.5 ms of a 28.7 ms step (its wait for data left out)", here
    trace = NS(peak_memory_mb={"GPU 0": 1_540.6, "CPU": 2_000.0}, memory_line=lambda: "peak memory ...")
    exec(_notebook_02_cell("max_memory_allocated over the run"), {"summary": [trace], "result": result})
    assert "5,095 MiB on NVIDIA H200 (3.3x the recorded steps' GPU peak)" in capsys.readouterr().out
