"""The card on models of this test's own (a depthwise/grouped network, a model whose batch function is slow, a
transformer, a model that returns a dict and has its own loss), on CPU at the small size: FLOPs within 10% of a hand
count, its peaks named, which of the input or the model caps each rung, its time budget kept, every cell of its page
at most 30 words; the memory outlook (activation checkpointing, FSDP2) and MobileNetV3-Small's FLOPs against an
analytic count."""
import contextlib
import dataclasses
import json
import re
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tutorial_lib as tl
from tutorial_lib import reference
from tutorial_lib.lessons import card as card_module, card_input, card_memory, card_report, card_verdict
from tutorial_lib.lessons.card_report import Card

SIDE, CLASSES = 16, 10


class DepthwiseBlock(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.dw, self.pw = nn.Conv2d(c, c, 3, padding=1, groups=c), nn.Conv2d(c, c, 1)

    def forward(self, x):
        return x + self.pw(F.relu(self.dw(x)))


class Depthwise(nn.Module):
    """A stem, two blocks of a depthwise and a pointwise convolution, a head: torch's counter counts the depthwise
    weight gradients once per group over."""

    def __init__(self):
        super().__init__()
        self.stem, self.blocks = nn.Conv2d(3, 8, 3, padding=1), nn.Sequential(DepthwiseBlock(), DepthwiseBlock())
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def depthwise_count():
    """(forward, training step) FLOPs per sample by hand, 2 per multiply-add; the stem's input needs no gradient
    (2 passes), every other layer 3."""
    hw = SIDE * SIDE
    stem, dw, pw, head = hw * 8 * 3 * 9, hw * 8 * 1 * 9, hw * 8 * 8, 8 * CLASSES
    forward = stem + 2 * (dw + pw) + head
    return 2 * forward, 2 * (2 * stem + 3 * (forward - stem))


def mlp():
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def mlp_count():
    return 2 * (64 * 64 + 64 * CLASSES), 2 * (2 * 64 * 64 + 3 * 64 * CLASSES)


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, x):
        return {"logits": self.net(x), "features": x}


def dict_loss(output, target):
    return F.cross_entropy(output["logits"], target)


def gpt_count(s):
    """A GPT's FLOPs per sequence: every linear layer 2 x its weights per token, attention's two matmuls 2 x t^2 x
    width per layer each (the counter counts the whole square), all of it three times in a training step."""
    per_token = s.layers * 12 * s.width ** 2 + s.width * s.vocab
    forward = 2 * (s.seq * per_token + s.layers * 2 * s.seq ** 2 * s.width)
    return forward, 3 * forward


def slow(delay_s=0.1):
    def batch():
        time.sleep(delay_s)
        return torch.rand(8, 64), torch.randint(0, CLASSES, (8,))
    return batch


def fast_images():
    return torch.rand(4, 3, SIDE, SIDE), torch.randint(0, CLASSES, (4,))


def fast_vectors():
    return torch.rand(8, 64), torch.randint(0, CLASSES, (8,))


def _gpt():
    from tutorial_lib.lessons import card_examples as ex

    return ex.GPT(ex.GPT_SMALL)


def _tokens():
    from tutorial_lib.lessons import card_examples as ex

    t = torch.randint(0, ex.GPT_SMALL.vocab, (ex.GPT_SMALL.batch, ex.GPT_SMALL.seq + 1))
    return t[:, :-1], t[:, 1:]


def _gpt_count():
    from tutorial_lib.lessons import card_examples as ex

    return gpt_count(ex.GPT_SMALL)


OWN = {"depthwise": (Depthwise, fast_images, None, depthwise_count),
       "slow_batches": (mlp, slow(), None, mlp_count),
       "transformer": (_gpt, _tokens, None, _gpt_count),
       "dict_with_own_loss": (DictOut, fast_vectors, dict_loss, mlp_count)}


def page_cells(markdown: str) -> list[str]:
    return [c for line in markdown.splitlines() if line.startswith("| ") for c in line.strip("|").split(" | ")]


