"""DDP computes the gradient of the global batch: 2 ranks with batch b each (gloo, CPU) give the gradients, and
after one SGD step the parameters, of one process with batch 2b, with DDP's hooks, with the engine's flat
all-reduce (ddp_sync) and with its DDP by hand (cuda_graph=true, in one piece or in buckets); gradient accumulation with no_sync gives them too; and the ranks' parameters stay
identical.

Why the model runs in eval mode: the equality holds when the loss is a mean of per-sample terms. In training
mode BatchNorm normalises each sample with its batch's statistics, which couples the samples: rank 0's
statistics over its b samples are not those of the 2b samples the single process sees (SyncBatchNorm computes
them over the global batch, on GPUs only). In eval mode BatchNorm uses its running statistics, every sample is on
its own, and ResNet-18 has no dropout, so the comparison is exact up to float summation order. The samples match
because DistributedSampler gives rank r the indices r, r+2, r+4, ... of the same shuffled order, and the random
crops are drawn per sample index.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HELPER = str(Path(__file__).parent / "fixtures" / "ddp_one_step.py")
SYNCS = ["ddp_sync=hooks", "ddp_sync=flat", "cuda_graph=true", "cuda_graph=true ddp_sync=buckets"]
BF16_SYNCS = ["ddp_sync=hooks", "cuda_graph=true"]  # buckets share the flat path's cast
# every 2-rank case of this module: name -> (batch per rank, micro-batches, key=value ...)
TWO_RANK_CASES = {**{f"sync {s}": (4, 1, s.split()) for s in SYNCS},
                  "accumulation": (2, 2, []),
                  **{f"bf16 {s}": (4, 1, [*s.split(), "ddp_grad_dtype=bf16"]) for s in BF16_SYNCS}}


def launch(args: list[str], nproc: int) -> None:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, *launcher, HELPER, *args], capture_output=True, text=True, timeout=300,
                       env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


def one_step(out_dir: Path, batch: int, accum: int = 1) -> dict:
    """One process: its gradients and parameters after one step."""
    launch([str(out_dir), str(batch), str(accum)], nproc=1)
    return torch.load(out_dir / "rank0.pt")


def assert_close(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() / (b[k].abs().max().item() + 1e-12) for k in a)
    assert worst < 1e-4, f"{what}: largest relative difference {worst:.2e}"


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return one_step(tmp_path_factory.mktemp("single") / "b8", batch=8)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every 2-rank case in one torchrun launch (the two processes run them in turn): case -> [rank 0, rank 1]."""
    root = tmp_path_factory.mktemp("two_ranks")
    folders = {name: f"case{i}" for i, name in enumerate(TWO_RANK_CASES)}
    spec = [{"name": folders[name], "batch": b, "accum": a, "extra": extra}
            for name, (b, a, extra) in TWO_RANK_CASES.items()]
    (root / "cases.json").write_text(json.dumps(spec))
    launch(["--cases", str(root / "cases.json"), str(root)], nproc=2)
    return {name: [torch.load(root / folder / f"rank{r}.pt") for r in (0, 1)] for name, folder in folders.items()}


@pytest.mark.parametrize("sync", SYNCS)
def test_two_ranks_with_batch_b_match_one_process_with_batch_2b(two_ranks, single, sync):
    """hooks: DDP's bucket all-reduces during the backward pass; flat: one all-reduce after it; cuda_graph: no
    DDP module, the engine's recorded step broadcasts and all-reduces by hand (on a CPU it runs unrecorded),
    in one piece or (ddp_sync=buckets) bucket by bucket during the backward pass."""
    ranks = two_ranks[f"sync {sync}"]
    assert_close(ranks[0]["grads"], single["grads"], "DDP gradients vs one process")
    assert_close(ranks[0]["params"], single["params"], "parameters after one step")
    for name, p in ranks[0]["params"].items():
        assert torch.equal(p, ranks[1]["params"][name]), f"{name} differs between the ranks"


def test_accumulation_with_no_sync_matches_the_big_batch(tmp_path, two_ranks, single):
    ranks = two_ranks["accumulation"]
    assert_close(ranks[0]["grads"], single["grads"], "DDP, 2 ranks x 2 micro-batches of 2, vs batch 8")
    alone = one_step(tmp_path / "accum", batch=4, accum=2)
    assert_close(alone["grads"], single["grads"], "one process, 2 micro-batches of 4, vs batch 8")


def test_a_stop_flag_on_one_rank_reaches_every_rank_at_the_same_vote():
    """The engine's stop vote (distributed.StopVote) is cast one step before each log step and read at it, so
    that the GPU never waits for it: rank 1's flag, raised after step 3 of a run logged every step, is seen by
    both ranks after step 4; raised after step 7 of a run logged every 5th step, both stop at step 10. The same
    two ranks then gather values of different sizes and meet at a barrier."""
    script = str(Path(__file__).parent / "fixtures" / "stop_vote.py")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    expected = "[False, False, False, True, False]"
    assert f"rank 0 read {expected}" in p.stdout and f"rank 1 read {expected}" in p.stdout, p.stdout
    assert "rank 0 stopped at 10" in p.stdout and "rank 1 stopped at 10" in p.stdout, p.stdout
    assert "rank 0 settled True" in p.stdout and "rank 1 settled True" in p.stdout, p.stdout
    # the same processes: the workbook's own all_gather (held tensors) with a different size on each rank
    for r in (0, 1):
        assert f"rank {r} gathered [(0, 10), (1, 1010)]" in p.stdout and f"rank {r} passed the barrier" in p.stdout


@pytest.mark.parametrize("sync", BF16_SYNCS)
def test_bf16_gradient_all_reduce_rounds_but_stays_close(two_ranks, single, sync):
    """ddp_grad_dtype=bf16: the gradients travel in bf16 (DDP's bf16_compress_hook, or the flat buffer cast):
    not equal to the fp32 average (the knob does something), within bf16's rounding of it, same on every rank."""
    ranks = two_ranks[f"bf16 {sync}"]
    worst = max((ranks[0]["grads"][k] - single["grads"][k]).abs().max().item()
                / (single["grads"][k].abs().max().item() + 1e-12) for k in single["grads"])
    assert 0 < worst < 1e-2, f"bf16 all-reduce vs fp32: largest relative difference {worst:.2e}"
    for name, p in ranks[0]["params"].items():
        assert torch.equal(p, ranks[1]["params"][name]), f"{name} differs between the ranks"
