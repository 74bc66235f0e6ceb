"""Scaling (notebooks 05 and 06): efficiency only against a baseline that holds the per-GPU configuration fixed
(DataParallel's too), a ratio against another recipe taken apart, a published claim read back, learning-rate
rules, the ledger of result.json files, periodic validation with an early stop, and DDP with gradient
synchronisation switched off (on CPU/gloo)."""
import csv
import json
import math

import pytest

from tutorial_lib import scaling
from tutorial_lib.config import ConfigError, TrainConfig, UserError
from tutorial_lib.results import Result, load_result

CARD = "NVIDIA H200"


def result(gpus=1, batch=1024, img_s=60_000.0, device=CARD, history=(), **cfg) -> dict:
    parallel = "ddp" if gpus > 1 else "none"
    config = TrainConfig(**{"batch_size": batch, "precision": "bf16", "channels_last": True, "parallel": parallel,
                            **cfg}).to_dict()
    return {"config": config, "device": device, "world_size": gpus, "steps": 100, "global_batch": batch * gpus,
            "throughput_img_s": img_s, "step_time_ms": {"median": img_s and 1000 * batch * gpus / img_s}, "loss": [],
            "final_loss": 1.0, "val_accuracy": None, "wall_time_s": 10.0, "val_history": [list(h) for h in history]}


def test_weak_efficiency_is_throughput_over_n_times_the_single_gpu_baseline():
    p = scaling.efficiency(result(4, img_s=232_800.0), result(1, img_s=60_000.0))
    assert (p.gpus, p.batch_per_gpu, p.global_batch) == (4, 1024, 4096)
    assert p.speedup == pytest.approx(3.88) and p.efficiency == pytest.approx(0.97)


def test_strong_efficiency_keeps_the_global_batch():
    base = result(1, batch=1024, img_s=60_000.0)
    p = scaling.efficiency(result(4, batch=256, img_s=120_000.0), base, "strong")
    assert p.batch_per_gpu == 256 and p.efficiency == pytest.approx(0.5)
    with pytest.raises(UserError, match="batch per GPU differs: the baseline has 1024, the run 256"):
        scaling.efficiency(result(4, batch=256, img_s=120_000.0), base, "weak")
    with pytest.raises(UserError, match="global batch differs"):
        scaling.efficiency(result(4, batch=1024), base, "strong")


@pytest.mark.parametrize("key, value", [
    ("precision", "fp32"), ("channels_last", False), ("compile", True), ("loader", "gpu_resident"),
    ("model", "resnet18_imagenet"), ("dataset", "shapes_hard"), ("num_workers", 8), ("optimizer", "sgd"),
    ("augment", False), ("train_size", 1000), ("compile_mode", "reduce-overhead"), ("pin_memory", False),
    ("cudnn_benchmark", False)])
def test_a_baseline_that_differs_per_gpu_is_refused_naming_the_field(key, value):
    assert key in scaling.HELD_FIXED
    with pytest.raises(UserError, match=f"^{key} differs: the baseline has {key}={value!r}"):
        scaling.efficiency(result(4), result(1, **{key: value}))


def test_the_seeds_mistake_another_batch_and_precision_is_refused():
    fast = result(4, batch=1024, img_s=340_000.0)
    wrong = result(1, batch=256, img_s=9_000.0, precision="fp32")
    naive = fast["throughput_img_s"] / (4 * wrong["throughput_img_s"])
    assert naive > 9  # what dividing by the wrong baseline reports: "945% efficiency"
    with pytest.raises(UserError, match="precision differs"):
        scaling.efficiency(fast, wrong)


def test_a_one_gpu_ddp_run_or_another_card_is_no_baseline():
    ddp1 = result(1)
    ddp1["config"]["parallel"] = "ddp"
    with pytest.raises(UserError, match="on 1 process; take a single-GPU run without DDP"):
        scaling.efficiency(result(2), ddp1)
    with pytest.raises(UserError, match="on 2 processes; take a single-GPU run without DDP"):
        scaling.efficiency(result(2), result(2))  # the messages count processes, no 'process(es)'
    with pytest.raises(UserError, match="device differs"):
        scaling.efficiency(result(2), result(1, device="NVIDIA H100"))


