"""The card's page (lessons/card_report.py) from stored cards: fast, no training run."""
import json

import pytest

from tutorial_lib import reference
from tutorial_lib.lessons import card_report, noise
from tutorial_lib.lessons.card_report import Card


def _card(model: str) -> Card:
    return Card(**json.loads((reference.FOLDER / "cards" / f"card_{model}.json").read_text()))


def test_a_band_is_printed_as_it_is():
    """A lopsided band printed as ± (half its width) hid the side that decides whether two bands overlap."""
    assert noise.shown(noise.Figure(100.0, 95.0, 105.0)) == "100.0 (±5%)"
    assert noise.shown(noise.Figure(4604.3, 4144.0, 5525.0)) == "4,604.3 (-10%/+20%)"
    assert noise.shown(noise.Figure(3.1, 2.0, 11.0)) == "3.1 (band 2 to 11)"  # a rung's steps, not windows
    assert card_report._band({"img_s": 208_998.0, "img_s_low": 42_856.0, "img_s_high": 7_168_459.0}) == \
        "208,998 (windows 42,856 to 7,168,459)"


def test_the_stored_resnet50_card_prints_its_compile_band_as_measured():
    row = next(line for line in _card("resnet50").rung_table().splitlines() if line.startswith("| compile |"))
    assert "4,604.3 (-10%/+20%)" in row and "±15%" not in row


@pytest.mark.parametrize("model", ["gpt", "resnet50", "vit_b_16"])
def test_a_bench_figure_has_one_band_on_the_page(model):
    """The row IO / SYNTHETIC / FULL and the row under it printed the same figure with two spreads (±5% beside ±0%:
    the bench printed its windows without the floor). The stored cards keep that bench's verdict; the page judges
    their windows again."""
    card = _card(model)
    rows = dict(card.summary_rows())
    for m, fig in card.bench["figures"].items():
        shown = card_report._band(fig)
        assert shown in rows["IO / SYNTHETIC / FULL (fp32, samples/s)"] and f"{m.upper()} {shown}" in rows[
            "what bounds the step"], m
    assert "(±0%)" in card.bench["verdict"] and "±0%" not in card.markdown()


def test_the_recommendation_says_which_changes_it_keeps_without_a_gain():
    """The rungs stack: the recommended rung keeps every change below it, one that measured slower too (the GPT
    card's compile, x0.80); the page names them, and beside a faster rung shows the two bands that overlap."""
    gpt = dict(_card("gpt").summary_rows())["recommended"]
    assert gpt.startswith("step_graph:") and "compile (x0.80, slower than fused_adamw)" in gpt
    assert "among them these, which gained nothing beyond noise where they were added: " in gpt  # was '... too:'
    assert "fused_adamw (x1.04, within noise of bf16)" in gpt and "tf32" not in gpt.split("; the rungs stack")[1]
    vit = dict(_card("vit_b_16").summary_rows())["recommended"]
    assert "within noise of the fastest, step_graph: its band 3,056-3,406 overlaps this one's 3,026-3,392" in vit


def test_the_reference_pages_are_rendered_from_their_stored_cards():
    stale = [p.name for p, text in card_report.reference_pages().items() if not p.is_file() or p.read_text() != text]
    assert not stale, (f"{stale} are stale: python -c 'from tutorial_lib.lessons import card_report as c; "
                       "c.write_reference_pages()', then python -m tutorial_lib ladder --doc")


def test_a_measured_efficiency_below_the_predicted_range_is_flagged():
    """The H200 ViT-B/16 card measured 0.85 on 4 GPUs against a predicted 0.89-0.93: the two ends are no bound."""
    row = dict(_card("vit_b_16").summary_rows())["DDP efficiency measured"]
    assert row.startswith("0.85 on 4 GPUs") and "predicted 0.89-0.93: measured below the range" in row
    assert "below the range" not in dict(_card("resnet50").summary_rows())["DDP efficiency measured"]  # 0.97 in 0.97-0.99


def test_a_cpu_card_predicts_for_cpu_processes_and_says_so():
    """A card made on a CPU predicted 'on 2/4/8 GPUs' from a CPU step and gloo's bandwidth, without a word."""
    gpu = _card("resnet50")
    cpu = Card(**{**json.loads((reference.FOLDER / "cards" / "card_resnet50.json").read_text()),
                  "probe": {**gpu.probe, "device_type": "cpu"}})
    row = next((k, v) for k, v in cpu.summary_rows() if k.startswith("DDP efficiency predicted"))
    assert row[0] == "DDP efficiency predicted on 2/4/8 CPU processes (gloo)" and "it says nothing about GPUs" in row[1]
    assert "DDP efficiency predicted on 2/4/8 GPUs" in dict(gpu.summary_rows())