@pytest.mark.parametrize("name", list(OWN))
def test_the_card_on_a_model_of_its_own(name, tmp_path):
    model, batch, loss, count = OWN[name]
    c = tl.card(model, batch, loss, small=True, quiet=True, rungs="fp32,bf16", out=str(tmp_path / name))
    forward, train = count()
    assert abs(c.probe["flops_forward"] - forward) <= 0.1 * forward, (c.probe["flops_forward"], forward)
    assert abs(c.probe["flops_per_sample"] - train) <= 0.1 * train, (c.probe["flops_per_sample"], train)
    page = c.markdown()
    assert f"MFU is n/a: the workbook has no datasheet peak for {c.device}." in page  # a CPU: its absence named
    h200 = Card(**{**dataclasses.asdict(c), "device": "NVIDIA H200"}).peaks_note()
    assert "NVIDIA H200: bf16 989.5 TFLOP/s" in h200 and "datasheet" in h200  # a GPU's peak: named, with its source
    measured = [r for r in c.rows if not r["skipped"]]
    assert {r["rung"] for r in measured} == {"fp32", "bf16"}
    for r in measured:  # which of the input or the model caps each rung, in its row ('not settled': the rule can't
        said = card_input.cap(r)  # yet tell the two apart on a loaded CPU, and says so)
        assert said in ("input", "model", "not settled") and card_input.cap_cell(r).startswith(said)
        assert (said != "model") == (name == "slow_batches"), (name, r["rung"], card_input.cap_cell(r))
        if name == "slow_batches":  # the model alone, on one resident batch, faster than on 100 ms batches
            assert r["resident"]["img_s"] > r["img_s"] and card_input.waited(r) > card_input.WAIT_SHARE
    rungs_s = sum(r.get("wall_s") or 0 for r in c.rows)
    assert rungs_s <= card_module.SMALL.budget_s and "time budget" not in page  # every rung ran within its budget
    assert not card_verdict.too_long(page_cells(page)), card_verdict.too_long(page_cells(page))
    rows = dict(c.summary_rows())
    assert rows["largest batch with activation checkpointing"].startswith("n/a")
    assert "(estimate from the sizes)" in rows["memory per GPU: DDP, FSDP2"]
    stored = json.loads((tmp_path / name / "card.json").read_text())
    assert set(stored["memory"]) >= {"largest_batch", "why", "checkpointed", "outlook"}  # added, none renamed
    assert Card(**stored).markdown() == page


def test_committed_reference_pages_keep_every_cell_within_30_words():
    """The reference cards render through card_report with today's rows, every cell at most 30 words; a card
    recorded before the memory outlook existed shows those rows as 'not measured', a newer one shows its figures."""
    pages = card_report.reference_pages()
    assert pages
    for path, text in pages.items():
        assert not card_verdict.too_long(page_cells(text)), (path.name, card_verdict.too_long(page_cells(text)))
        record = json.loads((reference.FOLDER / "cards" / f"card_{path.stem.removeprefix('07_card_')}.json").read_text())
        newer = "outlook" in record["memory"]
        for row in ("largest batch with activation checkpointing", "memory per GPU: DDP, FSDP2"):
            assert (f"| {row} | not measured |" in text) is not newer, (path.name, row)
    assert any("| memory per GPU: DDP, FSDP2 | not needed: DDP" in t for t in pages.values())


def test_a_long_cell_is_cut_and_given_whole_in_a_note():
    record = json.loads((reference.FOLDER / "cards" / "card_gpt.json").read_text())
    long_why = "none: " + " ".join(["word"] * 40)
    card = Card(**{**record, "job": {"path": None, "why": long_why}})
    page = card.markdown()
    assert not card_verdict.too_long(page_cells(page))
    assert "... (in full below)" in page and f"Training job: {long_why}" in page


