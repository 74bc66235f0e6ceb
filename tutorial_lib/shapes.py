"""`shapes`: a learnable image dataset generated from a seed (numpy only), so every notebook, test and job
has data without a download: ten shape classes on noisy backgrounds, 32x32 RGB, uint8.

`data` serves it from memory (dataset=shapes); `imagefolder` writes it as PNG files (dataset=imagefolder).
"""
from __future__ import annotations

import functools

import numpy as np

SHAPE_NAMES = ("disk", "square", "diamond", "ring", "plus", "cross", "hbar", "vbar", "triangle", "frame")


def make_shapes(n: int, seed: int, size: int = 32, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """`n` images (n, size, size, 3) uint8 of ten shape classes on noisy backgrounds, and their labels.

    Deterministic from `seed`; the first k images are the same whatever `n` is (chunks have their own seeds).
    (Notebook 00 teaches it.)
    """
    images, labels = [], []
    for start in range(0, n, chunk):
        rng = np.random.default_rng([seed, start // chunk])
        m = min(chunk, n - start)
        x, y = _shape_chunk(rng, chunk, size)
        images.append(x[:m])
        labels.append(y[:m])
    return np.concatenate(images), np.concatenate(labels)


def _shape_chunk(rng: np.random.Generator, m: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, 10, m)
    r = rng.uniform(0.22, 0.42, (m, 1, 1)) * size
    cx = rng.uniform(0.35, 0.65, (m, 1, 1)) * size
    cy = rng.uniform(0.35, 0.65, (m, 1, 1)) * size
    grid = np.arange(size, dtype=np.float32) + 0.5
    dx, dy = grid[None, None, :] - cx, grid[None, :, None] - cy
    ax, ay, dist, box = np.abs(dx), np.abs(dy), np.sqrt(dx**2 + dy**2), np.maximum(np.abs(dx), np.abs(dy))
    t = r / 3
    masks = np.stack([
        dist < r,                                            # disk
        box < r * 0.85,                                      # square
        ax + ay < r,                                         # diamond
        (dist < r) & (dist > r * 0.55),                      # ring
        ((ax < t) & (ay < r)) | ((ay < t) & (ax < r)),       # plus
        (np.abs(ax - ay) < t * 0.8) & (box < r * 0.85),      # cross (x)
        (ay < t) & (ax < r),                                 # horizontal bar
        (ax < t) & (ay < r),                                 # vertical bar
        (dy < r * 0.7) & (dy > -r * 0.7) & (ax < (dy + r * 0.7) * 0.6),  # triangle
        (box < r * 0.85) & (box > r * 0.5),                  # frame
    ])[y, np.arange(m)]
    bg = rng.uniform(0, 255, (m, 1, 1, 3))
    fg = (bg + rng.choice([-1, 1], (m, 1, 1, 1)) * rng.uniform(70, 150, (m, 1, 1, 3))) % 256
    img = np.where(masks[..., None], fg, bg) + rng.normal(0, 18, (m, size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8), y.astype(np.int64)


@functools.lru_cache(maxsize=2)
def cached_shapes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # a train and a val split kept: runs after the first in a process (a notebook, a bench) skip seconds of
    # generating; nothing writes into these arrays (augmentation makes new tensors)
    return make_shapes(n, seed)
