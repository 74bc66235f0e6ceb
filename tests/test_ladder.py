"""Notebook 04's library: the optimizer implementation key, compile time, FLOPs and MFU, fp16 skipped steps,
the ladder and its outputs, configs/optimized.yaml."""
import json
import time

import pytest
import torch
from torch import nn

from conftest import ROOT, tiny
from tutorial_lib import (config, distributed, engine, evidence, ladder, meters, models, peaks, perfdoc, precision, reference,
                          roofline, stepgraph)
from tutorial_lib.__main__ import main
from tutorial_lib.config import ConfigError, TrainConfig
from tutorial_lib.lessons import size, studies

# The study's small mode at still smaller sizes (the same code: every rung, traces, bench; 3 steps each)
TINY = ladder.Sizes(batch=8, big_batch=16, steps=3, big_steps=2, warmup=1, model="resnet18_imagenet", train_size=64,
                    budget_s=600, bench_steps=4, bench_window=2)


# ------------------------------------------------------------------------------------------- optimizer_impl
@pytest.mark.parametrize("impl, flag, value", [("fused", "fused", True), ("foreach", "foreach", True),
                                               ("for-loop", "foreach", False), ("auto", "fused", None)])
def test_optimizer_impl_picks_torch_optims_implementation(tmp_path, impl, flag, value):
    run = engine.Run(tiny(tmp_path, optimizer_impl=impl), distributed.setup("none", "cpu"))
    assert run.opt.defaults[flag] is value


def test_bad_optimizer_impl_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="optimizer_impl='fast' is not one of auto, fused, foreach, for-loop"):
        TrainConfig(optimizer_impl="fast")


def test_optimizer_impl_torch_refuses_becomes_a_config_error(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")

    monkeypatch.setattr(torch.optim, "AdamW", refuse)
    with pytest.raises(ConfigError, match="optimizer_impl='fused' does not work .* use optimizer_impl=auto"):
        engine.Run(tiny(tmp_path, optimizer_impl="fused"), distributed.setup("none", "cpu"))


# ------------------------------------------------------------------------------------------- compile time
class SlowFirstCall(nn.Module):
    """Stands in for torch.compile: the first forward takes `delay` seconds longer (the compilation)."""

    def __init__(self, inner, delay):
        super().__init__()
        self.inner, self.delay, self.calls = inner, delay, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.delay)
        return self.inner(x)


def test_compile_time_is_reported_and_left_out_of_the_step_times(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: SlowFirstCall(model, 1.0))
    res = engine.train(tiny(tmp_path, compile=True, timing_warmup=0, steps=6, eval=False))
    assert res.compile_time_s >= 1.0
    assert res.step_time_ms["timed_steps"] == 6 - engine.COMPILE_WARMUP  # warm-up raised to the compile's
    # the slow first call ran in step 1, which is not among the timed steps 4-6 (a load-proof check: the count)
    plain = engine.train(tiny(tmp_path / "plain", eval=False))
    assert plain.compile_time_s is None


def test_step_clock_times_the_first_step_without_its_data_wait():
    clock = meters.StepClock(torch.device("cpu"), warmup=1, time_first=True)
    clock.start()
    time.sleep(0.2)
    clock.data_wait(0.2)
    time.sleep(0.3)
    clock.tick()
    clock.tick()
    assert 0.28 < clock.first_step_s < 0.45
    assert len(clock.step_times_ms()) == 1 and clock.step_times_ms()[0] < 100


# ------------------------------------------------------------------------------------------- FLOPs and MFU
def test_flops_of_a_linear_layer_equal_the_hand_count():
    n, d_in, d_out = 4, 10, 5
    flops = models.train_flops(nn.Linear(d_in, d_out), torch.randn(n, d_in), torch.zeros(n, dtype=torch.long))
    # forward x @ W^T: 2*n*d_in*d_out; backward: the weight gradient, the same again (x needs no gradient)
    hand = 2 * n * d_in * d_out + 2 * n * d_in * d_out
    assert abs(flops - hand) <= 0.01 * hand


def test_resnet18_flops_per_image_are_counted_on_the_meta_device():
    f = models.flops_per_image("resnet18", 10, (3, 32, 32))
    assert 3.2e9 < f < 3.5e9  # CIFAR-stem ResNet-18: about 3.3 GFLOP forward + backward per image
    assert models.flops_per_image("resnet18_imagenet", 10, (3, 32, 32)) < f / 10  # the ImageNet stem shrinks first


