"""Interval arithmetic on (start, end) pairs in microseconds, for trace_summary: the union of overlapping
busy periods, clipping to a step, subtracting one set from another. Plain Python, no torch."""
from __future__ import annotations

import bisect


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, non-overlapping (start, end) pairs covering the same time as `intervals`."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        elif e > s:
            out.append([s, e])
    return [(s, e) for s, e in out]


def clip(merged: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The part of a union() result inside [start, end]."""
    i = max(0, bisect.bisect_right(merged, (start, float("inf"))) - 1)
    out = []
    for s, e in merged[i:]:
        if s >= end:
            break
        if e > start:
            out.append((max(s, start), min(e, end)))
    return out


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """a minus b, both union() results."""
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k, cur = j, s
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def partition(window: tuple[float, float], ordered: list[tuple[str, list]]) -> dict[str, float]:
    """Cut `window` into parts: each instant goes to the first (part, union) in `ordered` that covers it,
    the rest to "idle". Returns part -> microseconds (every part of `ordered`, then idle); they add up to the window."""
    start, end = window
    taken: list[tuple[float, float]] = []
    parts = {part: 0.0 for part, _ in ordered} | {"idle": 0.0}
    for part, merged in ordered:
        new = subtract(clip(merged, start, end), taken)
        parts[part] += length(new)
        taken = union(taken + new)
    parts["idle"] += length(subtract([(start, end)], taken))
    return parts


def covers(merged: list[tuple[float, float]], t: float) -> bool:
    i = bisect.bisect_right(merged, (t, float("inf"))) - 1
    return i >= 0 and merged[i][0] <= t < merged[i][1]
