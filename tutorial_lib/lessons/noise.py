"""When do two figures differ? The one rule of the workbook (notebook 03 states it, 04, 05, 06 and the bench
apply it). Torch-free, so a login node can judge reference files.

A figure is an estimate of a mean rate (img/s: images over time). Its uncertainty is that of the mean, from
independent samples of it: the windows of a bench measure, blocks of steps of a training run, repeated runs.
Not the spread of single steps: a few slow steps widen the spread but move the mean little.

The rule: the ratio of two figures has a 95% interval (a t-interval on the log scale, the two figures'
standard errors added). They differ when that interval excludes 1; where they come from separate processes,
also by more than FLOOR (two runs of the same code in two processes differ by a few percent: clocks, caches,
the allocator). They are equal ("within noise") when they do not differ and the interval is no wider than
±FLOOR. Otherwise the measurement is too short to tell: "not settled", and `more` says how many more samples
would decide. Spread (steady or bursty) is a property of a figure (`Figure.spread`), never the judge.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

FLOOR = 0.05  # the cross-process floor, and the width under which two figures are called equal
BLOCK = 10  # steps per block where a record keeps only step percentiles (each block one sample of the mean)
# t quantiles (two-sided 95%) for 1..30 degrees of freedom; beyond 30 the normal approximation below
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# expected range of n normal samples in standard deviations (n = 2..20): the spread of a record that kept only
# its slowest and fastest window gives the standard deviation of its windows as range / _D2[n]
_D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847, 9: 2.970, 10: 3.078, 11: 3.173,
       12: 3.258, 13: 3.336, 14: 3.407, 15: 3.472, 16: 3.532, 17: 3.588, 18: 3.640, 19: 3.689, 20: 3.735}


def t95(dof: float) -> float:
    """The two-sided 95% quantile of Student's t with `dof` degrees of freedom."""
    if dof <= 0:
        return float("inf")
    if dof <= 30:
        return _T95[max(0, math.floor(dof) - 1)]
    return 1.960 + 2.4 / dof  # within 0.01 of the exact value beyond 30


@dataclass(frozen=True)
class Figure:
    """A mean rate (higher is better: img/s) with the standard error of that mean, relative and on the log scale
    (`se`, from `n` samples, `n - 1` degrees of freedom); se=0 with n=1: a single figure whose uncertainty is
    not known (only the cross-process floor judges it). `spread`: the slowest and fastest sample (window, step),
    a property of the figure (steady or bursty), not its uncertainty."""
    value: float
    se: float = 0.0
    n: int = 1
    spread: tuple | None = None
    unit: str = "windows"  # what a sample is: "windows", "steps", "runs"

    @property
    def half(self) -> float:
        """Half the 95% interval of the mean, on the log scale (0 for a single figure)."""
        return t95(self.n - 1) * self.se if self.se else 0.0

    @property
    def low(self) -> float:
        return self.value * math.exp(-self.half)

    @property
    def high(self) -> float:
        return self.value * math.exp(self.half)

    @classmethod
    def of(cls, value: float) -> "Figure":
        """A single figure: no samples, so no interval of its own."""
        return cls(float(value))


def of_windows(rates: list[float], value: float | None = None, unit: str = "windows") -> Figure:
    """A figure from the rates of equal windows (each the same number of steps): the mean rate is the windows'
    images over their time, so the mean of their times is the estimate; its standard error over the mean time is
    the figure's. `value`: the figure as measured (images over all timed time), when it is known."""
    rates = [r for r in rates if r and r > 0]
    if not rates:
        raise ValueError("of_windows: no window with a positive rate")
    times = [1 / r for r in rates]
    mean = statistics.fmean(times)
    se = statistics.stdev(times) / mean / math.sqrt(len(times)) if len(times) > 1 else 0.0
    return Figure(value if value is not None else 1 / mean, se, len(times), (min(rates), max(rates)), unit)