def test_best_baseline_is_the_fastest_valid_one_and_scaling_points_use_it():
    runs = [result(1, img_s=50_000.0), result(1, img_s=60_000.0), result(1, batch=256, img_s=90_000.0),
            result(2, img_s=118_000.0), result(4, img_s=230_000.0)]
    assert scaling.best_baseline(runs, runs[4])["throughput_img_s"] == 60_000.0
    points = scaling.scaling_points([r for r in runs if r["global_batch"] // r["world_size"] == 1024])
    assert [p.gpus for p in points] == [1, 1, 2, 4]
    assert points[-1].efficiency == pytest.approx(230 / 240)
    with pytest.raises(UserError, match="no valid single-GPU baseline.*precision differs"):
        scaling.best_baseline([result(1, precision="fp32")], runs[4])


def test_sweeps_fix_the_batch_per_gpu_or_the_global_batch():
    cfg = TrainConfig(batch_size=512)
    assert [(n, c.batch_size, c.parallel) for n, c in scaling.weak_sweep(cfg, (1, 2, 4))] == [
        (1, 512, "none"), (2, 512, "ddp"), (4, 512, "ddp")]
    assert [(n, c.batch_size) for n, c in scaling.strong_sweep(cfg, 1024, (1, 2, 4))] == [(1, 1024), (2, 512), (4, 256)]
    with pytest.raises(UserError, match="global_batch=1000 does not split over 3 GPUs"):
        scaling.strong_sweep(cfg, 1000, (1, 3))
    with pytest.raises(UserError, match="positive whole numbers"):
        scaling.weak_sweep(cfg, (0, 2))


@pytest.mark.parametrize("rule, factor", [("linear", 4.0), ("sqrt", 2.0), ("none", 1.0)])
def test_learning_rate_rules(rule, factor):
    assert scaling.scaled_lr(0.1, 256, 1024, rule) == pytest.approx(0.1 * factor)
    cfg = scaling.lr_recipe(TrainConfig(batch_size=256, lr=0.1), 4, 256, rule, warmup_images=10_000)
    assert cfg.lr == pytest.approx(0.1 * factor) and cfg.parallel == "ddp"
    assert cfg.warmup_steps == math.ceil(10_000 / 1024)  # the same number of images at any batch


def test_bad_learning_rate_rule_is_refused():
    with pytest.raises(UserError, match="rule='cubic' is not one of none, linear, sqrt"):
        scaling.scaled_lr(0.1, 256, 1024, "cubic")
    with pytest.raises(UserError, match="must be positive"):
        scaling.scaled_lr(0.1, 0, 1024, "linear")


def test_time_to_target_is_the_first_validation_at_or_above_it():
    r = result(history=[(10, 1.0, 0.5), (20, 2.0, 0.85), (30, 3.0, 0.8), (40, 4.0, 0.9)])
    assert scaling.time_to_target(r, 0.85) == 2.0
    assert scaling.time_to_target(r, 0.95) is None


def test_ledger_collects_every_result_json_into_a_table_and_csv(tmp_path):
    for name, gpus, img_s in (("weak/1gpu", 1, 60_000.0), ("weak/4gpu", 4, 230_000.0), ("race", 4, None)):
        r = result(gpus, img_s=img_s)
        Result(**{**{k: r.get(k) for k in Result.__dataclass_fields__}, "data_wait_ms": 0.0, "peak_memory_mb": None,
                  "param_checksums": [], "resumed_from_step": None, "torch_version": "2.11"}).save(
            (tmp_path / name).mkdir(parents=True) or tmp_path / name)
    rows = scaling.ledger(tmp_path)
    assert [r["run"] for r in rows] == ["race", "weak/1gpu", "weak/4gpu"]  # race: the target before a timed step
    rows = rows[1:]
    assert scaling.efficiency(rows[1], rows[0]).efficiency == pytest.approx(230 / 240)
    table = scaling.markdown_table(scaling.ledger(tmp_path))
    assert "| weak/4gpu | NVIDIA H200 | 4 | 1024 | 4096 | bf16 |" in table and "| race | NVIDIA H200 | 4 |" in table
    lines = list(csv.DictReader(scaling.write_csv(rows, tmp_path / "ledger.csv").open()))
    assert [(l["gpus"], l["throughput_img_s"]) for l in lines] == [("1", "60000.0"), ("4", "230000.0")]
    with pytest.raises(UserError, match="is not a folder"):
        scaling.ledger(tmp_path / "nope")


def test_old_result_files_load_without_val_history(tmp_path):
    r = result()
    r.pop("val_history")
    full = {**{k: r.get(k) for k in Result.__dataclass_fields__ if k != "val_history"}, "data_wait_ms": 0.0,
            "peak_memory_mb": None, "param_checksums": [], "resumed_from_step": None, "torch_version": "2.11"}
    (tmp_path / "result.json").write_text(json.dumps(full))
    assert load_result(tmp_path).val_history == []


def test_eval_every_records_accuracy_over_time_and_target_accuracy_stops_early(tiny_cfg, monkeypatch):
    import tutorial_lib as tl
    from conftest import feed_accuracies

    with monkeypatch.context() as fed:  # the accuracy the first pass finds, whatever this CPU's tiny run learned
        feed_accuracies(fed, [0.5])
        r = tl.train(tiny_cfg(steps=8, eval_every=2, target_accuracy=0.5))
    assert r.steps == 2 and len(r.val_history) == 1  # the target reached: stopped at the first validation
    step, seconds, accuracy = r.val_history[0]
    assert step == 2 and seconds > 0 and accuracy == r.val_accuracy == 0.5
    r = tl.train(tiny_cfg(steps=6, eval_every=2))
    assert [h[0] for h in r.val_history] == [2, 4, 6] and r.steps == 6
    assert [h[1] for h in r.val_history] == sorted(h[1] for h in r.val_history)
    with pytest.raises(ConfigError, match="target_accuracy=0.9 needs .* eval_every > 0"):
        tiny_cfg(target_accuracy=0.9)


def test_shapes_hard_is_deterministic_and_differs_from_shapes():
    from tutorial_lib import shapes

    a, ya = shapes.make_shapes(100, seed=1, hard=True)
    b, yb = shapes.make_shapes(100, seed=1, hard=True)
    c, _ = shapes.make_shapes(100, seed=1)
    assert (a == b).all() and (ya == yb).all() and not (a == c).all()
    assert a.shape == (100, 32, 32, 3) and set(ya) <= set(range(10))


def test_shapes_faint_draws_contrast_from_a_continuum_and_loads_by_name():
    """The race's set: shapes_hard's layout with each image's contrast log-uniform from almost nothing to plain,
    so some images are below the noise (a ceiling under 100%) and the rest spread over every difficulty."""
    import numpy as np

    from tutorial_lib import data, shapes

    a, ya = shapes.make_shapes(64, seed=1, faint=True)
    b, yb = shapes.make_shapes(64, seed=1, faint=True)
    h, _ = shapes.make_shapes(64, seed=1, hard=True)
    assert (a == b).all() and (ya == yb).all() and not (a == h).all() and a.shape == (64, 32, 32, 3)

    def spread(x):  # each image's pixel spread, where its background is clear of 0 and 255 (no clipping)
        x = x.astype(float)
        bg = np.median(x.reshape(len(x), -1, 3), axis=1)
        return x.reshape(len(x), -1).std(1)[((bg > 60) & (bg < 195)).all(1)]

    # the faintest images of shapes_faint are the noise alone (36 per pixel); shapes_hard's all stand out of it
    faint, hard = (np.percentile(spread(shapes.make_shapes(1024, 2, **k)[0]), 5) for k in ({"faint": True},
                                                                                             {"hard": True}))
    assert faint < 38.5 < hard
    assert shapes.FAINT_CONTRAST[0] < 36 / 4 and shapes.FAINT_CONTRAST[1] > 2 * 36  # a quarter of the noise to twice it
    cfg = TrainConfig(dataset="shapes_faint", train_size=32, val_size=16)
    images, labels = data.base_dataset(cfg, "val")[0]
    assert images.shape == (3, 32, 32) and data.num_classes("shapes_faint") == 10


def test_grad_sync_false_lets_the_ranks_drift_apart(tmp_path, two_rank_run):
    from test_ddp import torchrun

    synced = two_rank_run  # the same run with the all-reduce
    apart = torchrun(2, tmp_path / "apart", "grad_sync=false")
    assert synced["param_checksums"][0] == synced["param_checksums"][1]
    assert apart["param_checksums"][0] != apart["param_checksums"][1]  # each rank followed its own gradients
    assert apart["config"]["grad_sync"] is False and apart["world_size"] == 2


def test_dataparallel_efficiency_needs_the_gpus_its_one_process_split_the_batch_over():
    dp = result(1, batch=1024, img_s=12_000.0, parallel="dp")  # one process, 256 per GPU on 4 GPUs
    one = result(1, batch=256, img_s=20_000.0)
    with pytest.raises(UserError, match="does not record how many GPUs.*pass gpus=N"):
        scaling.efficiency(dp, one)
    p = scaling.efficiency(dp, one, gpus=4)
    assert (p.gpus, p.batch_per_gpu) == (4, 256) and p.speedup == pytest.approx(0.6) and p.efficiency == pytest.approx(0.15)
    with pytest.raises(UserError, match="gpus=2 but the run ran 4 processes;"):
        scaling.efficiency(result(4), result(1), gpus=2)


def test_a_ratio_against_another_recipe_is_gpus_times_weak_efficiency_times_recipe_gain():
    """The workbook's own "793%" (4x H200): 266,983 img/s on 4 GPUs at 1024 per GPU against notebook 01's
    8,414 img/s (fp32, batch 256) = 4 GPUs x 0.975 x 8.14."""
    run, one = result(4, img_s=266_983.0), result(1, img_s=68_472.0)
    baseline = result(1, batch=256, img_s=8_414.0, precision="fp32", channels_last=False)
    d = scaling.decompose(run, one, baseline)
    assert d.gpus == 4 and d.weak_efficiency == pytest.approx(0.975, abs=5e-4)
    assert d.recipe_gain == pytest.approx(8.14, abs=5e-3) and d.ratio == pytest.approx(31.73, abs=5e-3)
    assert d.ratio == pytest.approx(d.gpus * d.weak_efficiency * d.recipe_gain)
    assert d.claimed_efficiency == pytest.approx(7.93, abs=5e-3)
    with pytest.raises(UserError, match="precision differs"):
        scaling.decompose(run, baseline, baseline)  # the middle term must be the run's own recipe on one GPU


def test_a_published_claim_is_read_back_from_its_own_figures():
    """The NRIS Olivia guide: 36,926.594 img/s on 4 GPUs, "a speedup factor of almost 15.21 and a scaling
    efficiency of almost 374.1%"."""
    c = scaling.check_claim(36_926.594, 4, 15.21, 3.741)
    assert round(c["one_gpu_from_speedup"]) == 2428 and round(c["one_gpu_from_efficiency"]) == 2468
    assert c["efficiency_from_speedup"] == pytest.approx(3.8025) and c["speedup_from_efficiency"] == pytest.approx(14.964)
    assert c["disagreement"] == pytest.approx(0.0165, abs=5e-4)


def test_images_to_target_counts_the_global_batch_of_every_step():
    r = result(4, batch=256, history=[(10, 1.0, 0.5), (20, 2.0, 0.9)])
    assert scaling.images_to_target(r, 0.9) == 20 * 1024 and scaling.images_to_target(r, 0.95) is None


def test_the_scaling_jobs_trace_their_largest_point_instead_of_switching_sync_off(tmp_path):
    from tutorial_lib import jobs

    paths = scaling.write_jobs(TrainConfig(batch_size=1024, steps=300), gpus=(1, 4), nodes=1, jobs_dir=tmp_path,
                               show=False)
    sweep = jobs.render_record(paths[-1])["sweep"]
    assert [p["batch_size"] for p in sweep] == ["1024", "256", "1024"]
    assert sweep[2]["profile"] == "true" and sweep[2]["profile_ranks"] == "all"
    assert all("grad_sync" not in p for p in sweep)


def test_shapes_drawn_by_several_processes_are_the_same_images(monkeypatch):
    """A large set (the race's) is drawn in chunks by a pool of processes; the images and labels are those one
    process draws, and the pool leaves no process behind (the conftest checks)."""
    from tutorial_lib import shapes

    one = shapes.make_shapes(3000, seed=4, chunk=512, faint=True, workers=1)
    two = shapes.make_shapes(3000, seed=4, chunk=512, faint=True, workers=2)
    assert all((a == b).all() for a, b in zip(one, two)) and one[0].shape == (3000, 32, 32, 3)
    monkeypatch.setattr(shapes, "PARALLEL_FROM", 1000)  # the default: parallel from that size, same images
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert (shapes.make_shapes(3000, seed=4, chunk=512, faint=True)[0] == one[0]).all()
    assert shapes._cpu_share() >= 1
