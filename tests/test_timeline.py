"""Notebook 02's timeline (tutorial_lib/lessons/timeline.py): a trace cut into rows of host threads and GPU
streams, its idle share, its plot, nsys stats kept to a screen, and the picture in 02's committed outputs."""
import gzip
import json
import os
import stat
from pathlib import Path

import pytest

from tutorial_lib import trace_summary
from tutorial_lib.config import TrainConfig, UserError
from tutorial_lib.lessons import timeline

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "gpu_resnet18_bf16.pt.trace.json.gz"


def span(name, ts, dur, cat, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": pid, "tid": tid, "args": args}


def write_trace(folder: Path, events) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rank0.1.pt.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]}, f)
    return path


def kernel(ts, dur, corr, stream=7):
    return [span("cudaLaunchKernel", ts, 5, "cuda_runtime", correlation=corr),
            span(f"k{corr}", ts, dur, "kernel", pid=0, tid=stream, device=0, stream=stream, correlation=corr)]


@pytest.fixture
def gpu_trace(tmp_path):
    """Two 10 ms steps; busy: 3 ms + 1 ms in the first, stream 7 and 8 overlapping (5.9 ms) in the second."""
    events = [span("ProfilerStep#1", 0, 10_000, "user_annotation"), span("ProfilerStep#2", 10_000, 10_000, "user_annotation"),
              span("forward", 50, 4_000, "user_annotation"), span("aten::conv2d", 60, 3_000, "cpu_op"),
              span("aten::mm", 9_000, 500, "cpu_op", tid=2)]
    events += kernel(100, 3_000, 1) + kernel(5_000, 1_000, 2) + kernel(10_100, 4_000, 3) + kernel(12_000, 4_000, 4, stream=8)
    return write_trace(tmp_path / "run", events)


def test_the_idle_share_is_the_time_no_stream_runs_anything(gpu_trace):
    t = timeline.summary(gpu_trace.parent)
    assert t["view"] == "gpu" and t["device"] == "NVIDIA H200" and len(t["steps"]) == 2
    assert t["idle_share"] == pytest.approx(1 - (3_000 + 1_000 + 5_900) / 20_000)
    names = [r["name"] for r in t["rows"]]
    assert names == ["CPU: training thread", "CPU: thread 2", "GPU 0: stream 7", "GPU 0: stream 8"]
    assert t["phases"] == [[0.05, 4.05, "compute"]]
    assert timeline.summary(gpu_trace, steps=1)["idle_share"] == pytest.approx(0.6)
    json.dumps(t)  # a reference record holds it


def test_a_cpu_trace_counts_the_training_thread_idle(tmp_path):
    events = [span("ProfilerStep#1", 0, 10_000, "user_annotation"), span("aten::conv2d", 0, 3_000, "cpu_op"),
              span("aten::mm", 5_000, 3_000, "cpu_op"), span("aten::add", 6_000, 500, "cpu_op")]
    t = timeline.summary(write_trace(tmp_path / "cpu", events))
    assert t["view"] == "host" and t["idle_share"] == pytest.approx(0.4)
    assert [r["kind"] for r in t["rows"]] == ["main"]
    assert "the training thread ran no operator for 40% of 1 steps" in timeline.idle_line("CPU", t)


def test_the_gpu_fixture_agrees_with_the_step_breakdown():
    """1 - idle share is the GPU's busy parts of trace_summary over the same two steps."""
    t = timeline.summary(FIXTURE)
    s = trace_summary.summarize(FIXTURE)[0]
    busy = sum(step.parts_ms[p] for step in s.steps for p in ("compute", "optimizer", "copy", "comm"))
    assert 0 < t["idle_share"] < 1
    assert 1 - t["idle_share"] == pytest.approx(busy / sum(step.step_ms for step in s.steps), abs=1e-3)


def test_the_plot_draws_one_panel_per_timeline_with_a_bar_row_per_row(gpu_trace):
    t = timeline.summary(gpu_trace)
    fig = timeline.plot([("a", t), ("b", timeline.summary(FIXTURE))])
    top = fig.axes[0]
    assert len(fig.axes) == 2 and [x.get_text() for x in top.get_yticklabels()][0] == "phases"
    assert len(top.collections) == 1 + len(t["rows"])  # the phase, then one bar row per row
    assert "the GPU ran nothing for 50% of 2 steps" in top.get_title()