def of_range(value: float, low: float, high: float, n: int) -> Figure:
    """A figure from a record that kept only its slowest (`low`) and fastest (`high`) of `n` windows: their
    standard deviation estimated from the range (range / d2(n), as control charts do), on the time scale."""
    if n < 2 or not low or not high:
        return Figure(value, 0.0, 1, (low, high))
    sd = (1 / low - 1 / high) / _D2[min(n, 20)] * value  # relative to the mean time 1/value
    return Figure(value, sd / math.sqrt(n), n, (low, high))


def of_steps(img_s: float, median_ms: float, p10_ms: float, p90_ms: float, steps: int,
             blocks_ms: list | None = None, batch: int | None = None) -> Figure:
    """A training run's img/s. With `blocks_ms` (the mean step of each block of BLOCK steps, which runs record):
    the mean of the blocks. A record with only step percentiles: the steps' standard deviation from p10-p90
    (2.563 standard deviations apart in a normal law) over steps // BLOCK blocks, each counted as one sample
    (no credit for averaging within a block: wide on purpose; a run shorter than two blocks counts its steps),
    relative to the mean step (1000 x `batch` /
    img_s; the median step where the batch is not given). The spread: the p90 and p10 step as rates."""
    spread = (img_s * median_ms / p90_ms, img_s * median_ms / p10_ms) if p10_ms and p90_ms else None
    if blocks_ms and len(blocks_ms) > 1:
        f = of_windows([1 / b for b in blocks_ms if b], img_s, "steps")
        return Figure(f.value, f.se, f.n, spread, f.unit)
    steps = steps or 0
    blocks = steps // BLOCK if steps >= 2 * BLOCK else steps  # a short run: each step a sample
    if blocks < 2 or not p10_ms or not p90_ms or not img_s:
        return Figure(img_s, 0.0, 1, spread, "steps")
    mean_ms = min(1000 * batch / img_s, median_ms) if batch else median_ms  # the smaller: the wider interval
    sd = (p90_ms - p10_ms) / 2.563
    return Figure(img_s, sd / mean_ms / math.sqrt(blocks), blocks, spread, "steps")


def of_runs(values: list[float], unit: str = "runs") -> Figure:
    """Repeated measurements of one thing (seeds, pairs of runs): their mean, and the standard error of it."""
    values = [float(v) for v in values]
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / abs(mean) / math.sqrt(len(values)) if len(values) > 1 and mean else 0.0
    return Figure(mean, se, len(values), (min(values), max(values)), unit)


@dataclass(frozen=True)
class Ratio:
    """a / b with its 95% interval, and the rule's verdict: 'higher', 'lower', 'equal' or 'not settled'."""
    value: float
    low: float
    high: float
    verdict: str
    more: int | None = None  # samples of each figure that would decide, where not settled
    unit: str = "windows"

    @property
    def sign(self) -> str:
        return {"higher": ">", "lower": "<", "equal": "≈"}.get(self.verdict, "?")

    def __str__(self) -> str:
        """'x1.96 (1.63-2.36)'; a ratio without an interval of its own: 'x1.96'."""
        if self.low == self.high == self.value:
            return f"x{self.value:.{max(2, 1 - math.floor(math.log10(self.value))) if self.value > 0 else 2}f}"
        first = max(2, 1 - math.floor(math.log10(self.value))) if self.value > 0 else 2  # 2 significant digits
        for digits in (first, first + 1, first + 2):  # the ends rounded inward: the printed interval excludes 1
            scale = 10 ** digits  # when this one does
            lo, hi = math.ceil(self.low * scale - 1e-9) / scale, math.floor(self.high * scale + 1e-9) / scale
            if lo <= hi and (self.verdict != "higher" or lo > 1) and (self.verdict != "lower" or hi < 1):
                break
        return f"x{self.value:.{first}f} ({lo:.{digits}f}-{hi:.{digits}f})"

    def words(self, up: str = "faster", down: str = "slower") -> str:
        """The verdict in words: `up`, `down`, 'within noise' or 'not settled: N more windows would decide'."""
        if self.verdict == "not settled":
            n, unit = (self.more * BLOCK, "steps") if self.unit == "steps" else (self.more, self.unit)  # about
            more = f": {n:,} more {unit} would decide" if self.more else ""
            return f"not settled{more}"
        return {"higher": up, "lower": down, "equal": "within noise"}[self.verdict]


