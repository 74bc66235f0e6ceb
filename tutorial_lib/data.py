"""Datasets by name, augmentation and DataLoader construction.

Every loader yields uint8 image batches (N, C, H, W) and int64 labels. Conversion to float and
normalisation happen on the device (`normalize`), so the host-to-device copy moves 4x fewer bytes.

Augmentation is deterministic from (seed, epoch, sample index), whichever worker draws it, so a run
resumed from a checkpoint sees exactly the images the uninterrupted run would have seen.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import math
import multiprocessing.util
import signal
import weakref
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from .checkpoint import STOP_SIGNALS
from .config import DataNotFound, TrainConfig, UserError, mp_context
from .distributed import DistEnv, pick_device
from .imagefolder import imagefolder_dataset, write_imagefolder
from .results import make_folder
from .shapes import cached_shapes

# name -> (channels, size, classes, mean, std)
SPECS = {
    "shapes": (3, 32, 10, (0.45, 0.45, 0.45), (0.25, 0.25, 0.25)),
    "shapes_hard": (3, 32, 10, (0.5, 0.5, 0.5), (0.3, 0.3, 0.3)),
    "shapes_faint": (3, 32, 10, (0.5, 0.5, 0.5), (0.3, 0.3, 0.3)),
    "imagefolder": (3, 32, 10, (0.45, 0.45, 0.45), (0.25, 0.25, 0.25)),
    "cifar10": (3, 32, 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": (3, 32, 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": (1, 28, 10, (0.1307,), (0.3081,)),
}
TORCHVISION = {"cifar10": "CIFAR10", "cifar100": "CIFAR100", "mnist": "MNIST"}


def num_classes(dataset: str) -> int:
    return SPECS[dataset][2]


# ---------------------------------------------------------------------------- augmentation
def crop_flip(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Random crop with zero padding, then horizontal flip, for a batch (N, C, H, W) on any device.

    `offsets` (N, 2) holds each sample's (top, left) in [0, 2*pad]; `flips` (N,) bools. The CPU loader and
    the GPU-side augmentation both call this, so the same draws give the same pixels.
    (Notebook 03 teaches it.)
    """
    n, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad)).flatten(2)  # (N, C, (H+2p)*(W+2p))
    rows = offsets[:, 0, None] + torch.arange(h, device=x.device)  # (N, H)
    cols = offsets[:, 1, None] + torch.arange(w, device=x.device)  # (N, W)
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    where = (rows[:, :, None] * (w + 2 * pad) + cols[:, None, :]).flatten(1)  # (N, H*W) positions in padded
    # one gather: multi-tensor advanced indexing is slower, and on a busy CPU pathologically so
    return padded.gather(2, where[:, None, :].expand(n, c, h * w)).view(n, c, h, w)


def draw_augment(n: int, gen: torch.Generator, pad: int = 4, device: str | torch.device = "cpu"):
    """Random crop offsets and flips for n samples, drawn from `gen`. (Notebook 03 teaches it.)"""
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen, device=device)
    flips = torch.rand(n, generator=gen, device=device) < 0.5
    return offsets, flips


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 10_000_019 + index)


def normalize(x: torch.Tensor, dataset: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 (N, C, H, W) -> normalised float on x's device. (Notebook 01 teaches it.)"""
    mean, std = _mean_std(dataset, x.device, dtype)
    return (x.to(dtype) / 255 - mean) / std


@functools.lru_cache(maxsize=None)
def _mean_std(dataset: str, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # made once per device: building them from Python floats every step is a blocking host-to-device copy,
    # which stalls the GPU once per step
    _, _, _, mean, std = SPECS[dataset]
    return (torch.tensor(mean, dtype=dtype).view(1, -1, 1, 1).to(device),
            torch.tensor(std, dtype=dtype).view(1, -1, 1, 1).to(device))


# ---------------------------------------------------------------------------- datasets
class ImageDataset(Dataset):
    """Images as uint8 CHW tensors; indexed by (index, epoch) pairs from EpochSampler so augmentation
    is reproducible, or by a plain int (no augmentation)."""

    def __init__(self, base, augment: bool, seed: int, pad: int = 4):
        self.base, self.augment, self.seed, self.pad = base, augment, seed, pad

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key):
        index, epoch = key if isinstance(key, tuple) else (key, None)
        x, y = self.base[index]
        if self.augment and epoch is not None:
            offsets, flips = draw_augment(1, sample_generator(self.seed, epoch, index), self.pad)
            x = crop_flip(x[None], offsets, flips, self.pad)[0]
        return x, y


class ArrayImages:
    """(N, H, W, C) uint8 array + labels -> (C, H, W) uint8 tensor, label."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


class TorchvisionImages:
    """A torchvision dataset (PIL images) -> (C, H, W) uint8 tensor, label."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        img, label = self.ds[i]
        x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy())
        return (x[None] if x.ndim == 2 else x.permute(2, 0, 1)), int(label)


