"""The card's page (lessons/card_report.py) from stored cards: fast, no training run."""
import json

import pytest

from tutorial_lib import reference
from tutorial_lib.lessons import card_report, card_verdict, noise
from tutorial_lib.lessons.card_report import Card


def _card(model: str) -> Card:
    return Card(**json.loads((reference.FOLDER / "cards" / f"card_{model}.json").read_text()))


def test_a_figure_is_printed_with_the_interval_of_its_mean():
    """Bench figures and rungs print in the workbook's one notation (noise.shown): the figure ± the 95% interval of
    its mean, from its windows or its blocks of steps."""
    from tutorial_lib.lessons import bench, ladder

    card = _card("resnet50")
    fig = card.bench["figures"]["full"]
    assert card_report._band(fig) == noise.shown(bench.figure(card_report._measurement(fig)), bench.spec(fig["img_s"]))
    compile_row = next(r for r in card.rows if r["rung"] == "compile")
    line = next(x for x in card.rung_table().splitlines() if x.startswith("| compile |"))
    assert f"| {noise.shown(ladder.figure(compile_row))} |" in line


@pytest.mark.parametrize("model", ["gpt", "resnet50", "vit_b_16"])
def test_a_bench_figure_has_one_band_on_the_page(model):
    """The row IO / SYNTHETIC / FULL and the row under it printed the same figure with two spreads (±5% beside ±0%:
    the bench printed its windows without the floor). The stored cards keep that bench's verdict; the page judges
    their windows again."""
    card = _card(model)
    rows = dict(card.summary_rows())
    for m, fig in card.bench["figures"].items():
        shown = card_report._band(fig)
        assert shown in rows["IO / SYNTHETIC / FULL (fp32, samples/s)"], m
    assert "±0%" not in card.markdown()  # a stored verdict of an older bench may say (±0%); the page judges again


def test_the_recommendation_says_which_changes_it_keeps_without_a_gain():
    """The rungs stack: the recommended rung keeps every change below it, one that measured no faster too; the page
    names exactly the rungs up to the recommended one whose verdict in the table is not 'faster', each with that
    verdict (read from the stored GPT card, whatever its figures: a re-run card changes which rungs they are)."""
    card = _card("gpt")
    assert dict(card.summary_rows())["recommended"].startswith("step_graph:")
    notes = " ".join(card.notes())
    verdicts = {}  # rung -> the table's "against the row it changes"
    for line in card.rung_table().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        verdicts[cells[0]] = cells[4]
    upto = list(verdicts).index("step_graph")
    expected = [r for r in list(verdicts)[1:upto + 1] if verdicts[r].startswith("x") and " faster than " not in verdicts[r]]
    assert card.kept_without_gain() == expected
    if expected:
        kept = notes.split("among them these, which gained nothing beyond noise where they were added: ")[1]
        kept = kept.split(". ")[0]
        assert kept == ", ".join(f"{r} ({verdicts[r]})" for r in expected), kept
    else:
        assert "gained nothing beyond noise" not in notes
    vit = " ".join(_card("vit_b_16").notes())
    assert "The recommendation against the fastest rung, step_graph: x" in vit


def test_the_reference_pages_are_rendered_from_their_stored_cards():
    stale = [p.name for p, text in card_report.reference_pages().items() if not p.is_file() or p.read_text() != text]
    assert not stale, (f"{stale} are stale: python -c 'from tutorial_lib.lessons import card_report as c; "
                       "c.write_reference_pages()', then python -m tutorial_lib ladder --doc")


def _measured(card: Card, gpus: int, efficiency: float) -> Card:
    """The card as if its node had `gpus` GPUs and measured DDP's `efficiency` on them (the committed cards ran on
    one GPU: their DDP row says why it was not measured)."""
    one = card.recommended["row"]["img_s"]
    measured = {"why": None, "gpus": gpus, "unit": "GPUs", "efficiency": efficiency, "one_gpu_samples_s": one,
                "ddp_samples_s": efficiency * gpus * one, "timed_steps": 30}
    return Card(**{**card.__dict__, "ddp": {**card.ddp, "measured": measured}})