# ---------------------------------------------------------------------------------------- the memory outlook
def test_the_fsdp2_outlook_where_ddp_does_not_fit():
    """A model of 10 billion parameters trained with AdamW holds 160 GB of fp32 state: it does not fit one H200 with
    DDP; sharded by FSDP2 over 8 GPUs each holds an eighth of it, plus its own activations and two blocks."""
    probe = {"params": 10_000_000_000, "activation_bytes": 10 * 2**30, "block_bytes": 4 * 200_000_000}
    o = card_memory.outlook(probe, "adamw", 0.9, 141 * 10**9)
    assert o["state_bytes"] == {"params": 40e9, "grads": 40e9, "optimizer": 80e9} and o["ddp_fits"] is False
    assert o["fsdp_bytes"][8] == pytest.approx(160e9 / 8 + 10 * 2**30 + 1.6e9)
    assert o["fsdp_bytes"][2] > o["fsdp_bytes"][4] > o["fsdp_bytes"][8] and o["estimate"]
    cell = card_memory.fsdp_cell({"outlook": json.loads(json.dumps(o))})  # as card.json stores it (keys as text)
    assert "does not fit" in cell and "FSDP2 " in cell and "on 2/4/8 GPUs (estimate from the sizes)" in cell
    assert len(cell.split()) <= card_verdict.CELL_WORDS
    small = card_memory.outlook({**probe, "params": 1_000_000}, "sgd", 0.9, 141 * 10**9)
    assert small["ddp_fits"] and small["state_bytes"]["optimizer"] == 4e6  # SGD's momentum: one copy
    assert card_memory.fsdp_cell({"outlook": small}).startswith("not needed: DDP ")
    assert card_memory.state_bytes(10, "sgd", 0.0)["optimizer"] == 0
    record = json.loads((reference.FOLDER / "cards" / "card_gpt.json").read_text())
    big = Card(**{**record, "memory": {**record["memory"], "outlook": o}})
    verdict = [x for x in big.markdown().splitlines() if x.startswith("- **Memory**")][0]
    assert "does not fit one GPU: FSDP2's estimate is below" in verdict
    assert "an estimate from the sizes (not measured)" in big.markdown()


