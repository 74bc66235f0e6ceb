"""Notebook 08 (When it does not fit) says what its figures show: its pictures are in the committed outputs, the
memory count from the model's sizes is the count by hand, and each sentence that compares stands on the figures
beside it (the counts on every machine, the runs in the committed CPU outputs, the reference run once recorded)."""
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from tutorial_lib import reference
from tutorial_lib.lessons import memory, memory_oom, memory_snapshot

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "08_when_it_does_not_fit.ipynb"
CELLS = json.loads(NOTEBOOK.read_text())["cells"]
MARKDOWN = " ".join(" ".join("".join(c["source"]).split()) for c in CELLS if c["cell_type"] == "markdown")


def said(words: str) -> None:
    assert words in MARKDOWN, f"08 no longer says {words!r}: change its check here with it"


def printed(call: str) -> str:
    cells = [c for c in CELLS if c["cell_type"] == "code" and call in "".join(c["source"])]
    assert cells, f"08: no cell calls {call!r}"
    return "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))


# ---------------------------------------------------------------------------------------------- pictures
@pytest.mark.parametrize("call", ["tl.memory_plot.stacked(rows, \"Where", "tl.memory_plot.stacked(rows, \"Activation",
                                  "tl.memory_plot.stacked([(label"])
def test_each_picture_is_in_the_committed_outputs(call):
    drawing = [c for c in CELLS if c["cell_type"] == "code" and call in "".join(c["source"])]
    assert drawing, f"08: no cell calls {call!r}"
    assert any("image/png" in o.get("data", {}) for c in drawing for o in c.get("outputs", [])), \
        f"08: the cell calling {call!r} has no picture in its committed outputs: execute the notebook again"


def test_the_snapshot_is_drawn_once_a_reference_snapshot_exists():
    cell = next(c for c in CELLS if c["cell_type"] == "code" and "memory_plot.timeline(" in "".join(c["source"]))
    has_picture = any("image/png" in o.get("data", {}) for o in cell.get("outputs", []))
    assert has_picture == (reference.load("08_snapshot") is not None), \
        "08's snapshot cell and notebooks/reference/08_snapshot.json disagree: execute the notebook again"


# ---------------------------------------------------------------------------------------------- the count
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.relu = nn.Linear(8, 8), nn.ReLU()

    def forward(self, x):
        return self.relu(self.linear(x))


TINY = memory.Example("tiny", lambda: nn.Sequential(nn.Linear(10, 8), Block(), Block(), nn.Linear(8, 5)),
                      lambda n, d: (torch.randn(n, 10, device=d), torch.randint(0, 5, (n,), device=d)))


def test_the_count_from_sizes_is_the_count_by_hand():
    c = memory.count(TINY, 4)
    params = (10 * 8 + 8) + 2 * (8 * 8 + 8) + (8 * 5 + 5)
    assert c["params"] == params
    assert (c["parameters"], c["gradients"], c["optimizer state"]) == (4 * params, 4 * params, 8 * params)
    # saved for backward, 4 rows of fp32: the input (4x10), the first layer's output (4x8, the first block's
    # input), each block's ReLU output (4x8; the second one also the last layer's input), log_softmax (4x5),
    # the int64 targets (4) and nll_loss's total weight (one float)
    hand = 4 * 4 * 10 + 3 * (4 * 4 * 8) + 4 * 4 * 5 + 8 * 4 + 4
    assert c["activations"] == hand
    # checkpointed: the same tensors kept (each block's input, what is saved outside the blocks), plus one block's
    # ReLU output recomputed in the backward pass
    assert memory.count(TINY, 4, checkpointing=True)["activations"] == hand + 4 * 4 * 8


def test_resnet18s_training_state_is_16_bytes_per_parameter():
    c = memory.count(memory.RESNET18, 256)
    assert c["params"] == 11_173_962
    assert sum(c[p] for p in memory.PARTS[:3]) == 16 * 11_173_962


def test_a_measure_is_read_back_from_its_reference_figures():
    m = {"parameters": 3 * memory.MiB, "gradients": memory.MiB, "optimizer state": 6 * memory.MiB,
         "activations": 40 * memory.MiB, "peak": 52 * memory.MiB, "reserved": 64 * memory.MiB, "data": memory.MiB,
         "batch": 8, "step_s": [0.01, 0.02]}
    assert memory.from_record(memory.to_record(m)) == m
    assert memory.agreement(98, 100) == "the count is 2% below the measure"


# ---------------------------------------------------------------------------------------------- the sentences
def test_doubling_the_batch_doubles_the_activations_and_leaves_the_rest():
    said("Doubling the batch doubles the activations and leaves the rest.")
    said("For both models, at these batches, the activations dominate.")
    for ex, (small, large) in ((memory.RESNET18, (256, 512)), (memory.GPT, (16, 32))):
        a, b = memory.count(ex, small), memory.count(ex, large)
        assert b["activations"] / a["activations"] == pytest.approx(2, rel=0.01)
        assert all(a[p] == b[p] for p in memory.PARTS[:3])
        assert a["activations"] > sum(a[p] for p in memory.PARTS[:3])


