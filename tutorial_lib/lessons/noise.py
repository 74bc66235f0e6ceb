"""When is a difference real? The one rule of the workbook (notebook 03 teaches it, 04 and the bench apply it):
every figure comes with the spread of what it was measured from (the slowest and fastest window of a bench
figure, the p10 and p90 step of a training run), and two figures differ only when those bands do not overlap.
A difference smaller than the spread is noise, whatever its sign: the verdict then says "within noise" and
ranks nothing. Torch-free, so a login node can judge reference files.
"""
from __future__ import annotations

from dataclasses import dataclass

# No band is narrower than this fraction on either side: two runs of the same code in two processes differ by a
# few percent even where the steps of one run agree to the microsecond (warm caches, clocks, the allocator).
FLOOR = 0.05


@dataclass(frozen=True)
class Figure:
    """A rate (higher is better: img/s) with the band it was measured in."""
    value: float
    low: float
    high: float

    @classmethod
    def of(cls, value: float, low: float | None = None, high: float | None = None, floor: float = FLOOR) -> "Figure":
        """`value` with its measured band [low, high], widened to at least +-floor of the value."""
        low = value if low is None else low
        high = value if high is None else high
        return cls(value, min(low, value, value * (1 - floor)), max(high, value, value * (1 + floor)))

    @property
    def spread(self) -> float:
        """Half the band, as a fraction of the value (what "±" prints)."""
        return (self.high - self.low) / 2 / self.value if self.value else 0.0


def relation(a: Figure, b: Figure) -> str:
    """'<', '≈' or '>': a below, within noise of, or above b (≈ whenever the two bands overlap)."""
    if a.high < b.low:
        return "<"
    if a.low > b.high:
        return ">"
    return "≈"


def versus(a: Figure, b: Figure) -> str:
    """The ratio a/b and its verdict, e.g. 'x2.14, faster' or 'x1.07, within noise'."""
    rel = relation(a, b)
    words = {"<": "slower", ">": "faster", "≈": "within noise"}[rel]
    return f"x{a.value / b.value:.2f}, {words}"


def shown(f: Figure, wide: str = "band", spec: str = ",.1f") -> str:
    """A figure and its band as it is, the side below and the side above: '1,244.6 (±5%)' when the two round to the
    same percent, '5,523.2 (-5%/+15%)' when not; a band wider than the figure itself as its range, named `wide`
    ('windows' for a bench figure). `spec` formats the figure (the bench prints whole img/s: ',.0f')."""
    below, above = 100 * (1 - f.low / f.value), 100 * (f.high / f.value - 1)
    if f.spread >= 1:
        return f"{f.value:{spec}} ({wide} {f.low:,.0f} to {f.high:,.0f})"
    if round(below) == round(above):
        return f"{f.value:{spec}} (±{below:.0f}%)"
    return f"{f.value:{spec}} (-{below:.0f}%/+{above:.0f}%)"


def step_band(img_s: float, median_ms: float, p10_ms: float, p90_ms: float, floor: float = FLOOR) -> Figure:
    """A training run's img/s (images over the total timed time) with the spread of its steps: the p90 and p10
    step relative to the median, applied to the figure. Per-step spread is wider than a window's, so the band
    errs on the side of "within noise"; a run whose steps now and then wait long gets a wide band."""
    return Figure.of(img_s, img_s * median_ms / p90_ms, img_s * median_ms / p10_ms, floor)


def spread_of(values: list[float], floor: float = FLOOR) -> Figure:
    """Repeated measurements of one thing (seeds, pairs of runs): their median with the band min..max."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return Figure.of(median, ordered[0], ordered[-1], floor)
