"""Notebook 03's cells show the lesson; their record-keeping lives in tutorial_lib.lessons.data_loading: the
figures a step records for the GPU reference, the sweep's lines, the first batch of each epoch, the pictures."""
import matplotlib

matplotlib.use("Agg")

from types import SimpleNamespace  # noqa: E402

from tutorial_lib.lessons import data_loading  # noqa: E402
from tutorial_lib.lessons.bench import Measurement  # noqa: E402


def m(name, rate, spread=0.02, windows=10):
    rates = [rate * (1 + spread * ((i % 3) - 1)) for i in range(windows)]
    return Measurement(name, rate, min(rates), max(rates), windows, 20, 0, [rate], rates)


def result(io, syn, full, wait=1.0):
    figures = {k: m(k, v) for k, v in (("io", io), ("synthetic", syn), ("full", full)) if v}
    return SimpleNamespace(figures=figures, bound="step", full_data_wait_ms=wait,
                           img_s=lambda k, f=figures: f[k].img_s)


def test_ladder_figures_name_each_measure_for_the_reference_file():
    got = data_loading.ladder_figures("pinned", "+ pin_memory", result(20_000, 10_000, 9_900, wait=0.5))
    assert got["pinned_label"] == "+ pin_memory" and got["pinned_bound"] == "step" and got["pinned_wait_ms"] == 0.5
    assert got["pinned_io"] == 20_000 and got["pinned_full_low"] < 9_900 < got["pinned_full_high"]


def test_sweep_lines_judge_each_row_and_say_when_full_stopped_rising():
    base = result(None, 10_000, None)
    sweep = {0: result(3_000, None, 3_000), 4: result(12_000, None, 9_900), 8: result(24_000, None, 9_950)}
    lines = data_loading.sweep_lines(sweep, base)
    assert len(lines) == 4 and lines[0].startswith("num_workers=0:") and "bound:" in lines[0]
    assert lines[-1].startswith("From 4 to 8 workers:") and "FULL stopped rising while IO still grew" in lines[-1]
    grew = {0: result(3_000, None, 3_000), 4: result(6_000, None, 6_000)}
    assert "stopped rising" not in data_loading.sweep_lines(grew, base)[-1]


def test_first_batch_lines_credit_persistent_workers_only_beyond_the_epochs_spread():
    kept = data_loading.first_batch_lines({False: [38, 34, 35, 35, 33], True: [34, 5, 4, 4, 4]}, "1 worker")
    assert kept[-1].endswith("only epoch 0 paid the start-up of 1 worker.")
    same = data_loading.first_batch_lines({False: [38, 34, 35, 35, 33], True: [34, 34, 33, 36, 35]}, "1 worker")
    assert "no difference beyond the epochs' spread" in same[-1]


def test_the_pictures_render_on_a_cpu():
    base = result(None, 10_000, None)
    sweep = {0: result(3_000, None, 3_000), 2: result(8_000, None, 7_000)}
    assert data_loading.plot_sweep(sweep, base, "t").axes[0].get_yscale() == "log"
    rows = [("0 workers", result(3_000, 10_000, 3_000).figures), ("gpu_resident", result(90_000, 10_000, 9_800).figures)]
    fig = data_loading.plot_ladder(rows, "t")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_yticklabels()] == ["0 workers", "gpu_resident"]
    assert len(ax.lines) == 2 * 3 * 2  # a range and a mean dot for IO, SYNTHETIC, FULL of each row
