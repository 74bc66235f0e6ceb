"""Input pipelines: the GPU-side augmentation is the CPU one, the prefetcher and the GPU-resident input
yield the loader's batches, resume is exact, and the imagefolder set is the shapes set as files."""
import pytest
import torch

from conftest import tiny
from tutorial_lib import data, distributed, engine, shapes
from tutorial_lib.config import DataNotFound, TrainConfig, UserError
from tutorial_lib.imagefolder import FETCH, write_imagefolder

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def env_on(device: str, rank: int = 0, world_size: int = 1) -> distributed.DistEnv:
    return distributed.DistEnv(rank=rank, world_size=world_size, device=torch.device(device))


def batches(inp, epoch, start=0):
    return [(x.cpu(), y.cpu()) for x, y in inp.epoch(epoch, start)]


def assert_same(a, b):
    assert len(a) == len(b) > 0
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("device", DEVICES)
def test_device_augmentation_is_the_cpu_function(device):
    """The same draws give the same pixels: per image on the CPU (as a DataLoader worker does) and as one
    batch on the device (as loader=gpu_resident does)."""
    x = torch.from_numpy(shapes.make_shapes(64, seed=3)[0]).permute(0, 3, 1, 2)
    offsets, flips = data.draw_augment(64, torch.Generator().manual_seed(5))
    per_image = torch.cat([data.crop_flip(x[i:i + 1], offsets[i:i + 1], flips[i:i + 1]) for i in range(64)])
    on_device = data.crop_flip(x.to(device), offsets.to(device), flips.to(device)).cpu()
    assert torch.equal(per_image, on_device)
    assert flips.any() and not flips.all() and (offsets != 4).any()  # the draws really crop and flip


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_resident_augments_with_crop_flip_and_its_batch_draws(device):
    cfg = TrainConfig(train_size=96, batch_size=32, loader="gpu_resident")
    inp = data.build_input(cfg, "train", env_on(device), 32)
    plain = data.build_input(cfg.replace(augment=False), "train", env_on(device), 32)
    for b, ((x, _), (raw, _)) in enumerate(zip(inp.epoch(2), plain.epoch(2))):
        gen = torch.Generator(device=device).manual_seed(data.batch_seed(cfg.seed, 2, 0, b))
        offsets, flips = data.draw_augment(32, gen, device=device)
        expected = torch.cat([data.crop_flip(raw[i:i + 1].cpu(), offsets[i:i + 1].cpu(), flips[i:i + 1].cpu())
                              for i in range(32)])
        assert torch.equal(x.cpu(), expected)
        assert not torch.equal(x, raw)


@pytest.mark.parametrize("rank", [0, 1])
def test_gpu_resident_shards_and_resumes_like_the_dataloader(rank):
    cfg = TrainConfig(train_size=200, batch_size=16, augment=False, num_workers=0)
    env = env_on("cpu", rank, world_size=2)
    loader = data.build_input(cfg, "train", env, 16)
    resident = data.build_input(cfg.replace(loader="gpu_resident"), "train", env, 16)
    assert resident.steps_per_epoch == loader.steps_per_epoch == 6  # 100 images per rank, last batch dropped
    for epoch in (0, 1):
        assert_same(batches(resident, epoch, start=2), batches(loader, epoch, start=2))
    val = data.build_input(cfg.replace(val_size=50), "val", env, 16)
    resident_val = data.build_input(cfg.replace(val_size=50, loader="gpu_resident"), "val", env, 16)
    assert_same(batches(resident_val, 0), batches(val, 0))  # validation keeps the partial last batch


def test_gpu_resident_resumed_epoch_sees_the_same_augmented_images():
    inp = data.build_input(TrainConfig(train_size=128, batch_size=16, loader="gpu_resident"), "train",
                           env_on("cpu"), 16)
    whole = batches(inp, 3)
    assert_same(batches(inp, 3, start=5), whole[5:])
    assert not torch.equal(whole[0][0], batches(inp, 4)[0][0])  # another epoch: another order and draws


