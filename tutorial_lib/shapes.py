"""`shapes`: a learnable image dataset generated from a seed (numpy only), so every notebook, test and job
has data without a download: ten shape classes on noisy backgrounds, 32x32 RGB, uint8.

`data` serves it from memory (dataset=shapes); `imagefolder` writes it as PNG files (dataset=imagefolder).
`shapes_hard` (dataset=shapes_hard) draws the same ten classes smaller, fainter and noisier, among two faint
distractor shapes. `shapes_faint` (dataset=shapes_faint) is shapes_hard with the labelled shape's contrast drawn
from a continuum, from plain down to below the noise: a network learns the plain ones first and fainter ones as
it sees more images, so accuracy keeps rising slowly towards a ceiling below 100% (notebook 06: the race to a
target accuracy, which needs a target that one GPU reaches after a minute, well below the set's ceiling).
"""
from __future__ import annotations

import functools
import multiprocessing
import os

import numpy as np

from .pools import stoppable_pool

SHAPE_NAMES = ("disk", "square", "diamond", "ring", "plus", "cross", "hbar", "vbar", "triangle", "frame")


PARALLEL_FROM = 200_000  # images: sets this large are drawn by several processes (a race's million: seconds, not minutes)


def make_shapes(n: int, seed: int, size: int = 32, chunk: int = 4096,
                hard: bool = False, faint: bool = False, workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`n` images (n, size, size, 3) uint8 of ten shape classes on noisy backgrounds, and their labels
    (hard=True: the shapes_hard set; faint=True: shapes_faint).

    Deterministic from `seed`; the first k images are the same whatever `n` is (chunks have their own seeds),
    and whatever `workers` draws them (default: one below PARALLEL_FROM images, else this process's share of the
    CPUs). (Notebook 00 teaches it.)
    """
    try:  # the whole set first: one too large for memory fails here, before any process is forked
        images, labels = np.empty((n, size, size, 3), np.uint8), np.empty(n, np.int64)
    except ValueError as e:  # larger than numpy can index
        raise MemoryError(f"{n} images of {size}x{size}: {e}") from None
    draw = functools.partial(_chunk, n=n, seed=seed, size=size, chunk=chunk, hard=hard, faint=faint)
    starts = range(0, n, chunk)
    workers = min(len(starts), _cpu_share() if workers is None and n >= PARALLEL_FROM else workers or 1)
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        with stoppable_pool(workers, "fork") as pool:  # numpy only: safe to fork
            _fill(images, labels, starts, pool.imap(draw, starts), chunk)
    else:
        _fill(images, labels, starts, map(draw, starts), chunk)
    return images, labels


def _fill(images: np.ndarray, labels: np.ndarray, starts, parts, chunk: int) -> None:
    for start, (x, y) in zip(starts, parts):
        images[start:start + chunk], labels[start:start + chunk] = x, y


def _chunk(start: int, n: int, seed: int, size: int, chunk: int, hard: bool, faint: bool):
    rng = np.random.default_rng([seed, start // chunk, *([7] if hard else [11] if faint else [])])
    x, y = (_hard_chunk if hard else _faint_chunk if faint else _shape_chunk)(rng, chunk, size)
    m = min(chunk, n - start)
    return x[:m], y[:m]


def _cpu_share() -> int:
    """The CPUs this process may use, shared with the other ranks on its node (torchrun's LOCAL_WORLD_SIZE)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(32, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))))


def _shape_chunk(rng: np.random.Generator, m: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, 10, m)
    r = rng.uniform(0.22, 0.42, (m, 1, 1)) * size
    cx = rng.uniform(0.35, 0.65, (m, 1, 1)) * size
    cy = rng.uniform(0.35, 0.65, (m, 1, 1)) * size
    masks = _masks(y, r, cx, cy, size)
    bg = rng.uniform(0, 255, (m, 1, 1, 3))
    fg = (bg + rng.choice([-1, 1], (m, 1, 1, 1)) * rng.uniform(70, 150, (m, 1, 1, 3))) % 256
    img = np.where(masks[..., None], fg, bg) + rng.normal(0, 18, (m, size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8), y.astype(np.int64)


def _hard_chunk(rng: np.random.Generator, m: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Small shapes (radius 16-30% of the image, not 22-42%), about half the contrast, twice the noise, drawn
    over two fainter, smaller shapes of random classes (distractors)."""
    y = rng.integers(0, 10, m)
    img = np.broadcast_to(rng.uniform(0, 255, (m, 1, 1, 3)), (m, size, size, 3)).copy()
    for _ in range(2):  # distractors first, so the labelled shape lies on top
        _draw(img, rng, rng.integers(0, 10, m), (0.08, 0.15), (0.15, 0.85), (20, 50), size)
    _draw(img, rng, y, (0.16, 0.30), (0.3, 0.7), (40, 100), size)
    img += rng.normal(0, 36, (m, size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8), y.astype(np.int64)


FAINT_CONTRAST = (4.0, 100.0)  # shapes_faint: the labelled shape's contrast, log-uniform (noise: 36 per pixel)


def _faint_chunk(rng: np.random.Generator, m: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """shapes_hard's layout and noise, each image's contrast c log-uniform in FAINT_CONTRAST: the labelled shape
    at 0.8-1.2 c per channel, its two distractors at 0.3-0.6 c (fainter and smaller, as in shapes_hard)."""
    y = rng.integers(0, 10, m)
    c = np.exp(rng.uniform(*np.log(FAINT_CONTRAST), (m, 1, 1, 1)))
    img = np.broadcast_to(rng.uniform(0, 255, (m, 1, 1, 3)), (m, size, size, 3)).copy()
    for _ in range(2):
        _draw(img, rng, rng.integers(0, 10, m), (0.08, 0.15), (0.15, 0.85), (0.3 * c, 0.6 * c), size)
    _draw(img, rng, y, (0.16, 0.30), (0.3, 0.7), (0.8 * c, 1.2 * c), size)
    img += rng.normal(0, 36, (m, size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8), y.astype(np.int64)


def _draw(img: np.ndarray, rng: np.random.Generator, y: np.ndarray, radius, centre, contrast, size: int) -> None:
    """Paint shapes of classes `y` into `img` in place, each in its background colour shifted by `contrast`."""
    m = len(y)
    r = rng.uniform(*radius, (m, 1, 1)) * size
    cx, cy = (rng.uniform(*centre, (m, 1, 1)) * size for _ in range(2))
    shift = rng.choice([-1, 1], (m, 1, 1, 1)) * rng.uniform(*contrast, (m, 1, 1, 3))
    fg = (img[:, :1, :1, :] + shift) % 256
    np.copyto(img, np.broadcast_to(fg, img.shape), where=_masks(y, r, cx, cy, size)[..., None])


def _masks(y: np.ndarray, r: np.ndarray, cx: np.ndarray, cy: np.ndarray, size: int) -> np.ndarray:
    """(m, size, size) bool: the shape of class y[i] with radius r[i] centred at (cx[i], cy[i])."""
    grid = np.arange(size, dtype=np.float32) + 0.5
    out = np.empty((len(y), size, size), dtype=bool)
    for c in np.unique(y):  # each class's formula only on its own images
        i = y == c
        out[i] = _mask(int(c), grid[None, None, :] - cx[i], grid[None, :, None] - cy[i], r[i])
    return out


def _mask(c: int, dx: np.ndarray, dy: np.ndarray, r: np.ndarray) -> np.ndarray:
    ax, ay = np.abs(dx), np.abs(dy)
    dist, box, t = np.sqrt(dx**2 + dy**2), np.maximum(ax, ay), r / 3
    return [
        lambda: dist < r,                                            # disk
        lambda: box < r * 0.85,                                      # square
        lambda: ax + ay < r,                                         # diamond
        lambda: (dist < r) & (dist > r * 0.55),                      # ring
        lambda: ((ax < t) & (ay < r)) | ((ay < t) & (ax < r)),       # plus
        lambda: (np.abs(ax - ay) < t * 0.8) & (box < r * 0.85),      # cross (x)
        lambda: (ay < t) & (ax < r),                                 # horizontal bar
        lambda: (ax < t) & (ay < r),                                 # vertical bar
        lambda: (dy < r * 0.7) & (dy > -r * 0.7) & (ax < (dy + r * 0.7) * 0.6),  # triangle
        lambda: (box < r * 0.85) & (box > r * 0.5),                  # frame
    ][c]()


@functools.lru_cache(maxsize=2)
def cached_shapes(n: int, seed: int, hard: bool = False, faint: bool = False) -> tuple[np.ndarray, np.ndarray]:
    # a train and a val split kept: runs after the first in a process (a notebook, a bench) skip seconds of
    # generating; nothing writes into these arrays (augmentation makes new tensors)
    return make_shapes(n, seed, hard=hard, faint=faint)