def test_checkpointing_keeps_fewer_activations():
    said("Activation checkpointing trades compute for activations")
    for ex, b in ((memory.RESNET18, 256), (memory.GPT, 16)):
        assert memory.count(ex, b, checkpointing=True)["activations"] < 0.7 * memory.count(ex, b)["activations"]
    assert memory.largest_batch(memory.RESNET18, 80 * memory.GiB, True) > memory.largest_batch(memory.RESNET18,
                                                                                               80 * memory.GiB)


def test_sharding_pays_for_the_large_gpt_and_not_for_resnet18():
    said("For ResNet-18 the whole training state is under a GiB: sharding frees little of any card and adds traffic.")
    said("Sharding pays when the state itself crowds the card, as for the large GPT")
    rows = {label: sum(parts.values()) for _, label, parts in memory.sharding_rows(None) if parts}
    assert sum(memory.count(memory.RESNET18, 64)[p] for p in memory.PARTS[:3]) < memory.GiB
    assert rows["ResNet-18, DDP on 8"] - rows["ResNet-18, FSDP on 8"] < memory.GiB
    assert rows["large GPT, FSDP on 8"] < 0.25 * rows["large GPT, DDP on 8"]
    ref = reference.load("08_memory")
    if ref is not None:  # "with DDP it fits no single card": not the reference card
        card = ref["figures"]["card_mib"] * memory.MiB
        assert rows["large GPT, DDP on 8"] > card > rows["large GPT, FSDP on 8"]


def test_fsdp_matches_ddp_and_a_resumed_run_loses_nothing_in_the_committed_outputs():
    said("Nothing is lost: the steps before the stop come from the checkpoint, and the weights at the end match.")
    for call in ("FSDP against DDP", "resumed on 1, against never stopped"):
        text = printed(call)
        m = re.search(r"largest difference ([\d.e+-]+) of the loss\); weights at the end differ by ([\d.e+-]+)", text)
        assert m, f"08: the line of {call!r} is missing from the committed outputs: {text[-300:]!r}"
        if call.startswith("FSDP"):
            assert float(m.group(1)) < 1e-3
        assert float(m.group(2)) < 1e-5
    resumed = printed("resumed on 1, against never stopped")
    losses = re.search(r"losses ([\d., ]+) against ([\d., ]+) \(", resumed)
    assert losses.group(1).split(", ")[:2] == losses.group(2).split(", ")[:2]  # the steps before the stop


def test_the_reference_run_agrees_with_what_08_says_once_recorded():
    ref = reference.load("08_memory")
    if ref is None:
        pytest.skip("notebooks/reference/08_memory.json is not recorded yet (scripts/gpu/notebooks.sh on a GPU)")
    said("The count of the parameters and optimizer state matches the measure closely")
    for k, c in memory.from_reference(ref, {(n, b): None for n, bs in (("ResNet-18", (256, 512)), ("GPT", (16, 32)))
                                             for b in bs}).items():
        counted = memory.count({"ResNet-18": memory.RESNET18, "GPT": memory.GPT}[k[0]], k[1])
        for part in ("parameters", "optimizer state"):
            assert c[part] == pytest.approx(counted[part], rel=0.02), (k, part)
    ckpt = reference.load("08_checkpointing")
    if ckpt is not None:
        plain, blocks = (memory.from_record(ckpt["figures"][k]) for k in ("plain", "blocks"))
        assert blocks["peak"] < plain["peak"]
        assert " slower" in memory.slower_line(plain["step_s"], blocks["step_s"], plain["batch"])


# ---------------------------------------------------------------------------------------------- error and snapshot
def test_a_step_that_raises_out_of_memory_gives_the_one_line():
    line = memory_oom.stand_in(memory.GPT, 4096)["line"]
    assert line.startswith("out of memory at batch 4096 asking for ") and "batch_size=2048" in line
    assert "\n" not in line


def test_the_snapshot_summary_replays_its_events(tmp_path):
    import pickle

    frames = [{"filename": str(Path(memory.__file__)), "line": 1, "name": "f"}]
    trace = [{"action": "alloc", "addr": 1, "size": 4 * memory.MiB, "frames": frames},
             {"action": "alloc", "addr": 2, "size": 2 * memory.MiB, "frames": frames},
             {"action": "free_requested", "addr": 1, "size": 4 * memory.MiB},
             {"action": "free_completed", "addr": 1, "size": 4 * memory.MiB},
             {"action": "alloc", "addr": 3, "size": memory.MiB, "frames": []}]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [{"total_size": 8 * memory.MiB}], "device_traces": [trace]}))
    s = memory_snapshot.summary(path)
    assert s["peak_mib"] == 6 and s["timeline_mib"] == [4, 6, 2, 3] and s["reserved_mib"] == 8
    assert [row[1:] for row in s["table"]] == [[6, 2]] and s["table"][0][0].startswith("memory.py:1  ")