def test_bad_input_is_one_line():
    with pytest.raises(UserError, match="steps=0"):
        timeline.summary(FIXTURE, steps=0)
    with pytest.raises(UserError, match="no timelines"):
        timeline.plot([])


STATS = """Processing [report.sqlite] with [nvtx_sum.py]...

 ** NVTX Range Summary (nvtx_sum):

 Time (%)  Total Time (ns)  Instances  Range
 --------  ---------------  ---------  --------
     40.0          4000000         15  backward
     30.0          3000000         15  forward
     20.0          2000000         15  optimizer
     10.0          1000000         15  data wait

Processing [report.sqlite] with [cuda_gpu_kern_sum.py]...

 ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):

 Time (%)  Total Time (ns)  Instances  Name
 --------  ---------------  ---------  ----
""" + "".join(f"      {9 - i}.0            {i}00000         30  kernel_{i}\n" for i in range(9))


def test_the_stats_excerpt_keeps_the_top_rows_of_each_report():
    text = timeline.stats_excerpt(STATS, rows=3)
    assert text.count("** ") == 2 and "data wait" not in text and "optimizer" in text
    assert "kernel_2" in text and "kernel_3" not in text and "Processing" not in text
    assert timeline.stats_excerpt("nothing") == "(no report in this nsys stats text)"


def fake_nsys(folder: Path, profile_rc: int = 0) -> None:
    """An `nsys` that writes an empty report and prints STATS, in shell builtins only (the tests empty PATH)."""
    folder.mkdir()
    (folder / "stats.txt").write_text(STATS)
    script = folder / "nsys"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --version) echo "NVIDIA Nsight Systems version 2099.1";;
  profile) for a in "$@"; do case "$a" in --output=*) : > "${{a#--output=}}.nsys-rep";; esac; done; exit {profile_rc};;
  stats) while IFS= read -r line; do printf '%s\\n' "$line"; done < "{folder / 'stats.txt'}";;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_nsys_stats_are_written_where_nsys_exists_and_the_record_says_so_where_not(tmp_path, monkeypatch):
    cfg = TrainConfig(nvtx=True, out_dir=str(tmp_path / "run"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert timeline.nsys_stats(cfg, tmp_path) is None and not (tmp_path / "02_nsys_stats.txt").exists()
    fake_nsys(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    assert timeline.nsys_stats(cfg, tmp_path) == "NVIDIA Nsight Systems version 2099.1"
    assert (tmp_path / "02_nsys_stats.txt").read_text() == STATS


def test_a_failed_nsys_run_is_named_in_the_record_and_writes_no_stats(tmp_path, monkeypatch):
    fake_nsys(tmp_path / "bin", profile_rc=1)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert timeline.nsys_stats(TrainConfig(out_dir=str(tmp_path / "run")), tmp_path).endswith(", failed")
    assert not (tmp_path / "02_nsys_stats.txt").exists()


def test_notebook_02_commits_its_timeline_picture():
    cells = json.loads((ROOT / "notebooks" / "02_profiling.ipynb").read_text())["cells"]
    drawn = [c for c in cells if c["cell_type"] == "code" and "tl.timeline.plot" in "".join(c["source"])]
    assert drawn, "notebook 02 draws no timeline (tl.timeline.plot)"
    assert any("image/png" in o.get("data", {}) for c in drawn for o in c.get("outputs", [])), \
        "notebook 02's timeline cell has no picture in its committed outputs: execute it in place"


def test_the_timeline_study_records_its_timelines_and_nsys_stats(tmp_path, monkeypatch, one_thread):
    """scripts/gpu/timeline.sh in its small mode, with the stand-in nsys: the record the notebook reads."""
    from tutorial_lib import reference
    from tutorial_lib.lessons import size, studies

    fake_nsys(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    written = studies.run("timeline", size.Size(True, "test"), tmp_path / "out")
    f = reference.load("02_timeline", tmp_path / "out")["figures"]
    t = f["timelines"]["fp32"]
    assert set(written) == {"02_timeline"} and list(f["timelines"]) == ["fp32"]
    assert t["view"] == "host" and len(t["steps"]) == 2 and 0 <= t["idle_share"] < 1
    assert t["rows"][0]["kind"] == "main" and t["phases"]
    assert f["nsys"] == "NVIDIA Nsight Systems version 2099.1"
    assert (tmp_path / "out" / "02_nsys_stats.txt").read_text() == STATS