def test_without_two_gpus_the_card_says_how_many_it_would_measure_ddp_on(monkeypatch):
    from tutorial_lib.lessons import card_ddp

    monkeypatch.setattr(card_ddp.torch.cuda, "is_available", lambda: False)
    gpus, why = card_ddp.gpus_to_measure(None)
    assert gpus == 0 and "this node has 0 GPUs" in why and "every GPU" not in why
    assert "on 1 GPU and on 2 (on 4 where the node has 4 or more)" in why


def test_ddp_in_one_process_names_what_the_recommendation_runs_as_ddp():
    """The H200 cards recommending the whole step as one CUDA graph said that DDP's hooks and buckets (and a graph
    cut at the buckets) cost that row: with cuda_graph=true the engine runs no DDP module, it does DDP's work by hand
    inside the graph (engine.Run.wrap)."""
    gpt = dict(_card("gpt").summary_rows())["DDP in one process (its own cost)"]
    assert _card("gpt").recommended["changes"]["cuda_graph"] and "hooks" not in gpt
    assert "done by hand inside the step's CUDA graph (no DDP module" in gpt
    vit = dict(_card("vit_b_16").summary_rows())["DDP in one process (its own cost)"]  # recommends compile, no graph
    assert "DDP's gradient hooks and buckets (and a compiled graph cut at the buckets) cost every rank" in vit
    assert card_report.ddp_work({}) == "DDP's gradient hooks and buckets cost"


def test_a_predicted_range_whose_ends_print_the_same_is_one_figure():
    """The GPT card made on one H200 printed '0.10-0.10' for 4 GPUs."""
    assert card_report._ends({"efficiency_exposed": 0.101, "efficiency_hidden": 0.104}) == "0.10"
    assert card_report._ends({"efficiency_exposed": 0.14, "efficiency_hidden": 0.151}) == "0.14-0.15"


def test_a_recommendation_as_one_cuda_graph_says_which_end_of_the_range_it_runs_at():
    """The range's upper end hides the all-reduce behind the backward pass; the H200 GPT card recommends the whole
    step as one CUDA graph, whose DDP (ddp_sync=auto) all-reduces after the backward pass: the page says so."""
    gpt = next(v for k, v in _card("gpt").summary_rows() if k.startswith("DDP efficiency predicted"))
    assert "as one CUDA graph the recommendation all-reduces after the backward pass, at the first end" in gpt
    vit = next(v for k, v in _card("vit_b_16").summary_rows() if k.startswith("DDP efficiency predicted"))
    assert "at the first end" not in vit  # compile, no graph: DDP's hooks overlap the backward pass


def test_byte_sizes_are_in_the_units_of_the_bandwidth_beside_them():
    """The one-H200 card printed 'gradients all-reduced per step | 105.2 MB' for 27,566,080 fp32 parameters
    (110.3 MB; 105.2 was MiB) beside a bandwidth in GB/s of 1e9 bytes."""
    assert card_report._mb(27_566_080 * 4) == "110.3 MB"
    assert card_report._mb(64 * 2**20) == "67.1 MB"
    assert card_report._mb(131_584 * 4) == "526 kB"
    row = dict(_card("gpt").summary_rows())["gradients all-reduced per step"]
    assert row.endswith(" MB (fp32)") and float(row.split()[0].replace(",", "")) == round(_card("gpt").probe["grad_bytes"] / 1e6, 1)


def test_every_rung_s_mfu_is_against_its_precision_s_peak_and_one_peak_for_all():
    """The rung column read fp32 37%, tf32 10%, bf16 6% for rungs whose throughput rises (each divided by its own
    precision's peak, none named); the page now names both peaks and adds a column against the bf16 peak."""
    card = _card("resnet50")
    assert "NVIDIA H200: fp32 67.0, tf32 494.5, bf16 989.5 TFLOP/s (NVIDIA's H200 Tensor Core GPU datasheet, " \
           "without sparsity)" in card.markdown()
    table = card.rung_table().splitlines()
    head = [c.strip() for c in table[0].strip("|").split("|")]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in table[2:]}
    for rung in ("fp32", "bf16", "step_graph"):
        r = next(x for x in card.rows if x["rung"] == rung)
        own, ref = cells[rung][head.index("MFU (its precision)")], cells[rung][head.index("MFU (bf16 peak)")]
        assert own == f"{100 * r['mfu']:.1f}%" and ref == f"{100 * r['img_s'] * card.probe['flops_per_sample'] / 989.5e12:.1f}%"
    assert float(cells["fp32"][head.index("MFU (bf16 peak)")][:-1]) < float(cells["bf16"][head.index("MFU (bf16 peak)")][:-1])
    cpu = Card(**{**json.loads((reference.FOLDER / "cards" / "card_gpt.json").read_text()), "device": "cpu"})
    assert "MFU is n/a: the workbook has no datasheet peak for cpu." in cpu.markdown()
