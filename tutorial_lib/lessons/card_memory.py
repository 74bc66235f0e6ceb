"""The card's memory outlook (lessons/card.py measures, card_report.py prints): what a model's training state
takes per GPU under DDP and, sharded by FSDP2 (sharding.py), on 2, 4 and 8 GPUs.

An estimate from the sizes, never a measurement: the training state is the parameters, their gradients and the
optimizer's state (AdamW: two fp32 tensors per parameter; SGD with momentum: one), all fp32; the activations are
the bytes the probe's training step saved for its backward pass (autograd's saved tensors, weights left out), at
the user's batch. DDP keeps a whole copy of the state on every GPU; FSDP2 keeps 1/N of it and gathers the
parameters of one block at a time (two with its prefetch). Activations are not sharded: each GPU holds its own
batch's. On a GPU the card compares each with the card's memory; on a CPU there is none to compare with.
"""
from __future__ import annotations

import contextlib
import io
import time

import torch
from torch import nn

from .. import blocks, engine, ownmodel
from ..config import TrainConfig

MiB = 2 ** 20
PREDICTION_MARGIN = 0.95  # of the memory budget: the allocator's fragmentation and cuDNN's workspaces vary with k
FSDP_GPUS = (2, 4, 8)
OPTIMIZER_COPIES = {"adamw": 2, "sgd": 1}  # fp32 tensors of the optimizer's state per parameter (SGD: momentum)


@contextlib.contextmanager
def saved_activations(model: nn.Module, into: dict):
    """Count the bytes autograd saves for the backward pass inside the block (each storage once; the model's own
    parameters and buffers are not activations) into `into['bytes']`, and what activation checkpointing of the
    model's blocks (blocks.find) would keep instead, into `into['checkpointed_bytes']`: what no block saved, each
    block's input, and the largest block's own (recomputed one block at a time in the backward pass)."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: set[int] = set()
    into["bytes"], inside, inputs, depth = 0, [], [], [0]

    def pack(t: torch.Tensor):
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (a wrapper subclass): not counted
            return t
        ptr = storage.data_ptr()
        if ptr not in own and ptr not in seen:
            seen.add(ptr)
            into["bytes"] += storage.nbytes()
        return t

    def before(module, args):
        depth[0] += 1
        if depth[0] == 1:
            inputs.append(sum(_nbytes(a) for a in args if isinstance(a, torch.Tensor)))
            inside.append(-into["bytes"])

    def after(module, args, output):
        depth[0] -= 1
        if depth[0] == 0:
            inside[-1] += into["bytes"]

    handles = [h for b in blocks.find(model) for h in (b.register_forward_pre_hook(before), b.register_forward_hook(after))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
    finally:
        for h in handles:
            h.remove()
        into["checkpointed_bytes"] = (into["bytes"] - sum(inside) + sum(inputs) + max(inside)) if inside else None


def _nbytes(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return 0


def state_bytes(params: int, optimizer: str, momentum: float = 0.9) -> dict:
    """The training state's bytes, all fp32: parameters, gradients and the optimizer's state."""
    copies = (1 if momentum else 0) if optimizer == "sgd" else OPTIMIZER_COPIES.get(optimizer, 2)
    return {"params": 4 * params, "grads": 4 * params, "optimizer": 4 * copies * params}


def largest_block_bytes(model: nn.Module) -> int:
    """The fp32 bytes of the largest block FSDP2 would shard on its own (blocks.find); 0 when the model repeats
    none (then FSDP2 shards the model as one unit, gathered whole)."""
    found = blocks.find(model)
    if not found:
        return 4 * sum(p.numel() for p in model.parameters())
    return max(4 * sum(p.numel() for p in b.parameters()) for b in found)


def outlook(probe: dict, optimizer: str, momentum: float, total_bytes: int | None) -> dict:
    """DDP's bytes per GPU and FSDP2's on FSDP_GPUS, the estimate's parts, and whether DDP fits `total_bytes` (the
    card's memory; None on a CPU)."""
    state = state_bytes(probe["params"], optimizer, momentum)
    whole = sum(state.values())
    acts = probe.get("activation_bytes") or 0
    gathered = 2 * (probe.get("block_bytes") or 0)  # one block gathered, the next prefetched
    ddp = whole + acts
    fsdp = {n: whole / n + acts + gathered for n in FSDP_GPUS}
    fits = None if not total_bytes else ddp <= total_bytes
    return {"estimate": True, "state_bytes": state, "activation_bytes": acts, "gathered_bytes": gathered,
            "checkpointed_activation_bytes": probe.get("checkpointed_activation_bytes"),
            "ddp_bytes": ddp, "fsdp_bytes": fsdp, "total_bytes": total_bytes, "ddp_fits": fits,
            "optimizer": optimizer}