def test_a_measured_efficiency_below_the_predicted_range_is_flagged():
    """A measured efficiency is shown beside the range predicted for the same GPU count, and one below that range
    is flagged (the two ends are no bound); one inside it is not."""
    card = _card("vit_b_16")
    assert dict(card.summary_rows())["DDP efficiency measured"].startswith("not measured: this node has 1 GPU")
    pred = next(p for p in card.ddp["rows"] if p["gpus"] == 8)
    low = _measured(card, 8, pred["efficiency_exposed"] - 0.1)
    row = dict(low.summary_rows())["DDP efficiency measured"]
    assert row.startswith(f"{pred['efficiency_exposed'] - 0.1:.2f} on 8 GPUs")
    assert f"predicted {pred['efficiency_exposed']:.2f}-{pred['efficiency_hidden']:.2f}" in row
    assert "DDP measured below the predicted range" in low.markdown()
    inside = _measured(card, 8, (pred["efficiency_exposed"] + pred["efficiency_hidden"]) / 2)
    assert "below the predicted range" not in inside.markdown()
    assert "above the predicted range" in _measured(card, 8, pred["efficiency_hidden"] + 0.1).markdown()


def test_a_cpu_card_predicts_for_cpu_processes_and_says_so():
    """A card made on a CPU predicted DDP on GPUs from a CPU step without a word: its prediction says it is for CPU
    processes and nothing about GPUs; a GPU card's is for the interconnects a job would run on."""
    gpu = _card("resnet50")
    cpu = Card(**{**gpu.__dict__, "probe": {**gpu.probe, "device_type": "cpu"}})
    label = next(k for k, _ in cpu.summary_rows() if k.startswith("DDP efficiency predicted"))
    assert label == "DDP efficiency predicted (CPU processes (gloo))", label
    assert "it says nothing about GPUs" in cpu.markdown() and "it says nothing about GPUs" not in gpu.markdown()
    row = dict(gpu.summary_rows())["DDP efficiency predicted (GPUs)"]
    assert "NVLink/NVSwitch" in row and "PCIe" in row and "network" in row, row


def test_without_two_gpus_the_card_says_how_many_it_would_measure_ddp_on(monkeypatch):
    from tutorial_lib.lessons import card_ddp

    monkeypatch.setattr(card_ddp.torch.cuda, "is_available", lambda: False)
    gpus, why = card_ddp.gpus_to_measure(None)
    assert gpus == 0 and "this node has 0 GPUs" in why and "every GPU" not in why
    assert "on 1 GPU and on 2, or 4 where the node has 4" in why and len(why.split()) <= card_verdict.CELL_WORDS


def test_ddp_in_one_process_names_what_the_recommendation_runs_as_ddp():
    """The H200 cards recommending the whole step as one CUDA graph said that DDP's hooks and buckets (and a graph
    cut at the buckets) cost that row: with cuda_graph=true the engine runs no DDP module, it does DDP's work by hand
    inside the graph (engine.Run.wrap)."""
    gpt = " ".join(_card("gpt").notes())
    assert _card("gpt").recommended["changes"]["cuda_graph"] and "hooks" not in gpt
    assert "done by hand inside the step's CUDA graph (no DDP module" in gpt
    vit = " ".join(_card("vit_b_16").notes())  # recommends compile, no graph
    assert "DDP's gradient hooks and buckets (and a compiled graph cut at the buckets) cost every rank" in vit
    assert card_report.ddp_work({}) == "DDP's gradient hooks and buckets cost"


def test_a_predicted_range_whose_ends_print_the_same_is_one_figure():
    """The GPT card made on one H200 printed '0.10-0.10' for 4 GPUs."""
    assert card_report._ends({"efficiency_exposed": 0.101, "efficiency_hidden": 0.104}) == "0.10"
    assert card_report._ends({"efficiency_exposed": 0.14, "efficiency_hidden": 0.151}) == "0.14-0.15"