def base_dataset(cfg: TrainConfig, split: str):
    """The un-augmented images of a split ('train' or 'val') as an indexable of (uint8 CHW, label).
    (Notebook 03 teaches it.)"""
    if cfg.dataset in ("shapes", "shapes_hard", "shapes_faint"):
        n = (cfg.train_size or 50_000) if split == "train" else (cfg.val_size or 10_000)
        try:
            return ArrayImages(*cached_shapes(n, seed=2 * cfg.seed + (split == "val"),
                                              hard=cfg.dataset == "shapes_hard", faint=cfg.dataset == "shapes_faint"))
        except MemoryError:  # the set is made in memory: 3 KiB an image
            key = "train_size" if split == "train" else "val_size"
            raise UserError(f"{key}={n}: the {cfg.dataset} set of {n:,} images ({n * 3 * 32 * 32 / 2**30:,.1f} GiB) "
                            f"does not fit in this machine's memory; lower {key}") from None
    if Path(cfg.data_dir).exists() and not Path(cfg.data_dir).is_dir():  # not "stage the data into it"
        raise DataNotFound(f"data_dir={cfg.data_dir!r} is a file, not a folder; give the folder that holds the "
                           "staged datasets (the workbook's is data)")
    if cfg.dataset == "imagefolder":
        return imagefolder_dataset(cfg, split)
    return TorchvisionImages(torchvision_dataset(cfg.dataset, cfg.data_dir, train=(split == "train")))


def torchvision_dataset(name: str, data_dir: str, train: bool, download: bool = False):
    import torchvision  # about a second to import: only the staged datasets need it

    cls = getattr(torchvision.datasets, TORCHVISION[name])
    try:
        return cls(root=str(data_dir), train=train, download=download)
    except RuntimeError:  # torchvision: "Dataset not found or corrupted. You can use download=True"
        raise DataNotFound(f"dataset {name!r} is not staged in {str(data_dir)!r}; on a login node with internet run "
                           f"`make data` or `python -m tutorial_lib data fetch {name}`") from None


def fetch(name: str, data_dir: str = "data") -> Path:
    """Stage a dataset in data_dir: download a torchvision one (on a login node with internet), or write
    the imagefolder set of PNG files from the shapes generator (offline). (Notebook 00 teaches it.)"""
    if name in (*TORCHVISION, "imagefolder"):  # a folder that can't be made is not an internet problem
        make_folder(data_dir, f"data_dir={str(data_dir)!r}", "give a folder you can write (--data-dir)")
    if name == "imagefolder":
        return write_imagefolder(Path(data_dir) / "imagefolder")
    if name not in TORCHVISION:
        raise UserError(f"cannot fetch {name!r}: one of {', '.join([*TORCHVISION, 'imagefolder'])} "
                        "(shapes is generated in memory and needs no staging)")
    try:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        for train in (True, False):
            torchvision_dataset(name, data_dir, train=train, download=True)
    except OSError as e:  # URLError is an OSError: no internet, a proxy, DNS; or a data_dir not writable
        if isinstance(e, (PermissionError, FileExistsError, NotADirectoryError)):
            raise UserError(f"can't write {name!r} into data_dir={str(data_dir)!r} ({e.strerror}); give a folder "
                            "you can write (--data-dir)") from None
        raise UserError(f"could not download {name!r} ({getattr(e, 'reason', None) or e}): compute nodes often "
                        "have no internet; run `python -m tutorial_lib data fetch "
                        f"{name}` on a login node with internet, into a data_dir the jobs can read") from None
    return Path(data_dir)