def device_total(device_type: str) -> int | None:
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return None


def _mib(n: float) -> str:
    return f"{n / MiB:,.0f} MiB" if n >= MiB else f"{n / MiB:.2f} MiB"


def fsdp_cell(memory: dict) -> str:
    """The page's row: DDP's estimate and, where it does not fit (or on a CPU, with nothing to fit), FSDP2's per
    GPU count; 'not measured' for a card stored before it."""
    o = memory.get("outlook")
    if not o:
        return "not measured"
    fsdp = " / ".join(_mib(o["fsdp_bytes"][n] if n in o["fsdp_bytes"] else o["fsdp_bytes"][str(n)])
                      for n in FSDP_GPUS)
    ddp = f"DDP {_mib(o['ddp_bytes'])} per GPU"
    if o.get("ddp_fits"):
        return f"not needed: {ddp} fits the card's {_mib(o['total_bytes'])} (estimate from the sizes)"
    where = f"; does not fit the card's {_mib(o['total_bytes'])}" if o.get("total_bytes") else ""
    return f"{ddp}{where}; FSDP2 {fsdp} on {'/'.join(map(str, FSDP_GPUS))} GPUs (estimate from the sizes)"


def checkpointed_cell(memory: dict, batch: int) -> str:
    """The page's row: the largest batch with activation checkpointing, or why there is none, and beside it (on a
    CPU, where there is no search) the activations' estimate at the user's batch."""
    if "checkpointed" not in memory:
        return "not measured"
    c, o = memory["checkpointed"], memory.get("outlook") or {}
    if c.get("largest_batch"):
        return f"{c['largest_batch']:,} ({c['why']})"
    if o.get("checkpointed_activation_bytes") is not None and o.get("activation_bytes"):
        return (f"{c['why'].split(':')[0]}; activations at batch {batch}: {_mib(o['activation_bytes'])}, "
                f"checkpointed {_mib(o['checkpointed_activation_bytes'])} (estimate)")
    return c["why"]


def estimate_note(memory: dict) -> str | None:
    """The note that says how the outlook was estimated, with its parts."""
    o = memory.get("outlook")
    if not o:
        return None
    s = o["state_bytes"]
    return (f"Memory per GPU, an estimate from the sizes (not measured): parameters {_mib(s['params'])}, gradients "
            f"{_mib(s['grads'])} and {o['optimizer']}'s state {_mib(s['optimizer'])}, all fp32, plus the activations "
            f"the probe's step saved for its backward pass ({_mib(o['activation_bytes'])} at its batch, fp32"
            + (f"; with its blocks checkpointed about {_mib(o['checkpointed_activation_bytes'])}: what no block saves, "
               "each block's input and the largest block's own" if o.get("checkpointed_activation_bytes") is not None
               else "") + "). DDP holds "
            "the whole state on every GPU; FSDP2 holds 1/N of it and gathers two blocks' parameters at a time "
            f"({_mib(o['gathered_bytes'])}); the allocator's cache and workspaces come on top.")


# ---------------------------------------------------------------------------------------- the largest batch
def largest_batch(parts: ownmodel.Parts, cfg: TrainConfig, probe: dict, cap: int, checkpointed_s: float = 0) -> dict:
    """On a GPU: the largest batch (a multiple of the user's, the batch repeated) whose eager training step at the
    recommended precision and layout fits in memory (search_batch, predicting from the memory this process may
    use), then the same with activation checkpointing (activation_checkpointing=blocks) within `checkpointed_s`
    seconds; on a CPU, n/a. And on every device the memory outlook of DDP and FSDP2 (outlook)."""
    estimate = outlook(probe, cfg.optimizer, cfg.momentum, device_total(probe["device_type"]))
    if probe["device_type"] != "cuda":
        why = "n/a on a CPU: host memory swaps before a batch fails to fit; run the card on a GPU for it"
        return {"largest_batch": None, "why": why, "outlook": estimate,
                "checkpointed": checkpointed_plan(probe) or {"why": "n/a on a CPU: no batch fails to fit"}}
    t0 = time.perf_counter()
    good, why = _search(parts, cfg, probe, cap, None)
    out = {"largest_batch": good, "why": why, "search_s": time.perf_counter() - t0, "outlook": estimate}
    t1 = time.perf_counter()
    no_blocks = checkpointed_plan(probe)
    if no_blocks:
        out["checkpointed"] = no_blocks
    elif checkpointed_s <= 0:
        out["checkpointed"] = {"why": "not measured: no time left of the card's budget"}
    else:
        best, said = _search(parts, cfg.replace(activation_checkpointing="blocks"), probe, cap,
                             time.perf_counter() + checkpointed_s)
        out["checkpointed"] = {"largest_batch": best, "why": said, "search_s": time.perf_counter() - t1}
    return out