def test_run_result_carries_flops_and_no_mfu_on_a_cpu(tmp_path):
    res = engine.train(tiny(tmp_path, eval=False))
    assert res.flops_per_image == models.flops_per_image("resnet18_imagenet", 10, (3, 32, 32)) > 0
    assert res.mfu is None and res.fp16_skipped_steps is None
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["flops_per_image"] == res.flops_per_image and "mfu" in saved


@pytest.mark.parametrize("card, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.5), ("NVIDIA H100 PCIe", "bf16", 756.5), ("NVIDIA H100 PCIe", "fp32", 51.0),
    ("NVIDIA H200", "tf32", 494.5), ("NVIDIA A100-SXM4-80GB", "fp16", 312.0), ("NVIDIA A100 80GB PCIe", "fp32", 19.5),
    ("NVIDIA GeForce RTX 3090", "bf16", None), ("CPU (Intel Xeon, 2 threads)", "fp32", None)])
def test_peak_tflops_per_card_and_precision(card, precision, tflops):
    assert peaks.peak_tflops(card, precision) == tflops


def test_mfu_is_achieved_over_peak_flops_of_all_devices():
    assert peaks.mfu(100_000, 3.3e9, "NVIDIA H200", "bf16") == pytest.approx(100_000 * 3.3e9 / 989.5e12)
    assert peaks.mfu(400_000, 3.3e9, "NVIDIA H200", "bf16", devices=4) == pytest.approx(100_000 * 3.3e9 / 989.5e12)
    assert peaks.mfu(100_000, 3.3e9, "CPU (x)", "bf16") is None


# ------------------------------------------------------------------------------------------- fp16 skipped steps
class FakeScaler:
    """A GradScaler's contract: `_scale` halves after a step with inf/NaN gradients, else stays (or grows)."""

    def __init__(self, overflows):
        self._scale, self.overflows = torch.tensor(1024.0), iter(overflows)

    def is_enabled(self):
        return True

    def update(self):
        self._scale = self._scale * (0.5 if next(self.overflows) else 2.0)


def test_skipped_steps_count_the_steps_after_which_the_scale_fell():
    scaler, skipped = FakeScaler([False, True, False, True, True, False]), engine.SkippedSteps()
    for _ in range(6):
        before = skipped.scale_before(scaler)
        scaler.update()
        skipped.after_update(scaler, before)
    assert skipped.total() == 3


def test_skipped_steps_with_a_real_grad_scaler_on_overflow():
    p = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler, skipped = torch.amp.GradScaler("cpu", init_scale=1024.0), engine.SkippedSteps()
    for overflow in (False, True, False):
        opt.zero_grad()
        scaler.scale((p * 2).sum()).backward()
        if overflow:
            p.grad[0] = float("inf")
        before = skipped.scale_before(scaler)
        scaler.step(opt)
        scaler.update()
        skipped.after_update(scaler, before)
    assert skipped.total() == 1
    assert skipped.scale_before(torch.amp.GradScaler("cpu", enabled=False)) is None  # fp32/bf16: nothing counted


# ------------------------------------------------------------------------------------------- the ladder
def test_ladder_configs_add_one_change_per_rung():
    plan = {rung.name: cfg for rung, cfg, _ in ladder.configs(ladder.GPU)}
    last = plan["gpu_resident"]
    assert (last.precision, last.channels_last, last.optimizer_impl, last.compile, last.compile_mode, last.cuda_graph,
            last.batch_size, last.loader) == ("bf16", True, "fused", True, "default", True, 1024, "gpu_resident")
    assert plan["reduce_overhead"].compile_mode == "reduce-overhead" and not plan["reduce_overhead"].cuda_graph
    assert plan["fp32"].precision == "fp32" and not plan["fp32"].channels_last
    assert plan["fp16"].precision == "fp16" and not plan["fp16"].channels_last  # beside the bf16 rung
    assert plan["last_small_batch"].replace(batch_size=1024, steps=last.steps, out_dir=last.out_dir) == last
    on_cpu = {rung.name: (cfg, why) for rung, cfg, why in ladder.configs(ladder.GPU, device="cpu")}
    assert on_cpu["compile"][1] and on_cpu["tf32"][1] and on_cpu["fp16"][1] and on_cpu["reduce_overhead"][1]
    assert on_cpu["step_graph"][1] == "CUDA graphs need a GPU"
    assert on_cpu["gpu_resident"][1] is None and not on_cpu["gpu_resident"][0].compile