def staged(data_dir: str = "data") -> dict[str, bool]:
    """Which datasets are present in data_dir (checked without loading them). (Notebook 00 teaches it.)"""
    marks = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "mnist": "MNIST/raw"}
    found = {name: (Path(data_dir) / mark).is_dir() for name, mark in marks.items()}
    found["imagefolder"] = (Path(data_dir) / "imagefolder" / "manifest.json").is_file()
    return found


def subset(base, limit: int | None):
    if limit is None or limit >= len(base):
        return base
    return Subset(base, range(limit))


# ---------------------------------------------------------------------------- loading
# scancel and a time limit without --signal send SIGTERM to every process of the job step, DataLoader workers
# included; a worker that died of it made the trainer fail ("DataLoader worker (pid N) is killed by signal")
# before it could write its checkpoint. The stop signals are for the trainer: it stops at a step boundary,
# checkpoints and then ends its workers itself, so every worker ignores them. The parent forks its workers with
# the signals blocked, so that one arriving before a worker's first line is held until the worker ignores it.
def worker_init(worker_id: int) -> None:
    """The first thing every DataLoader worker of the workbook runs: ignore the job's stop signals."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # one held since the fork is dropped


def _worker_init(worker_id: int) -> None:
    worker_init(worker_id)  # looked up when the worker runs (a test replaces worker_init)


@contextlib.contextmanager
def stop_signals_held():
    """The stop signals blocked in this thread while it forks workers (they inherit the mask); delivered here
    once the block ends."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signals to hold
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class WorkbookLoader(DataLoader):
    """A DataLoader whose workers ignore the job's stop signals (see worker_init)."""

    def __iter__(self):
        if getattr(self._iterator, "_shutdown", False):  # persistent workers ended early (end_workers): new ones
            self._iterator = None
        with stop_signals_held():  # iter() forks the workers (each epoch, unless persistent)
            it = super().__iter__()
        if self.num_workers:
            _with_workers.add(it)
        return it


# Workers that ignore SIGTERM also ignore the terminate() with which Python ends a process's remaining workers at
# exit, and that exit then waits for them forever: a run that failed part-way (an unreadable image) hung instead
# of ending with its error. So the workers are ended the way torch ends them at the end of an epoch: when a run's
# batches stop early (end_workers), and, for an iterator nobody closed, at exit, before multiprocessing's own exit
# handler (atexit runs the last registered first, and multiprocessing.util registered its handler on import).
_with_workers: weakref.WeakSet = weakref.WeakSet()


def end_workers(it) -> None:
    """End the worker processes of DataLoader iterator `it` now, as torch does after an epoch (a no-op for an
    iterator without workers or whose workers have ended)."""
    shutdown = getattr(it, "_shutdown_workers", None)  # torch's own orderly shutdown, idempotent
    if shutdown is not None:
        shutdown()


@atexit.register
def _end_workers_at_exit() -> None:
    for it in list(_with_workers):
        end_workers(it)


class EpochSampler(DistributedSampler):
    """DistributedSampler that yields (index, epoch) pairs and can start part-way into an epoch (resume)."""

    def __init__(self, dataset, num_replicas: int, rank: int, shuffle: bool, seed: int, drop_last: bool):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.start = 0

    def __iter__(self):
        indices = list(super().__iter__())[self.start:]
        return iter([(i, self.epoch) for i in indices])

    def __len__(self) -> int:
        return self.num_samples - self.start


def build_loader(cfg: TrainConfig, split: str, rank: int = 0, world_size: int = 1, batch_size: int | None = None,
                 pin_memory: bool | None = None) -> DataLoader:
    """A DataLoader for one rank. Every knob comes from the config; `batch_size` is per device.
    (Notebook 01 teaches it.)"""
    train = split == "train"
    base = subset(base_dataset(cfg, split), cfg.train_size if train else cfg.val_size)
    augment = train and cfg.augment and cfg.dataset != "mnist"  # flipped digits are other digits
    ds = ImageDataset(base, augment=augment, seed=cfg.seed)
    bs = batch_size or cfg.batch_size
    if train and len(ds) < bs * world_size:
        raise UserError(f"train_size={len(ds)} is smaller than one global batch ({bs} x {world_size} ranks); "
                        f"raise train_size or lower batch_size")
    sampler = EpochSampler(ds, world_size, rank, shuffle=train, seed=cfg.seed, drop_last=train)
    workers = cfg.workers()  # num_workers=auto: the workbook's rule (config.default_workers)
    return WorkbookLoader(
        ds, batch_size=bs, sampler=sampler, drop_last=train, num_workers=workers,
        pin_memory=(cfg.pin_memory and torch.cuda.is_available()) if pin_memory is None else pin_memory,
        persistent_workers=cfg.persistent_workers and workers > 0,
        prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
        multiprocessing_context=mp_context() if workers > 0 else None, worker_init_fn=_worker_init,
    )


