"""The one rule that says whether two figures differ (lessons/noise.py) and the bounds built on it (bench.bound),
on the figures that a learner met in notebooks 03, 04, 06 and on the card."""
import math

import pytest

from tutorial_lib.config import TrainConfig
from tutorial_lib.lessons import bench, noise
from tutorial_lib.lessons.bench import Measurement


def windows(measure, img_s, low, high, n=10):
    return Measurement(measure, img_s, low, high, n, 20, 0, [img_s])


def test_a_figure_is_the_mean_of_its_windows_with_the_interval_of_that_mean():
    f = noise.of_windows([100.0, 100.0, 100.0, 100.0])
    assert f.value == pytest.approx(100.0) and f.se == 0 and f.n == 4
    g = noise.of_windows([90.0, 110.0, 95.0, 105.0, 100.0, 100.0])
    assert g.low < g.value < g.high and g.spread == (90.0, 110.0)
    # the interval of the mean is far narrower than the spread of the windows, and shrinks with more of them
    assert g.high - g.low < 110.0 - 90.0
    assert noise.of_windows([90.0, 110.0] * 20).half < noise.of_windows([90.0, 110.0] * 3).half
    assert noise.t95(9) == pytest.approx(2.262) and noise.t95(1000) == pytest.approx(1.96, abs=0.01)


def test_2x_with_disjoint_step_ranges_is_faster():
    """04's reference table on one H200: reduce_overhead 52,537 img/s, x1.96 of compile, every reduce_overhead step
    up to its p90 (7.71 ms) below compile's p10 (8.04 ms), was printed 'within noise'."""
    ro = noise.of_steps(52_537, 3.717, 3.699, 7.708, 166, batch=256)
    co = noise.of_steps(26_751, 9.550, 8.042, 10.913, 166, batch=256)
    r = noise.compare(ro, co)
    assert r.verdict == "higher" and r.low > 1.5, r
    assert noise.versus(ro, co).startswith("x1.96 (") and noise.versus(ro, co).endswith(", faster")


def test_a_steady_six_percent_loss_per_rank_is_slower():
    """06, weak scaling at 1024 per GPU: every rank at 85,471-85,474 img/s against one GPU's 90,803 (the windows of
    each bench), a steady 5.9% loss, was printed 'within noise of 4 x one GPU'."""
    four = noise.of_range(341_883 / 4, 312_044 / 4, 356_634 / 4, 10)
    one = noise.of_range(90_803, 85_554, 93_425, 10)
    r = noise.compare(four, one)
    assert r.verdict == "lower" and r.high < 1, r
    assert noise.versus(four, one).endswith("slower")


def test_the_cross_process_floor_and_not_settled():
    a, b = noise.of_windows([103.0, 103.5, 102.5] * 4), noise.of_windows([100.0, 100.5, 99.5] * 4)
    assert noise.compare(a, b, separate=False).verdict == "higher"  # one process: the interval alone decides
    assert noise.compare(a, b, separate=True).verdict == "equal"  # two processes: 3% is under the floor
    wide_a, wide_b = noise.of_windows([60.0, 140.0, 80.0, 120.0]), noise.of_windows([70.0, 130.0, 90.0, 110.0])
    r = noise.compare(wide_a, wide_b)
    assert r.verdict == "not settled" and r.more and r.more > 0
    assert r.words().startswith(f"not settled: {r.more} more windows would decide")
    # a single figure has no interval of its own: the floor judges it
    assert noise.compare(noise.Figure.of(104.0), noise.Figure.of(100.0), separate=False).verdict == "equal"
    assert noise.compare(noise.Figure.of(110.0), noise.Figure.of(100.0)).verdict == "higher"
    assert str(noise.compare(noise.Figure.of(110.0), noise.Figure.of(100.0))) == "x1.10"


def test_shown_prints_the_interval_of_the_mean_in_one_notation():
    assert noise.shown(noise.Figure.of(52_537.0)) == "52,537"
    f = noise.Figure(1000.0, 0.01, 10)
    assert noise.shown(f) == f"1,000 ±{100 * (math.exp(2.262 * 0.01) - 1):.0f}%"
    assert noise.spread_shown(noise.of_windows([5_075.0, 7_489.0])) == "windows 5,075-7,489"
    wild = noise.of_windows([255.0, 1_710.0])  # two windows far apart: the interval is wider than the figure
    assert noise.shown(wild) == f"{wild.value:,.0f} (unsettled: 2 windows vary too much to bound it)"


H100_8_WORKERS = {"io": windows("io", 50_497, 13_338, 98_699), "synthetic": windows("synthetic", 34_772, 31_831, 36_504),
                  "full": windows("full", 20_689, 9_444, 30_335)}