def checkpointed_plan(probe: dict) -> dict | None:
    """Why the largest batch with activation checkpointing can't be measured (no block to checkpoint: the probe
    found none), or None when it can."""
    if not probe.get("blocks"):
        return {"why": "n/a: the model repeats no block to checkpoint (activation_checkpointing=blocks)"}
    return None


def _search(parts: ownmodel.Parts, cfg: TrainConfig, probe: dict, cap: int, deadline: float | None):
    """The largest batch that fits at `cfg` (eager) and the words that say how it was found; no step starts after
    `deadline` (a time.perf_counter() time: the largest batch that fitted by then stands, said as a lower bound)."""
    b, late = probe["batch"], []
    eager = cfg.replace(compile=False, cuda_graph=False, steps=1, timing_warmup=0, out_dir=f"{cfg.out_dir}_memory")

    def peak(k):
        if deadline is not None and time.perf_counter() > deadline:
            late.append(k)
            return None  # as if it did not fit: the search ends at once, and says why below
        return _peak(run, x, y, k)
    with contextlib.redirect_stdout(io.StringIO()), engine.prepared_run(eager, parts.make_run) as run:
        x, y = next(run.batches())
        good, bad = search_batch(peak, b, max(cap, b), _budget(run.device))
    limit = ("at least this: the search ran out of its time" if late else f"{bad:,} did not fit" if bad
             else f"the search stops at {max(cap, b):,}")
    ckpt = ", checkpointed blocks" if cfg.activation_checkpointing != "none" else ""
    return good, f"eager step at {cfg.precision}{ckpt}; {limit}"


def _budget(device) -> float | None:
    """The bytes this process's steps may use: the driver's free memory and what the allocator already holds (None
    where the driver can't say: the search then only doubles)."""
    try:
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device)
    except RuntimeError:
        return None


def search_batch(peak, batch: int, cap: int, budget: float | None = None) -> tuple[int, int | None]:
    """(the largest k x batch whose step fits, the smallest that did not or None), within an eighth; peak(k) runs a
    step at k x batch and gives its peak bytes, or None when it did not fit. Every new batch size costs cuDNN's
    autotuner a search of every convolution, so the search tries few: with a `budget` (bytes the steps may use),
    the line through the peaks at k = 1 and 2 predicts the largest k, which is tried next, then one eighth more;
    without one (or when the prediction misses), k doubles. Then the gap to the first k that did not fit is
    halved until it is within an eighth. No k beyond cap // batch is tried."""
    top = max(1, cap // batch)
    good, bad, grow = 1, None, (lambda k: 2 * k)
    peak1 = peak(1) if budget and top >= 2 else None
    if peak1 is not None:
        peak2 = peak(2)
        good, bad = (2, None) if peak2 is not None else (1, 2)
        if peak2 is not None and peak2 > peak1:
            guess = min(top, int(2 + (PREDICTION_MARGIN * budget - peak2) / (peak2 - peak1)))  # peak2 + per k
            if guess > good:
                good, bad = (guess, None) if peak(guess) is not None else (good, guess)
                grow = (lambda k: k + max(1, k // 8)) if bad is None else grow
    while bad is None and good < top:
        k = min(top, grow(good))
        good, bad = (k, None) if peak(k) is not None else (good, k)
    while bad is not None and bad - good > max(1, good // 8):
        mid = (good + bad) // 2
        good, bad = (mid, bad) if peak(mid) is not None else (good, mid)
    return good * batch, bad * batch if bad else None


def _peak(run, x, y, k: int) -> int | None:
    """The peak bytes the allocator held during one training step at k x the batch, or None when it ran out."""
    try:
        torch.cuda.reset_peak_memory_stats(run.device)
        run.train_step(torch.cat([x] * k), torch.cat([y] * k))
        torch.cuda.synchronize(run.device)
        return torch.cuda.max_memory_allocated(run.device)
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError, or cuDNN's own allocation failing
        if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e) or "ALLOC_FAILED" in str(e):
            return None
        raise
    finally:
        run.opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