@pytest.mark.parametrize("device", DEVICES)
def test_prefetcher_yields_exactly_the_loaders_batches_in_order(device):
    cfg = TrainConfig(train_size=160, batch_size=16, num_workers=2, pin_memory=device == "cuda")
    loader = data.build_input(cfg, "train", env_on(device), 16)
    prefetcher = data.build_input(cfg.replace(loader="prefetcher"), "train", env_on(device), 16)
    assert isinstance(prefetcher, data.CudaPrefetcher)
    got = list(prefetcher.epoch(1, 3))
    assert all(x.device.type == device for x, _ in got)
    assert_same([(x.cpu(), y.cpu()) for x, y in got], batches(loader, 1, start=3))


def test_dataloader_knobs_reach_the_dataloader():
    cfg = TrainConfig(train_size=64, batch_size=16, num_workers=2, persistent_workers=True, prefetch_factor=4)
    loader = data.build_loader(cfg, "train")
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (2, True, 4)
    assert not data.build_input(cfg, "train", env_on("cpu"), 16).loader.pin_memory  # no GPU: nothing to pin for


@pytest.mark.parametrize("persistent, collects", [(False, 3), (True, 1)])
def test_garbage_is_collected_only_before_workers_are_forked(monkeypatch, persistent, collects):
    """With CUDA up, each epoch that forks workers collects garbage first (a worker must not free inherited CUDA
    memory); persistent workers alive from the last epoch fork nothing, so their epochs skip that cost (notebook
    03 times the first batch of each epoch)."""
    import gc

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    cfg = TrainConfig(train_size=32, batch_size=16, num_workers=1, persistent_workers=persistent)
    inp = data.build_input(cfg, "train", env_on("cpu"))
    for epoch in range(3):
        assert len(list(inp.epoch(epoch))) == 2  # each epoch to its end: persistent workers serve the next
    if persistent:
        data.end_workers(inp.loader._iterator)
    assert len(calls) == collects


def test_gpu_resident_refuses_a_dataset_larger_than_half_the_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 * 2**20, 80 * 2**30))
    images = torch.zeros(60_000, 3, 32, 32, dtype=torch.uint8)  # 176 MB
    with pytest.raises(UserError, match="loader=gpu_resident needs 176 MiB.*use loader=dataloader"):
        data.check_fits(images, torch.device("cuda"), "train")


def test_gpu_resident_training_resumes_exactly(tiny_cfg, tmp_path):
    from conftest import interrupted_at

    kw = dict(steps=8, train_size=48, loader="gpu_resident", ckpt_every=0)
    straight = engine.train(tiny_cfg(out_dir=str(tmp_path / "straight"), **kw))
    cfg = tiny_cfg(out_dir=str(tmp_path / "resumed"), **kw)
    interrupted_at(cfg, 4)
    resumed = engine.train(cfg)
    assert resumed.resumed_from_step == 4 and resumed.loss == straight.loss


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_imagefolder(root / "imagefolder", train_size=120, val_size=30, processes=2)
    return root


def test_imagefolder_holds_the_shapes_pixels_as_png_files(folder):
    from tutorial_lib.imagefolder import imagefolder_dataset

    assert data.staged(str(folder))["imagefolder"]
    ds = imagefolder_dataset(TrainConfig(dataset="imagefolder", data_dir=str(folder)), "train")
    images, labels = shapes.make_shapes(120, seed=0)
    assert len(ds) == 120 and ds.samples[0][0].endswith(".png")
    for i in range(0, 120, 7):
        x, label = ds[i]
        index = int(ds.samples[i][0].rsplit("/", 1)[1][:-4])  # files are named by their shapes index
        assert label == labels[index]
        assert torch.equal(x, torch.from_numpy(images[index]).permute(2, 0, 1))
    first_ten = [label for _, label in ds.samples[:10]]
    assert sorted(first_ten) == list(range(10))  # round-robin over classes: train_size=10 gets every class


def test_imagefolder_trains_through_both_loaders(folder, tiny_cfg):
    for loader in ("dataloader", "gpu_resident"):
        r = engine.train(tiny_cfg(dataset="imagefolder", data_dir=str(folder), train_size=96, val_size=30,
                                  loader=loader, steps=3, out_dir=str(folder / loader)))
        assert r.steps == 3 and r.val_accuracy is not None