def _cpu_bf16(monkeypatch, slowdown: float) -> None:
    """This CPU, as far as the workbook can tell: bf16 steps `slowdown` times as long as fp32 ones."""
    monkeypatch.setattr(precision, "cpu_bf16_slowdown", lambda: slowdown)


def test_a_cpu_that_emulates_bf16_skips_the_bf16_rung_and_stacks_the_rest_on_fp32(monkeypatch):
    """On an AVX2-only CPU (no bf16 instructions) a ResNet-18 bf16 step took x25 an fp32 one, and every rung above
    bf16 inherited it: notebook 04's CPU cells ran 2-4 minutes each. There the rung is skipped, saying why."""
    _cpu_bf16(monkeypatch, 12.4)
    on_cpu = {rung.name: (cfg, why) for rung, cfg, why in ladder.configs(ladder.SMALL, device="cpu")}
    assert on_cpu["bf16"][1] == ("this CPU has no bf16 instructions: a bf16 step took x12 an fp32 one here, so the "
                                 "CPU runs use fp32; the reference shows bf16")
    assert on_cpu["channels_last"][1] is None and on_cpu["channels_last"][0].precision == "fp32"
    assert on_cpu["gpu_resident"][0].precision == "fp32" and on_cpu["gpu_resident"][0].channels_last
    assert {r.name: why for r, _, why in ladder.configs(ladder.GPU)}["bf16"] is None  # a GPU: never probed
    assert ladder.optimized_config(ladder.SMALL, {"device": "cpu"}).precision == "fp32"
    assert ladder.optimized_config(ladder.GPU).precision == "bf16"
    assert evidence.race_precisions(("fp32", "bf16"), "cpu") == (("fp32",), precision.cpu_bf16_note())
    assert evidence.race_precisions(("fp32", "bf16", "fp16"), "cuda") == (("fp32", "bf16", "fp16"), None)
    _, points = ladder.job_sweep(TINY, device="cpu")  # a job's nodes are not this CPU: the bf16 point stays
    assert any(p.get("precision") == "bf16" for p in points)


def test_a_cpu_with_bf16_instructions_runs_the_bf16_rung_and_stacks_on_it(monkeypatch):
    _cpu_bf16(monkeypatch, 1.2)
    on_cpu = {rung.name: (cfg, why) for rung, cfg, why in ladder.configs(ladder.SMALL, device="cpu")}
    assert on_cpu["bf16"][1] is None and on_cpu["channels_last"][0].precision == "bf16"
    assert ladder.optimized_config(ladder.SMALL, {"device": "cpu"}).precision == "bf16"
    assert evidence.race_precisions(("fp32", "bf16"), "cpu") == (("fp32", "bf16"), None)
    assert precision.cpu_bf16_native()
    _cpu_bf16(monkeypatch, 3.0)  # the threshold itself: emulated
    assert not precision.cpu_bf16_native()


def test_the_precision_race_leaves_emulated_bf16_out_and_says_so(monkeypatch, capsys, tmp_path):
    _cpu_bf16(monkeypatch, 12.0)
    monkeypatch.setattr(engine, "train", lambda cfg: (cfg.precision, cfg.seed))
    runs = evidence.precision_runs(TrainConfig(device="cpu"), ("fp32", "bf16"), (0, 1), out_dir=str(tmp_path))
    assert runs == {"fp32": [("fp32", 0), ("fp32", 1)]}
    assert capsys.readouterr().out == precision.cpu_bf16_note() + "\n"


def test_the_bf16_probe_measures_this_cpu_once_in_a_fraction_of_a_second():
    precision.cpu_bf16_slowdown.cache_clear()
    start = time.perf_counter()
    slowdown = precision.cpu_bf16_slowdown()
    assert 0.05 < slowdown < 500 and time.perf_counter() - start < 10
    assert precision.cpu_bf16_slowdown() is slowdown and precision.cpu_bf16_native() == (slowdown < 3.0)