def compare(a: Figure, b: Figure, separate: bool = True) -> Ratio:
    """a against b by the rule (module docstring). `separate`: the two come from separate processes (two runs),
    so the cross-process FLOOR applies; False for measures of one process (the bench's IO, SYNTHETIC, FULL).
    A single figure (no interval of its own) is always judged with the floor."""
    d = math.log(a.value / b.value)
    se = math.hypot(a.se, b.se)
    dof = _welch(a, b)
    h = t95(dof) * se if se else 0.0
    separate = separate or not (a.se and b.se)  # a single figure's uncertainty is unknown: the floor judges it
    floor, margin = (math.log1p(FLOOR) if separate else 0.0), math.log1p(FLOOR)
    if abs(d) > max(h, floor):
        verdict, more = ("higher" if d > 0 else "lower"), None
    elif h <= margin:
        verdict, more = "equal", None
    else:
        verdict, more = "not settled", _more(a, b, h, abs(d), margin)
    r = math.exp(d)
    unit = a.unit if a.se >= b.se else b.unit
    return Ratio(r, r * math.exp(-h), r * math.exp(h), verdict, more, unit)


def _welch(a: Figure, b: Figure) -> float:
    """Welch-Satterthwaite degrees of freedom of the ratio's standard error."""
    parts = [(f.se ** 2, f.n - 1) for f in (a, b) if f.se]
    if not parts:
        return math.inf
    num = sum(v for v, _ in parts) ** 2
    den = sum(v ** 2 / k for v, k in parts if k > 0)
    return num / den if den else math.inf


def _more(a: Figure, b: Figure, h: float, d: float, margin: float) -> int | None:
    """Samples of each figure to add so that the interval shrinks to decide: below `d` (they differ) when the
    difference is beyond the margin, else to the margin (they are equal); the difference assumed to stay."""
    n = max(a.n, b.n)
    if n < 2:
        return None
    target = margin if d <= margin else d * 0.9
    return max(1, math.ceil(n * (h / target) ** 2) - n)


def versus(a: Figure, b: Figure, separate: bool = True, up: str = "faster", down: str = "slower") -> str:
    """The ratio a/b, its interval and the verdict: 'x1.96 (1.63-2.36), faster', 'x1.02 (0.97-1.07), within
    noise', 'x1.10 (0.85-1.42), not settled: 12 more windows each would decide'."""
    r = compare(a, b, separate)
    return f"{r}, {r.words(up, down)}"


def relation(a: Figure, b: Figure, separate: bool = True) -> str:
    """'<', '>' or '≈' where the rule decides, '?' where it can't yet (not settled)."""
    return compare(a, b, separate).sign


def shown(f: Figure, spec: str = ",.0f") -> str:
    """A figure and the 95% interval of its mean, the one notation of the workbook: '52,537 ±2%'
    (a single figure: its value alone; an interval of ±100% or more: 'unsettled', with its count)."""
    if not f.half:
        return f"{f.value:{spec}}"
    pct = 100 * (math.exp(f.half) - 1)
    if pct >= 100:  # an interval wider than the figure itself: '±1213070%' would say nothing a learner can read
        return f"{f.value:{spec}} (unsettled: {f.n} {f.unit} vary too much to bound it)"
    digits = 0 if pct >= 1 else 1 if pct >= 0.1 else 2
    return f"{f.value:{spec}} ±{pct:.{digits}f}%"


def spread_shown(f: Figure, spec: str = ",.0f") -> str:
    """The spread of a figure's samples, named as such: 'windows 5,075-7,489'."""
    if not f.spread:
        return ""
    low, high = f.spread
    return f"{f.unit} {low:{spec}}-{high:{spec}}"