def test_imagefolder_missing_or_too_small_names_the_command(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(dataset="imagefolder")  # data_dir="data", relative to where the run starts
    with pytest.raises(DataNotFound, match="not staged in 'data'; run `python -m tutorial_lib data fetch "
                                                "imagefolder` "):
        data.build_loader(cfg, "train")
    with pytest.raises(DataNotFound, match=f"run `{FETCH} --data-dir elsewhere`"):
        data.build_loader(cfg.replace(data_dir="elsewhere"), "train")
    with pytest.raises(DataNotFound, match="train_size=500 but .* holds 120 images"):
        data.build_loader(cfg.replace(data_dir=str(folder), train_size=500), "train")


def test_fetch_imagefolder_writes_it_offline(tmp_path, monkeypatch):
    import tutorial_lib.imagefolder as imagefolder

    small = imagefolder.write_imagefolder
    monkeypatch.setattr(imagefolder, "write_imagefolder", lambda root: small(root, train_size=20, val_size=10))
    assert not data.staged(str(tmp_path))["imagefolder"]
    assert data.fetch("imagefolder", str(tmp_path)) == tmp_path / "imagefolder"
    assert data.staged(str(tmp_path))["imagefolder"]
    assert not (tmp_path / "imagefolder.partial").exists()


def test_a_shapes_set_too_large_for_memory_fails_before_any_process_is_forked(monkeypatch):
    """With the set allocated last, a training run (which catches SIGTERM) forked its drawing pool first, and
    that pool's workers, inheriting the handler, outlived its terminate(): the run hung instead of failing."""
    def no_pool(*_):
        raise AssertionError("a pool was started for a set that cannot fit")
    monkeypatch.setattr(shapes.multiprocessing, "get_context", no_pool)
    for n in (10**20, 10**13):  # beyond numpy's indexing; beyond any machine's memory
        with pytest.raises(MemoryError):
            shapes.make_shapes(n, seed=0, workers=2)


FAILING_DRAW = """
import signal, sys
from tutorial_lib import shapes
signal.signal(signal.SIGTERM, lambda *_: None)  # as a training run's stop handler: it records, it does not exit
def _chunk(start, **_):
    raise ValueError(f"chunk at {start} failed")
shapes._chunk = _chunk
try:
    shapes.make_shapes(3 * 4096, seed=0, workers=2)
except ValueError as e:
    print("raised:", e)
print("still blocked:", sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
"""


# A worker that the scheduler starts late: the pool's terminate() sends SIGTERM before the worker has begun.
LATE_WORKER = """
import multiprocessing, multiprocessing.pool, time
start = multiprocessing.pool.worker
def _late_start(*args, **kwargs):
    if multiprocessing.current_process()._identity[-1] % 2 == 0:
        time.sleep(2)
    start(*args, **kwargs)
multiprocessing.pool.worker = _late_start
"""


@pytest.mark.parametrize("late", [False, True], ids=["workers-ready", "worker-starts-late"])
def test_the_drawing_pool_ends_when_a_chunk_fails_in_a_process_that_catches_sigterm(late):
    """The pool's workers take SIGTERM's default action, so terminate() ends them whatever the parent catches,
    even one that had not reset its handlers when terminate() came (a loaded CI node hung there for 60 s)."""
    import subprocess
    import sys

    code = FAILING_DRAW.replace("try:", (LATE_WORKER if late else "") + "try:", 1)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "raised: chunk at" in p.stdout, p.stdout + p.stderr
    assert "still blocked: []" in p.stdout, "the parent must get its stop signals back once the pool is started"


FAILING_WRITE = """
import signal
from tutorial_lib import imagefolder
signal.signal(signal.SIGTERM, lambda *_: None)
def _fail(job):
    raise OSError(f"no space left for chunk {job}")
try:
    imagefolder._map(_fail, [0, 1, 2], processes=2)
except OSError as e:
    print("raised:", e)
"""


@pytest.mark.parametrize("late", [False, True], ids=["workers-ready", "worker-starts-late"])
def test_the_png_writing_pool_ends_when_a_chunk_fails_in_a_process_that_catches_sigterm(late):
    """The same guard on the imagefolder writer's pool (any pool the package starts)."""
    import subprocess
    import sys

    code = FAILING_WRITE.replace("try:", (LATE_WORKER if late else "") + "try:", 1)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "raised: no space left" in p.stdout, p.stdout + p.stderr