def test_every_traced_rung_times_a_step_after_its_compile_and_recording():
    """The eager rung's trace once failed: its DataLoader's prefetched batches made timing_warmup 26 > 12 steps."""
    plan = {rung.name: cfg for rung, cfg, _ in ladder.configs(ladder.GPU)}
    for name in ladder.TRACED:
        cfg = ladder.trace_config(plan[name])
        warmup = meters.untimed_steps(cfg, cfg.timing_warmup)
        assert warmup >= stepgraph.WARMUP_STEPS + 1 or not cfg.cuda_graph
        assert cfg.steps > warmup and cfg.steps >= cfg.profile_wait + cfg.profile_warmup + cfg.profile_active, name
        engine.check_timed(cfg, cfg.steps, 100)


def test_optimized_yaml_is_the_ladders_last_rung():
    opt = config.load(ROOT / "configs" / "optimized.yaml")
    last = {rung.name: cfg for rung, cfg, _ in ladder.configs(ladder.GPU)}["gpu_resident"]
    for key in ("model", "dataset", "precision", "channels_last", "optimizer_impl", "compile", "compile_mode",
                "cuda_graph", "batch_size", "loader", "optimizer", "lr"):
        assert getattr(opt, key) == getattr(last, key), key


def test_the_ladder_study_measures_every_rung_a_cpu_can_run_and_records_it(tmp_path, monkeypatch, one_thread):
    """`python -m tutorial_lib study ladder --small`: the rows, the traces, the bench at configs/optimized.yaml,
    ladder.json/.md and the reference records (what scripts/gpu/ladder.sh writes on a GPU). On a CPU that emulates
    bf16, as on most laptops (the rungs' stacking on bf16 itself: the two tests above)."""
    monkeypatch.setattr(ladder, "SMALL", TINY)
    _cpu_bf16(monkeypatch, 12.0)
    written = studies.run("ladder", size.Size(True, "test"), tmp_path)
    rows = json.loads((tmp_path / "ladder.json").read_text())["rows"]
    measured = {r["rung"] for r in rows if not r["skipped"]}
    assert measured == {"fp32", "channels_last", "fused_adamw", "big_batch", "gpu_resident", "last_small_batch",
                        "bare_loop"}
    skipped = {r["rung"]: r["skipped"] for r in rows if r["skipped"]}
    assert set(skipped) == {"tf32", "bf16", "compile", "reduce_overhead", "step_graph", "fp16"}
    assert "torch.compile" in skipped["compile"] and "CUDA" in skipped["fp16"] and "x12" in skipped["bf16"]
    for r in rows:
        if not r["skipped"]:
            assert r["img_s"] > 0 and r["step_ms_p10"] <= r["step_ms"] <= r["step_ms_p90"] and r["speedup"] > 0
    assert next(r for r in rows if r["rung"] == "fp32")["speedup"] == 1.0
    table = (tmp_path / "ladder.md").read_text()
    assert len(table.splitlines()) == 2 + len(rows) and all(f"| {r['rung']} |" in table for r in rows)
    gathered = ladder.gather(tmp_path / "runs", TINY)  # the engine's result.json files, as a job's would be
    assert {r["rung"] for r in gathered} == measured - {"bare_loop"}
    slug = ladder.card_slug(rows[0]["device"])
    assert set(written) == {"04_ladder", f"04_ladder_{slug}"}
    record = reference.load(f"04_ladder_{slug}", tmp_path)
    assert record["card"] == "CPU (small mode)" and record["script"] == "python -m tutorial_lib study ladder"
    f = record["figures"]
    assert f["fp32_img_s"] == rows[0]["img_s"] and f["last_speedup"] > 0 and f["engine_over_bare_loop"] > 0
    assert [r["rung"] for r in f["rows"]] == [r["rung"] for r in rows]
    assert "loss" in f["rows"][0] and "loss" not in next(r for r in f["rows"] if r["rung"] == "channels_last")
    trace = f["traces"]["gpu_resident"]  # on the host's clock on a CPU; the parts' shares of the step add up to 1
    assert set(f["traces"]) == set(ladder.TRACED) and trace["view"] == "host" and trace["batch"] == TINY.big_batch
    assert sum(trace["shares"].values()) == pytest.approx(1) and trace["bottleneck"] in trace["shares"]
    for loader in ("dataloader", "gpu_resident"):
        b = f["bench_optimized"][loader]
        assert min(b["io"], b["synthetic"], b["full"]) > 0 and b["verdict"], b
        assert b["full_over_synthetic"] == pytest.approx(b["full"] / b["synthetic"])
    doc = perfdoc.performance_doc([record])  # docs/performance.md renders from such a record
    assert "## CPU (small mode) (torch" in doc and "| fp32 | fp32, TF32 off" in doc
    assert "| gpu_resident |" in doc.split("Notebook 03's bench")[1] and "### What limits the last rung" in doc