def test_saved_activations_and_their_checkpointed_estimate():
    """The probe counts the bytes saved for the backward pass; checkpointing the blocks keeps their inputs and one
    block's own at a time, fewer."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 256)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))
    model = nn.Sequential(nn.Linear(64, 256), *[Block() for _ in range(4)])
    saved = {}
    with card_memory.saved_activations(model, saved):
        model(torch.rand(32, 64)).sum().backward()
    assert saved["bytes"] >= 4 * 32 * 256 * 4 * 2  # two saved inputs of 32 x 256 fp32 per block at least
    assert 0 < saved["checkpointed_bytes"] < saved["bytes"]
    flat = {}
    with card_memory.saved_activations(mlp(), flat):
        mlp()(torch.rand(8, 64))
    assert flat["checkpointed_bytes"] is None  # no block: nothing to checkpoint


def test_the_largest_batch_with_activation_checkpointing_is_searched_after_the_plain_one(monkeypatch):
    calls = []
    monkeypatch.setattr(card_memory, "_search", lambda parts, cfg, probe, cap, deadline: calls.append(
        (cfg.activation_checkpointing, deadline)) or (64 if deadline else 32, "eager step at bf16; 72 did not fit"))
    monkeypatch.setattr(card_memory, "device_total", lambda kind: 141 * 10**9)
    probe = {"device_type": "cuda", "batch": 8, "params": 1000, "blocks": 2, "activation_bytes": 10, "block_bytes": 8}
    cfg = tl.TrainConfig(precision="bf16")
    start = time.perf_counter()
    memory = card_memory.largest_batch(None, cfg, probe, 4096, checkpointed_s=20)
    assert [c[0] for c in calls] == ["none", "blocks"] and calls[0][1] is None
    assert start + 20 <= calls[1][1] <= time.perf_counter() + 20  # bounded: no step starts after it
    assert memory["largest_batch"] == 32 and memory["checkpointed"]["largest_batch"] == 64
    assert memory["outlook"]["ddp_fits"] and "search_s" in memory["checkpointed"]
    calls.clear()
    none = card_memory.largest_batch(None, cfg, {**probe, "blocks": 0}, 4096, checkpointed_s=20)
    assert [c[0] for c in calls] == ["none"] and "repeats no block" in none["checkpointed"]["why"]
    assert card_module.FULL.checkpointed_s > 0 and card_module.SMALL.checkpointed_s == 0


def test_the_checkpointed_search_stops_at_its_deadline(monkeypatch):
    """Every step of the search costs seconds at a large batch on a GPU: no step starts after the deadline, and the
    batch found by then is said as a lower bound."""
    from types import SimpleNamespace

    fake = SimpleNamespace(device="cuda:0", batches=lambda: iter([(torch.zeros(8, 1), torch.zeros(8))]))
    monkeypatch.setattr(card_memory.engine, "prepared_run", lambda cfg, make: contextlib.nullcontext(fake))
    monkeypatch.setattr(card_memory, "_budget", lambda device: None)  # doubling: one step per size
    steps = []
    monkeypatch.setattr(card_memory, "_peak", lambda run, x, y, k: steps.append(k) or time.sleep(0.05) or 100 * k)
    t0 = time.perf_counter()
    good, why = card_memory._search(SimpleNamespace(make_run=None), tl.TrainConfig(activation_checkpointing="blocks"), {"batch": 8}, 10**6,
                                    time.perf_counter() + 0.12)
    assert time.perf_counter() - t0 < 0.12 + 0.2 and 1 <= len(steps) <= 4
    assert good == 8 * steps[-1] and why.endswith("checkpointed blocks; at least this: the search ran out of its time")


# ---------------------------------------------------------------------------------------- MobileNetV3-Small
def analytic_count(model: nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """(forward, training step) FLOPs per sample from each convolution's and linear layer's shapes (2 per
    multiply-add, a grouped convolution in_channels / groups inputs per output), the step being three passes of
    every layer but the first convolution (its input needs no gradient: two)."""
    macs, first = [], []

    def conv(m, inp, out):
        k = m.kernel_size[0] * m.kernel_size[1]
        macs.append(out.shape[2] * out.shape[3] * m.out_channels * (m.in_channels // m.groups) * k)
        first.append(first[0] if first else macs[-1])

    def linear(m, inp, out):
        macs.append(m.in_features * m.out_features)
    hooks = [m.register_forward_hook(conv if isinstance(m, nn.Conv2d) else linear) for m in model.modules()
             if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model(x[:1])
    for h in hooks:
        h.remove()
    forward = 2 * sum(macs)
    return forward, 3 * forward - 2 * first[0]


def test_mobilenet_v3_small_flops_against_an_analytic_count(monkeypatch):
    """torch's counter gave mobilenet_v3_small's step 34.5x its forward (its depthwise weight gradients once per
    group over: an fp32 MFU of 36.5% where about 3% is right); counted per group, the step is within 10% of the
    count from the layers' shapes, about 3x the forward. At 64x64 on a CPU; the card's example at 224 on a GPU."""
    from tutorial_lib import models
    from tutorial_lib.lessons import card_examples as ex

    model = ex.mobilenet_v3_small()
    x, y = torch.rand(2, 3, 64, 64), torch.randint(0, 1000, (2,))
    forward, train = analytic_count(model, x)
    parts = card_module.ownmodel.Parts(ex.mobilenet_v3_small, lambda: (x, y))
    probe = card_module.probe_model(parts, tl.TrainConfig(device="cpu"))
    assert abs(probe["flops_forward"] - forward) <= 0.1 * forward, (probe["flops_forward"], forward)
    assert abs(probe["flops_per_sample"] - train) <= 0.1 * train, (probe["flops_per_sample"], train)
    assert 2.5 <= probe["flops_per_sample"] / probe["flops_forward"] <= 3.1 and "per group" in probe["flops_how"]
    stock = float(re.search(r"torch's counter gave [^,]+, x([\d.]+) the forward", probe["flops_how"]).group(1))
    assert stock > 4  # torch's own count, named on the page, far beyond what a backward pass needs
    assert abs(models.train_flops(ex.mobilenet_v3_small(), x, y) / 2 - train) <= 0.1 * train  # the ladder's and 04's
    monkeypatch.setenv("WORKBOOK_SIZE", "small")
    assert ex.images()[0].shape[-1] == ex.IMAGES_SMALL[0] and ex.IMAGES_FULL[0] == 224  # the card's images: 224 on a GPU
