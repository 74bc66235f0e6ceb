"""Every comparison word the workbook prints agrees with the one rule (lessons/noise.py) applied to the figures
printed beside it: in every notebook's committed outputs and in every reference file. The notebooks are committed
with the outputs of a CPU run, so this test reads what a learner reads."""
import json
import re
from pathlib import Path

import pytest

from tutorial_lib.lessons import noise

ROOT = Path(__file__).parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REFERENCE = ROOT / "notebooks" / "reference"
F = 1 + noise.FLOOR  # the floor, as a ratio

NUM = r"\d[\d,]*(?:\.\d+)?"
RATIO = re.compile(r"x(\d+\.\d+)(?: \((\d+\.\d+)-(\d+\.\d+)\))?,? (faster|slower|within noise|not settled|no difference)")
EFFICIENCY = re.compile(r"\| (\d\.\d+) \((\d\.\d+)-(\d\.\d+)\) \| (within noise of \d+ x|below \d+ x|above \d+ x)")
BOUND = re.compile(r"^\s*(input-bound in bursts|input-bound|contended|measurement disagrees|balanced|step-bound): "
                   r"(?:waited [^,]*, )?(FULL|IO|SYNTHETIC)/(FULL|IO|SYNTHETIC) x(\d+\.\d+)(?: \((\d+\.\d+)-(\d+\.\d+)\))?")
BAND = r"(?: \((?:±(\d+)%|-(\d+)%/\+(\d+)%|windows ({n})(?:-| to )({n})[^)]*|band ({n}) to ({n}))\))?".format(n=NUM)
FIG = r"\b(FULL|IO|SYNTHETIC) ({n}){band}".format(n=NUM, band=BAND)
CHAIN = re.compile(FIG + r"(?: img/s| samples/s)? (<|>|≈) " + FIG)


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def _figure(groups) -> noise.Figure:
    """A printed bench figure with the band printed beside it: the slowest and fastest of the bench's 10 windows
    (the default), the range the verdicts printed; no band: a single figure."""
    value, pm, below, above, wlo, whi, blo, bhi = groups
    v = _num(value)
    if pm is not None:
        lo, hi = v * (1 - int(pm) / 100), v * (1 + int(pm) / 100)
    elif below is not None:
        lo, hi = v * (1 - int(below) / 100), v * (1 + int(above) / 100)
    elif wlo is not None or blo is not None:
        lo, hi = _num(wlo or blo), _num(whi or bhi)
    else:
        return noise.Figure.of(v)
    return noise.of_range(v, max(lo, 1e-9), hi, 10) if hi > lo else noise.Figure.of(v)


def contradictions(line: str, cpu: bool) -> list[str]:
    """What in one printed line the rule contradicts (empty: nothing)."""
    out = []
    for m in RATIO.finditer(line):
        r, lo, hi, word = float(m[1]), m[2] and float(m[2]), m[3] and float(m[3]), m[4]
        interval = lo is not None
        if word == "faster" and not (r > 1 and (lo > 1 if interval else r >= F - 0.005)):
            out.append(m[0])
        elif word == "slower" and not (r < 1 and (hi < 1 if interval else r <= 1 / F + 0.005)):
            out.append(m[0])
        elif word == "within noise" and not (1 / F - 0.005 <= r <= F + 0.005):
            out.append(m[0])  # equal by the rule: within the floor, whatever the interval
        elif word in ("not settled", "no difference") and interval and not (lo <= 1 <= hi or 1 / F <= r <= F):
            out.append(m[0])
    for m in EFFICIENCY.finditer(line):
        e, lo, hi, word = float(m[1]), float(m[2]), float(m[3]), m[4]
        if (word.startswith("within") and not 1 / F - 0.005 <= e <= F + 0.005) or \
                (word.startswith("below") and not hi < 1) or (word.startswith("above") and not lo > 1):
            out.append(m[0])
    m = BOUND.match(line)
    if m:
        label, a, b, r = m[1], m[2], m[3], float(m[4])
        hi, lo = (float(m[6]) if m[6] else r), (float(m[5]) if m[5] else r)
        lower = hi < 1 if m[5] else r <= 1 / F + 0.005
        if "waited" not in line and label in ("input-bound", "input-bound in bursts", "contended") and not lower:
            out.append(m[0])
        if label == "measurement disagrees" and not (lo > 1 if m[5] else r >= F - 0.005):
            out.append(m[0])
    for m in CHAIN.finditer(line):
        a, b, rel = _figure(m.groups()[1:9]), _figure(m.groups()[11:19]), m[10]
        sign = noise.compare(a, b).sign
        if sign != rel:
            out.append(f"{m[0]} (the rule: {sign})")
    if cpu and re.search(r"\b(launch-bound|host/launch-bound|compute-bound)", line):
        out.append("a CPU run called launch- or compute-bound")
    return out