def test_ladder_cli_measures_the_rungs_asked_for_and_names_the_fix_for_bad_flags(tmp_path, monkeypatch, capsys,
                                                                                  one_thread):
    monkeypatch.setattr(ladder, "SMALL", TINY)
    assert main(["ladder", "--small", "--only", "fp32", "--out", str(tmp_path), f"out_dir={tmp_path}/runs"]) == 0
    assert [r["rung"] for r in json.loads((tmp_path / "ladder.json").read_text())["rows"]] == ["fp32"]
    out = capsys.readouterr().out
    assert "| fp32 |" in out and "wrote" in out
    assert main(["ladder", "--small", "--only", "fp64", "--out", str(tmp_path)]) == 2
    assert "no rung named 'fp64'" in capsys.readouterr().err
    assert main(["ladder", "--reference"]) == 2
    assert "study ladder --reference" in capsys.readouterr().err


def test_performance_doc_is_current_with_the_reference_files():
    assert perfdoc.render() == (ROOT / "docs" / "performance.md").read_text(), (
        "docs/performance.md is stale: python -m tutorial_lib ladder --doc")


def test_job_sweep_has_one_point_per_training_rung():
    base, points = ladder.job_sweep(ladder.GPU)
    assert [p["out_dir"].rsplit("/", 1)[1] for p in points] == [
        r.name for r in ladder.rungs(ladder.GPU) if not r.bare]
    assert base.num_workers == TrainConfig().num_workers  # the job sets one worker per CPU it gets
    _, cpu_points = ladder.job_sweep(TINY, device="cpu")
    assert not any(p.get("compile") or p.get("precision") in ("tf32", "fp16") for p in cpu_points)


def test_performance_doc_names_card_torch_date_and_what_limits_the_last_rung():
    rows = [{"rung": "fp32", "change": "fp32", "batch": 256, "steps": 10, "skipped": None, "img_s": 9000.0,
             "step_ms": 28.4, "step_ms_p10": 28.0, "step_ms_p90": 29.0, "peak_mb": 5000.0, "mfu": 0.44,
             "compile_s": None, "final_loss": 2.1, "speedup": 1.0}]
    trace = {"gpu_resident": {"device": "H200", "view": "gpu", "step_ms": 11.5, "bottleneck": "compute",
                              "shares": {"compute": 0.9, "optimizer": 0.06, "idle": 0.04},
                              "top_kernels": [{"name": "sm90_xmma_fprop", "calls": 20, "ms": 4.0, "of_busy": 0.35}]},
             "channels_last": {"error": "RuntimeError: x"}}
    rec = {"card": "NVIDIA H200", "gpus": 1, "torch": "2.11.0", "date": "2026-11-26", "script": "s",
           "figures": ladder.reference_figures(rows, trace)}
    doc = perfdoc.performance_doc([rec])
    assert "## NVIDIA H200 (torch 2.11.0, 2026-11-26)" in doc and "| fp32 | fp32 | 256 | 9,000 |" in doc
    assert "### What limits the last rung" in doc and "compute 90%" in doc and "`sm90_xmma_fprop` | 20 |" in doc
    assert "No reference run on an H100 yet" in doc and "No reference run on an H200" not in doc  # says what is missing
    assert "notebook 07's card" not in doc  # no card pages, no section
    page = "## Card: gpt on NVIDIA H200 (torch 2.11.0)\n\n| | |\n|---|---|\n| model | gpt |\n"
    with_card = perfdoc.performance_doc([rec], cards=[page])
    assert with_card.startswith(doc.rstrip("\n")) and "## Other models: notebook 07's card" in with_card
    assert "### Card: gpt on NVIDIA H200 (torch 2.11.0)\n\n| | |" in with_card  # a heading level down, as it was


