"""`imagefolder`: the shapes images as PNG files in torchvision's ImageFolder layout, so that loading
them costs what loading real image files costs (open, read, decode), not a slice of an array.

    data/imagefolder/train/<k>_<shape>/<index>.png     50,000 images (the shapes set of seed 0)
    data/imagefolder/val/<k>_<shape>/<index>.png       10,000 images (seed 1)
    data/imagefolder/manifest.json                     how many were written

`make data` (or `python -m tutorial_lib data fetch imagefolder`) writes them offline. The pixels equal
those of `dataset=shapes seed=0`; PNG is lossless, so only the cost of reading them differs.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .config import DataNotFound, TrainConfig, UserError, mp_context, usable_cpus
from .pools import stoppable_pool
from .shapes import SHAPE_NAMES, make_shapes

SIZES = {"train": 50_000, "val": 10_000}
FETCH = "python -m tutorial_lib data fetch imagefolder"


def class_dirs() -> list[str]:
    return [f"{k}_{name}" for k, name in enumerate(SHAPE_NAMES)]  # sorted order = label order


def write_imagefolder(root: str | os.PathLike, train_size: int = SIZES["train"], val_size: int = SIZES["val"],
                      processes: int | None = None) -> Path:
    """Write the PNG files under `root` (train/ and val/), all or nothing: a half-written set never
    looks staged. Returns `root`."""
    root = Path(root)
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    for split, n, seed in (("train", train_size, 0), ("val", val_size, 1)):
        images, labels = make_shapes(n, seed=seed)
        for d in class_dirs():
            (tmp / split / d).mkdir(parents=True, exist_ok=True)
        jobs = [(str(tmp / split), images[i:i + 2048], labels[i:i + 2048], i) for i in range(0, n, 2048)]
        _map(_write_chunk, jobs, processes)
    (tmp / "manifest.json").write_text(json.dumps({"train": train_size, "val": val_size, "format": "png"}))
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return root


def _write_chunk(job) -> None:
    folder, images, labels, start = job
    names = class_dirs()
    for i, (img, label) in enumerate(zip(images, labels)):
        Image.fromarray(img).save(f"{folder}/{names[label]}/{start + i:05d}.png")


def _map(fn, jobs, processes: int | None) -> None:
    processes = processes or min(8, usable_cpus())
    if processes <= 1 or len(jobs) == 1:
        for job in jobs:
            fn(job)
        return
    with stoppable_pool(processes, mp_context().get_start_method()) as pool:
        pool.map(fn, jobs)


def _visible(path: Path) -> bool:
    """Not a hidden file: .DS_Store and ._name files from macOS, .ipynb_checkpoints."""
    return not path.name.startswith(".")


class ImageFolderImages:
    """Image files in class folders (torchvision's ImageFolder layout) -> (C, H, W) uint8 tensor, label.

    Each access opens and decodes a file with PIL, like a real input pipeline. The samples are ordered
    round-robin over the classes, so that `train_size` takes a balanced subset of any such folder."""

    def __init__(self, folder: Path):
        if not folder.is_dir():
            raise DataNotFound(f"{str(folder)!r} does not exist: the {folder.name!r} split is missing; stage the "
                               f"dataset again (`{FETCH}`), or give eval=false to train without validation")
        classes = sorted(d.name for d in folder.iterdir() if d.is_dir() and _visible(d))
        per_class = [sorted(p for p in (folder / c).iterdir() if p.is_file() and _visible(p)) for c in classes]
        self.classes = classes
        self.samples = [(str(files[r]), k)
                        for r in range(max(map(len, per_class), default=0))
                        for k, files in enumerate(per_class) if r < len(files)]
        if not self.samples:
            raise DataNotFound(f"{str(folder)!r} holds no images in class folders; stage it again (`{FETCH}`)")
        self.size = self._open(self.samples[0][0]).size  # every image must have the first one's size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        img = self._open(path)
        if img.size != self.size:
            raise UserError(f"image {path} is {img.size[0]}x{img.size[1]} pixels, not {self.size[0]}x{self.size[1]} "
                            "like the others: resize it or remove it")
        return torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1), label

    @staticmethod
    def _open(path: str):
        """The image at `path` as RGB, decoded; a one-line error naming the file when it can't be."""
        try:
            with Image.open(path) as img:
                return img.convert("RGB")
        except (OSError, SyntaxError, ValueError) as e:  # PIL: UnidentifiedImageError, truncated file, ...
            raise UserError(f"image {path} can't be read ({e}): a truncated or non-image file; remove it or "
                            f"stage the dataset again (`{FETCH}`)") from None


def imagefolder_dataset(cfg: TrainConfig, split: str) -> ImageFolderImages:
    """The `imagefolder` split ('train' or 'val') in cfg.data_dir; an error naming the command if missing."""
    root = Path(cfg.data_dir) / "imagefolder"
    fetch = FETCH if Path(cfg.data_dir) == Path("data") else f"{FETCH} --data-dir {cfg.data_dir}"
    if not (root / "manifest.json").is_file():
        raise DataNotFound(f"dataset 'imagefolder' is not staged in {cfg.data_dir!r}; run `{fetch}` "
                           "(or `make data`): it writes 60,000 PNG files, offline, in about a minute")
    ds = ImageFolderImages(root / split)
    wanted = cfg.train_size if split == "train" else cfg.val_size
    if wanted is not None and wanted > len(ds):
        key = "train_size" if split == "train" else "val_size"
        raise DataNotFound(f"{key}={wanted} but {str(root / split)!r} holds {len(ds)} images; lower {key}, "
                           f"or run `{fetch}` to write the full set")
    return ds