def _texts(notebook: Path):
    """(cell index, output text) of every code cell's outputs."""
    for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            text = o.get("text") or data.get("text/markdown") or data.get("text/plain") or ""
            yield i, "".join(text)


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def notebook_contradictions(notebook: Path) -> list[str]:
    found = []
    for i, text in _texts(notebook):
        cpu = bool(re.search(r"\bon CPU\b|CPU \(", text)) and "NVIDIA" not in text
        for line in text.splitlines():
            found += [f"cell {i}: {c}" for c in contradictions(line, cpu)]
    return found


def reference_contradictions(path: Path) -> list[str]:
    """A card record keeps the words its day's workbook printed (`verdict`, `verdicts`); its page, the .md beside
    it, judges its stored figures again (card_report.Card.judged, bound_line), and is read here instead."""
    record = json.loads(path.read_text()) if path.suffix == ".json" else None
    if record is not None and path.parent.name == "cards":
        record = {k: v for k, v in record.items() if k not in ("verdicts",)}
        record["bench"] = {k: v for k, v in record.get("bench", {}).items() if k != "verdict"}
    texts = _strings(record) if record is not None else [path.read_text()]
    return [c for t in texts for line in t.splitlines() for c in contradictions(line, cpu=False)]


def test_the_checker_catches_what_a_learner_met():
    """The lines of the issue, each contradicted by the rule; today's verdicts for the same figures, each not."""
    assert contradictions("reduce_overhead | 52,537 | x1.96, within noise of compile", False)
    assert contradictions("bf16 14,151 img/s here, 22,039 there: x0.64, within noise", False)
    assert contradictions("input-bound in bursts: FULL 15,273 (-56%/+37%) < SYNTHETIC 20,673 (-13%/+20%) img/s", False)
    assert contradictions("| 4 | 0.941 (0.77-1.06) | above 4 x one GPU |", False)
    assert contradictions("host/launch-bound: FULL 357 (±5%) is 11% below SYNTHETIC", cpu=True)
    assert contradictions("measurement disagrees: FULL/IO x0.98 (0.90-1.05)", False)
    assert not contradictions("x1.96 (1.56-2.47), faster than compile", False)
    assert not contradictions("x1.02 (0.98-1.07), within noise of fp32", False)
    assert not contradictions("x1.09 (0.99-1.20), not settled against bf16: 80 more steps would decide", False)
    assert not contradictions("input-bound in bursts: FULL/SYNTHETIC x0.65 (0.46-0.92)", False)
    assert not contradictions("input-bound: FULL 9,100 (±5%) ≈ IO 9,300 (±5%) < SYNTHETIC 41,000 (±5%) img/s", False)
    assert contradictions("x1.02 (1.01-1.03), slower", False) and contradictions("x0.90 (0.85-0.95), faster", False)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.stem[:2] for n in NOTEBOOKS])
def test_no_printed_comparison_contradicts_the_rule(notebook):
    found = notebook_contradictions(notebook)
    assert not found, f"{notebook.name}: " + "; ".join(found[:8]) + (f" (+{len(found) - 8})" if len(found) > 8 else "")


@pytest.mark.parametrize("path", sorted(p for p in REFERENCE.rglob("*") if p.suffix in (".json", ".md")),
                         ids=lambda p: p.name)
def test_no_reference_file_says_what_the_rule_contradicts(path):
    found = reference_contradictions(path)
    assert not found, f"{path.name}: " + "; ".join(found[:8])