def test_kernel_classes_put_fused_triton_before_the_words_it_fuses():
    kernels = [{"name": "sm90_xmma_dgrad_implicit_gemm_bf16", "ms": 2.0},
               {"name": "triton_poi_fused__native_batch_norm_legit_functional_add_convolution_backward_7", "ms": 1.0},
               {"name": "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>", "ms": 0.25},
               {"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ms": 0.5},
               {"name": "Memcpy HtoD (Pinned -> Device)", "ms": 0.125},
               {"name": "void at::native::reduce_kernel<512, 1>", "ms": 0.0625}]
    assert roofline.kernel_classes(kernels) == {roofline.TENSOR_CORE: 2.0, "BatchNorm, ReLU, add (fused Triton)": 1.0,
                                              "communication (NCCL)": 0.5, "optimizer": 0.25, "copies and fills": 0.125,
                                              "other ATen kernels": 0.0625}


def test_roofline_rates_the_tensor_core_kernels_against_the_cards_peak_and_says_which_limit_comes_first():
    kernels = [{"name": "sm90_xmma_fprop", "ms": 8.0}, {"name": "triton_red_fused_batch_norm_3", "ms": 3.0}]
    cfg = TrainConfig(model="resnet18", batch_size=1024, precision="bf16")
    t = {"batch": 1024, "step_ms": 12.0, **roofline.roofline(cfg, "NVIDIA H100 80GB HBM3", 12.0, kernels)}
    flops = t["flops_per_step"]
    assert 3.0e9 < flops / 1024 < 3.6e9  # the CIFAR ResNet-18's forward + backward, counted
    assert t["tensor_core_tflops"] == pytest.approx(flops / 8e-3 / 1e12)
    assert t["step_tflops"] == pytest.approx(flops / 12e-3 / 1e12)
    text = "\n".join(perfdoc.roofline_lines(t, "gpu_resident"))
    assert "| tensor-core convolutions and matmuls | 8.000 | 67% |" in text
    # 8 passes over every BatchNorm's bf16 activations: 614,400 elements per image (counted), at 1024 images
    assert t["norm_gb_per_step"] == pytest.approx(614_400 * 1024 * 2 * 8 / 1e9)
    assert f"| {roofline.NORM_CLASS} | 3.000 | 25% | >= {t['norm_gb_per_step'] / 3.0:.2f} TB/s" in text
    assert ("below the 45% target" in text) == (t["tensor_core_tflops"] / t["peak_tflops"] < 0.45)
    rec = {"card": "NVIDIA H100 80GB HBM3", "gpus": 1, "torch": "2.11.0", "date": "2026-11-26", "script": "s",
           "figures": {"rows": [], "traces": {}}}
    roof = {**rec, "figures": {"traces": {"gpu_resident": t}}}
    doc = perfdoc.performance_doc([rec], [roof])
    assert "### Kernel classes against the roofline" in doc and "| tensor-core convolutions and matmuls |" in doc
    assert "### Kernel classes" not in perfdoc.performance_doc([rec], [{**roof, "card": "NVIDIA H200"}])


def test_notebook_04_shows_the_reference_of_the_card_in_use(tmp_path):
    """On a card with its own reference run (04_ladder_h200.json) the cells show that card's ladder, not the
    default file's (an H100); on a CPU, or on a card no run has measured, the default."""
    for name in ("04_ladder", "04_ladder_h200", "04_roofline"):
        (tmp_path / f"{name}.json").write_text("{}")
    assert ladder.shown_reference("04_ladder", "NVIDIA H200", tmp_path) == "04_ladder_h200"
    assert ladder.shown_reference("04_ladder", "NVIDIA H100 80GB HBM3", tmp_path) == "04_ladder"
    assert ladder.shown_reference("04_roofline", "NVIDIA H200", tmp_path) == "04_roofline"
    assert ladder.shown_reference("04_ladder", "CPU (AMD EPYC, 2 threads)", tmp_path) == "04_ladder"
    (tmp_path / "04_ladder_cpu_amd_epyc_2_threads.json").write_text("{}")  # never a CPU's own file
    assert ladder.shown_reference("04_ladder", "CPU (AMD EPYC, 2 threads)", tmp_path) == "04_ladder"
    assert ladder.shown_reference("04_ladder", "NVIDIA H100 80GB HBM3") == "04_ladder_h100"  # the committed files
