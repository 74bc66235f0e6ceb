"""scripts/instructor_figures.py: which cells of a notebook the guide's plan says use more than one GPU."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import instructor_figures as guide  # noqa: E402


def _code(*sources: str) -> list[dict]:
    return [{"cell_type": "code", "source": s} for s in sources]


def test_a_parameter_named_ddp_gpus_is_not_a_sweep_over_the_gpus(monkeypatch):
    """07's DDP_GPUS = 0 and ddp_gpus=DDP_GPUS once read as 'all' (the pattern GPUS matched inside DDP_GPUS); the
    card left at its default (auto) measures DDP on 2 or 4 GPUs."""
    cells = _code("DDP_GPUS = 0  # a parameter",
                  "card = tl.card(GPT, TOKENS, quiet=True)",
                  "card = tl.card(MODEL, IMAGES, quiet=True, ddp_gpus=DDP_GPUS)",
                  "again = tl.card(GPT, doubled, quiet=True, ddp_gpus=0)",
                  "try:\n    tl.card(MODEL, lambda: {})\nexcept tl.UserError as e:\n    print(e)",
                  "GPUS = [n for n in (1, 2, 4) if n <= S.gpus]",
                  "tl.scaling.weak_sweep(cfg, GPUS)")
    monkeypatch.setattr(guide, "_cells", lambda name: cells)
    assert guide.gpu_cells("any") == {1: "2 or 4", 5: "all", 6: "all"}
    cells[0]["source"] = "DDP_GPUS = None  # measure it too"
    assert guide.gpu_cells("any") == {1: "2 or 4", 2: "2 or 4", 5: "all", 6: "all"}


def test_notebook_07_names_its_one_card_that_measures_ddp():
    found = guide.gpu_cells("07_your_own_model")
    assert list(found.values()) == ["2 or 4"]
    assert "tl.card(GPT, TOKENS, quiet=True)" in "".join(guide._cells("07_your_own_model")[next(iter(found))]["source"])


def test_the_guide_says_when_the_gpu_figures_were_made_with_another_torch(monkeypatch):
    """Every GPU reference file was made with torch 2.11 while the set-up pins 2.14.1: the guide's section 3 said
    'what your room will see' without a word on it."""
    monkeypatch.setattr(guide, "pinned_torch", lambda: "2.14.1")
    older = guide.torch_versions([{"torch": "2.11.0+cu130"}, {"torch": "2.11.0+cu130"}])
    assert "torch 2.11.0+cu130; the set-up installs torch 2.14.1" in older and "may differ" in older
    assert "the torch the set-up installs" in guide.torch_versions([{"torch": "2.14.1+cu130"}])
    assert guide.gpu_figures().startswith("These files were measured with torch ")


def test_the_plans_totals_add_up_from_its_rows():
    """The afternoon printed 116 min where its rows (41 + 45 + 29) add up to 115: totals summed unrounded minutes.
    Day one's total is the sum of its column, and the day's line lists the same minutes."""
    import re

    text = guide.plan()
    rows = {n: (int(c), int(o), d) for n, c, o, d in
            re.findall(r"^\| (\d\d_\w+) \| (\d+) \| (\d+) \| [^|]* \| [^|]* \| (\d+|day two) \|", text, re.M)}
    total = re.search(r"^\| \*\*all\*\* \| \*\*(\d+)\*\* \| \*\*(\d+)\*\* \| \| \| \*\*(\d+)\*\* \|", text, re.M)
    assert int(total.group(1)) == sum(c for c, _, _ in rows.values())
    assert int(total.group(2)) == sum(o for _, o, _ in rows.values())
    day = [int(d) for _, _, d in rows.values() if d != "day two"]
    assert int(total.group(3)) == sum(day)
    line = re.search(r"\*\*Day one, the core path:\*\* (\d+) min.*?: ((?:\d\d \d+(?:, )?)+) min", text)
    assert int(line.group(1)) == sum(day) == sum(int(x.split()[1]) for x in line.group(2).split(", "))