@pytest.mark.parametrize("figures", [
    H100_8_WORKERS,
    {"io": windows("io", 31_856, 9_327, 56_279), "synthetic": windows("synthetic", 18_673, 17_389, 21_154),
     "full": windows("full", 12_179, 5_344, 15_500)},
    {"io": windows("io", 730_422, 299_233, 896_188), "synthetic": windows("synthetic", 32_179, 27_497, 37_596),
     "full": windows("full", 33_014, 28_252, 36_078)},
    {"io": windows("io", 9_300, 9_000, 9_600), "synthetic": windows("synthetic", 41_000, 40_000, 42_000),
     "full": windows("full", 9_100, 8_900, 9_300)},
])
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_no_verdict_orders_figures_the_rule_calls_equal(figures, device):
    """03 on one H200 printed 'FULL 15,273 (-56%/+37%) < SYNTHETIC 20,673' for bands that overlap. A verdict now
    prints ratios, never '<' or '>', and at most two lines of 80 columns."""
    kind, text = bench.verdict(figures, TrainConfig(num_workers=8), device)
    assert "<" not in text and ">" not in text and "≈" not in text, text
    lines = text.splitlines()
    assert len(lines) <= 2 and all(len(x) <= 80 for x in lines), text
    for name in ("FULL/SYNTHETIC", "IO/SYNTHETIC", "SYNTHETIC/IO", "FULL/IO"):
        if name in lines[0]:
            a, b = (figures[m.lower()] for m in name.split("/"))
            assert str(noise.compare(bench.figure(a), bench.figure(b))) in lines[0]


def test_a_cpu_row_is_never_launch_bound():
    """03 on the CPU called a row 'host/launch-bound' on a machine with no GPU kernels to launch."""
    steady = {"io": windows("io", 3_000, 2_900, 3_100), "synthetic": windows("synthetic", 1_000, 990, 1_010),
              "full": windows("full", 1_000, 990, 1_010)}
    for idle in (None, 0.0, 0.9):
        assert bench.bound(steady, "cpu", idle=idle) == "step"
    assert bench.bound(steady, "cuda") == "step"  # no trace: the bench can tell only that the step is the limit
    assert bench.bound(steady, "cuda", idle=0.75) == "launch" and bench.bound(steady, "cuda", idle=0.05) == "compute"
    assert "launch" not in bench.verdict(steady, TrainConfig(), "cpu")[1]


def test_full_above_io_is_flagged():
    """One H200, num_workers=1: IO 5,965, FULL 7,779; a loop can't outrun its input."""
    figures = {"io": windows("io", 5_965, 5_700, 6_200), "synthetic": windows("synthetic", 20_000, 19_500, 20_500),
               "full": windows("full", 7_779, 7_500, 8_000)}
    kind, text = bench.verdict(figures, TrainConfig(num_workers=1), "cuda")
    assert kind == "disagrees" and text.startswith("measurement disagrees: FULL/IO x1.30") and "rerun" in text, text
    above_syn = {**figures, "io": windows("io", 50_000, 49_000, 51_000), "full": windows("full", 24_000, 23_500, 24_500)}
    assert bench.bound(above_syn) == "disagrees"


def test_a_step_that_waited_most_of_its_time_for_data_is_not_compute_bound():
    """The card, on a segmentation model whose batch function builds every batch on the CPU: 'compute-bound'
    beside 'waited 15.1 ms/step for data (61% of the time)'."""
    figures = {"io": windows("io", 120.0, 100.0, 140.0), "synthetic": windows("synthetic", 40.0, 39.0, 41.0),
               "full": windows("full", 39.5, 38.5, 40.5)}
    assert bench.bound(figures, "cpu") == "step"
    kind, text = bench.verdict(figures, TrainConfig(), "cpu", waited=0.61)
    assert kind == "input" and "compute" not in text and text.startswith("input-bound: waited for data 61% of the time"), text
    assert all(len(x) <= 80 for x in text.splitlines())


def test_bursts_are_named_by_the_spread_and_judged_by_the_rule():
    assert bench.bound(H100_8_WORKERS) == "bursts" and bench.bound_label(H100_8_WORKERS) == "input-bound in bursts"
    steady_io = {**H100_8_WORKERS, "io": windows("io", 50_497, 45_000, 56_000)}
    assert bench.bound(steady_io) == "contended"  # IO keeps up in every window, FULL still below: not the loader


def test_dataparallels_two_step_times_are_judged_by_the_rule_not_by_overlapping_bands():
    """05 printed 'their bands overlap: the same step time within noise' for DataParallel's 4-GPU step at 256 and
    at 1024 per GPU (p10-p90 65.7-83.7 against 53.6-73.7 ms): the rule judges their means."""
    from tutorial_lib import reference
    from tutorial_lib.lessons import dpddp

    line = dpddp.step_comparison(dpddp.per_step_overhead(reference.load("05_dp_vs_ddp")["figures"]))
    assert line.startswith("on 4 GPUs, steps per second at 1024 against 256 per GPU: x1.18 (") and "bands" not in line
    assert "not settled" in line and "more steps would decide" in line


def test_the_card_page_judges_its_bound_with_the_wait_it_stored():
    """The card's bench row of a model whose batches are built on the CPU: 'compute-bound' beside 'waited 15.1
    ms/step for data (61% of the time)'. The page judges the stored windows with the stored wait."""
    import dataclasses

    from tutorial_lib.lessons import card_report

    figures = {"io": windows("io", 120.0, 100.0, 140.0), "synthetic": windows("synthetic", 40.0, 39.0, 41.0),
               "full": windows("full", 39.5, 38.5, 40.5)}
    card = card_report.Card.__new__(card_report.Card)
    card.bench = {"figures": {m: dataclasses.asdict(f) for m, f in figures.items()}, "waited": 0.61}
    card.probe = {"device_type": "cpu"}
    assert card.bound_line().startswith("input-bound: waited for data 61% of the time")
    card.bench["waited"] = 0.05
    assert card.bound_line().startswith("step-bound")