def test_a_recommendation_as_one_cuda_graph_says_which_end_of_the_range_it_runs_at():
    """The range's upper end hides the all-reduce behind the backward pass; the H200 GPT card recommends the whole
    step as one CUDA graph, whose DDP (ddp_sync=auto) all-reduces after the backward pass: the page says so."""
    gpt = " ".join(_card("gpt").notes())
    assert "as one CUDA graph the recommendation all-reduces after the backward pass, at the first end" in gpt
    vit = " ".join(_card("vit_b_16").notes())
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
    for rung in ("fp32", "bf16", card.recommended["rung"]):
        r = next(x for x in card.rows if x["rung"] == rung)
        own, ref = cells[rung][head.index("MFU (its precision)")], cells[rung][head.index("MFU (bf16 peak)")]
        assert own == f"{100 * r['mfu']:.1f}%" and ref == f"{100 * r['img_s'] * card.probe['flops_per_sample'] / 989.5e12:.1f}%"
    assert float(cells["fp32"][head.index("MFU (bf16 peak)")][:-1]) < float(cells["bf16"][head.index("MFU (bf16 peak)")][:-1])
    cpu = Card(**{**json.loads((reference.FOLDER / "cards" / "card_gpt.json").read_text()), "device": "cpu"})
    assert "MFU is n/a: the workbook has no datasheet peak for cpu." in cpu.markdown()


@pytest.mark.parametrize("model", ["gpt", "resnet50", "vit_b_16"])
def test_the_page_opens_with_a_five_line_verdict_and_keeps_its_cells_short(model):
    """The page opened with a table whose cells ran to 60 words; now five lines first, then cells of 30 words at most
    (what needs more is a note under the tables), and the DDP prediction's formula once, with its inputs."""
    card = _card(model)
    page = card.markdown().splitlines()
    assert [line.split("**")[1] for line in page[2:7]] == ["What bounds it", "Recommended", "MFU", "Memory", "DDP"]
    cells = [c for line in page if line.startswith("| ") for c in line.strip("|").split(" | ")]
    assert cells and not card_verdict.too_long(cells), card_verdict.too_long(cells)
    formula = [n for n in card.notes() if n.startswith("DDP's efficiency on n GPUs")]
    assert len(formula) == 1 and f"{card.ddp['grad_bytes'] / 1e6:,.1f} MB" in formula[0]


def test_one_gpu_predicts_ddp_for_the_links_a_job_runs_on(monkeypatch):
    """On a one-GPU server the card predicted 0.09 on 4 GPUs from gloo between two CPU processes; it now predicts for
    NVLink, PCIe and the network between nodes (typical bandwidths, or the site profile's), each named."""
    from tutorial_lib import sites
    from tutorial_lib.lessons import card as card_module

    monkeypatch.setattr(card_module.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(card_module.allreduce, "measure", lambda *a: pytest.fail("gloo measured on a GPU node"))
    probe = {"device_type": "cuda", "grad_bytes": 110.3e6}
    ddp = card_module.predict_ddp(probe, {"batch": 32, "img_s": 3200.0}, {"why": "not measured"})
    by = {r["key"]: r for r in ddp["rows"]}
    assert set(by) == {"nvlink", "pcie", "network"} and by["nvlink"]["efficiency_exposed"] > by["pcie"]["efficiency_exposed"]
    assert by["network"]["gpus"] == 16 and by["nvlink"]["source"] == "typical"
    own = tmp_site(monkeypatch, sites, {"network": 50})
    faster = {r["key"]: r for r in card_module.predict_ddp(probe, {"batch": 32, "img_s": 3200.0}, {"why": "-"}, own)["rows"]}
    assert faster["network"]["efficiency_exposed"] > by["network"]["efficiency_exposed"] and \
        faster["network"]["source"] == f"site profile {own}"
    card = Card(**{**json.loads((reference.FOLDER / "cards" / "card_gpt.json").read_text()), "ddp": {**ddp, "measured": {"why": "-"}}})
    assert card_verdict.predicted_cell(card).startswith("NVLink/NVSwitch ") and "network" in card_verdict.outlook(card)
    assert "NVLink/NVSwitch, 8 GPUs of one node 300.0 GB/s (typical)" in card_verdict.formula(card)


def tmp_site(monkeypatch, sites, interconnects):
    import dataclasses

    site = dataclasses.replace(sites.load_site("generic"), name="mysite", interconnects=interconnects)
    monkeypatch.setattr(sites, "load_site", lambda name=None: site if name == "mysite" else sites.Site)
    return "mysite"