def steps_per_epoch(loader: DataLoader) -> int:
    sampler = loader.sampler
    n = sampler.num_samples
    return n // loader.batch_size if loader.drop_last else math.ceil(n / loader.batch_size)


# ---------------------------------------------------------------------------- input pipelines
class LoaderInput:
    """A DataLoader as the engine sees it: `epoch(e, start_batch)` iterates one epoch's batches."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.steps_per_epoch = steps_per_epoch(loader)
        self.workers = loader.num_workers

    def epoch(self, epoch: int, start_batch: int = 0):
        self.loader.sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        self.loader.sampler.start = start_batch * self.loader.batch_size
        if forks_workers(self.loader) and torch.cuda.is_initialized():
            # Workers are forked copies of this process. Garbage that still holds CUDA memory (a reference
            # cycle, an old traceback in a notebook) would be collected in a worker, whose CUDA calls abort
            # it ("CUDA error: initialization error"): collect it here, before the fork.
            gc.collect()
        return _one_line_errors(iter(self.loader))


def forks_workers(loader: DataLoader) -> bool:
    """Whether the next iter(loader) starts worker processes: not without workers, nor while persistent ones
    from the last epoch are alive (they serve the next epoch, no fork and no start-up)."""
    it = getattr(loader, "_iterator", None)
    alive = loader.persistent_workers and it is not None and not getattr(it, "_shutdown", False)
    return loader.num_workers > 0 and not alive


def _one_line_errors(batches):
    """A UserError raised in a DataLoader worker comes back wrapped in the worker's traceback; give the user
    its own one line (e.g. the image file that can't be read)."""
    try:
        yield from batches
    except BaseException as e:  # an error, or the run's batches closed before the epoch's end (GeneratorExit)
        end_workers(batches)  # not after a whole epoch: persistent workers serve the next one
        if not isinstance(e, UserError):
            raise
        last = str(e).strip().splitlines()[-1]
        raise type(e)(last.split(": ", 1)[1] if "Original Traceback" in str(e) else str(e)) from None


class CudaPrefetcher:
    """Starts copying batch k+1 to the GPU, on a side CUDA stream, before step k runs, so the copy overlaps
    the step. The copy only runs asynchronously from pinned memory (pin_memory=true). On a CPU there is
    nothing to overlap and it yields the loader's batches as they are. (Notebook 03 teaches it.)"""

    def __init__(self, inner: LoaderInput, device: torch.device):
        self.inner, self.device = inner, device
        self.steps_per_epoch, self.workers = inner.steps_per_epoch, inner.workers
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _load(self, it):
        try:
            x, y = next(it)
        except StopIteration:
            return None
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def epoch(self, epoch: int, start_batch: int = 0):
        it = self.inner.epoch(epoch, start_batch)
        nxt = self._load(it)
        while nxt is not None:
            x, y = nxt
            if self.stream is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(self.stream)  # the step waits for its batch's copy, not for later ones
                x.record_stream(current)  # keep the memory alive until the step is done with it
                y.record_stream(current)
            nxt = self._load(it)
            yield x, y


class DeviceResidentInput:
    """The whole split as one uint8 tensor in device memory (CIFAR-sized sets: 150 MB), with batches
    gathered and augmented there: no workers, no per-image Python, no host-to-device copy per step.

    Shards like DistributedSampler (each rank gets the indices loader=dataloader would give it) and starts
    at any batch (resume). Augmentation is `crop_flip`, the function the CPU loader calls, on draws from a
    device generator seeded by (seed, epoch, rank, batch), so a resumed run sees the same pixels.
    (Notebook 03 teaches it.)
    """

    def __init__(self, cfg: TrainConfig, split: str, env, batch_size: int):
        train = split == "train"
        base = subset(base_dataset(cfg, split), cfg.train_size if train else cfg.val_size)
        if train and len(base) < batch_size * env.world_size:
            raise UserError(f"train_size={len(base)} is smaller than one global batch ({batch_size} x "
                            f"{env.world_size} ranks); raise train_size or lower batch_size")
        images, labels = stack_images(base)
        check_fits(images, env.device, split)
        self.device, self.rank, self.seed, self.batch = env.device, env.rank, cfg.seed, batch_size
        self.workers = 0  # no DataLoader: the device gathers and augments
        self.images, self.labels = images.to(env.device), labels.to(env.device)
        self.augment = train and cfg.augment and cfg.dataset != "mnist"
        self.sampler = EpochSampler(base, env.world_size, env.rank, shuffle=train, seed=cfg.seed, drop_last=train)
        n = self.sampler.num_samples
        self.steps_per_epoch = n // batch_size if train else math.ceil(n / batch_size)
        self.generator = torch.Generator(device=env.device)

    def order(self, epoch: int) -> torch.Tensor:
        """This rank's sample indices for `epoch`, on the device (one small copy per epoch)."""
        self.sampler.set_epoch(epoch)
        order = torch.tensor(list(DistributedSampler.__iter__(self.sampler)))  # indices, not (index, epoch)
        if self.device.type == "cuda":
            return order.pin_memory().to(self.device, non_blocking=True)  # no host-device sync
        return order

    def epoch(self, epoch: int, start_batch: int = 0):
        order = self.order(epoch)
        for b in range(start_batch, self.steps_per_epoch):
            idx = order[b * self.batch:(b + 1) * self.batch]
            x, y = self.images[idx], self.labels[idx]
            if self.augment:
                self.generator.manual_seed(batch_seed(self.seed, epoch, self.rank, b))
                offsets, flips = draw_augment(len(idx), self.generator, device=self.device)
                x = crop_flip(x, offsets, flips)
            yield x, y


def batch_seed(seed: int, epoch: int, rank: int, batch: int) -> int:
    return (((seed * 1_000_003 + epoch) * 10_000_019 + rank) * 1_000_033 + batch) % 2**63


def stack_images(base) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (image, label) of `base` as one uint8 (N, C, H, W) tensor and int64 labels, in index order."""
    if isinstance(base, ArrayImages):
        return base.images.contiguous(), base.labels.long()
    if isinstance(base, Subset) and isinstance(base.dataset, ArrayImages):
        idx = torch.as_tensor(list(base.indices))
        return base.dataset.images[idx].contiguous(), base.dataset.labels[idx].long()
    pairs = [base[i] for i in range(len(base))]  # decodes every image once: seconds for 50,000 small ones
    return torch.stack([x for x, _ in pairs]), torch.tensor([y for _, y in pairs], dtype=torch.long)


def check_fits(images: torch.Tensor, device: torch.device, split: str) -> None:
    """loader=gpu_resident keeps the images on the GPU; refuse when they would take half of its free memory."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    need = images.numel() * images.element_size()
    if need > free / 2:
        raise UserError(f"loader=gpu_resident needs {need / 2**20:,.0f} MiB of GPU memory for the {split} images "
                        f"but {free / 2**20:,.0f} MiB are free; use loader=dataloader (or loader=prefetcher), "
                        "or limit train_size")


def build_input(cfg: TrainConfig, split: str, env=None, batch_size: int | None = None):
    """The input pipeline named by cfg.loader (notebook 03): `.epoch(e)` iterates one epoch's batches.

    `env` (a distributed.DistEnv) says which rank and device it feeds; by default one process on cfg.device.
    `batch_size` is per device (default cfg.batch_size)."""
    if env is None:
        env = DistEnv(device=pick_device(cfg.device))
    batch_size = batch_size or cfg.batch_size
    if cfg.loader == "gpu_resident":
        return DeviceResidentInput(cfg, split, env, batch_size)
    pin = cfg.pin_memory and env.device.type == "cuda"  # pinning without a GPU only costs time
    inp = LoaderInput(build_loader(cfg, split, env.rank, env.world_size, batch_size, pin_memory=pin))
    if cfg.loader == "prefetcher":
        return CudaPrefetcher(inp, env.device)
    return inp
