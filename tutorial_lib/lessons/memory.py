"""Where a training step's memory goes (notebook 08): the count from the model's sizes, and the measure on a GPU.

The count needs no GPU: the model is built on PyTorch's meta device (shapes, no memory, no compute) and one
forward pass runs under `torch.autograd.graph.saved_tensors_hooks`, which sees every tensor autograd keeps for
the backward pass: the activations. Parameters, gradients and the optimizer's state follow from the parameter
count. On a GPU `measure` runs real steps and reads the caching allocator (`torch.cuda.memory_allocated`,
`max_memory_allocated`, `memory_reserved`) between them.

    count(tl.memory.resnet18, tl.memory.images, batch=256)     # bytes per part, from the sizes
    measure(tl.memory.resnet18, tl.memory.images, batch=256)   # the same parts, measured (CUDA only)
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import blocks, models
from ..config import UserError
from . import card_examples

MiB, GiB = 2 ** 20, 2 ** 30
PARTS = ("parameters", "gradients", "optimizer state", "activations")
ADAM_STATES = 2  # AdamW keeps two numbers per parameter (exp_avg, exp_avg_sq), in the parameter's dtype


@dataclass(frozen=True)
class Example:
    """A model and its batches for the lesson: `make()` builds the model, `batch(n, device)` gives (x, y)."""
    name: str
    make: object
    batch: object


def _images(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 32, 32, device=device), torch.randint(0, 10, (n,), device=device)


def _tokens(n: int, device, size=None) -> tuple[torch.Tensor, torch.Tensor]:
    s = size or card_examples.GPT_FULL
    x = torch.randint(0, s.vocab, (n, s.seq), device=device)
    return x, torch.randint(0, s.vocab, (n, s.seq), device=device)


SMALL_RESNET18 = Example("ResNet-18 (ImageNet stem, 32x32 images)", lambda: models.build("resnet18_imagenet", 10),
                         _images)  # 16x less work per image: a CPU times it in seconds
RESNET18 = Example("ResNet-18 (CIFAR stem, 32x32 images)", lambda: models.build("resnet18", 10), _images)
GPT = Example("07's GPT (6 layers, width 512, 512 tokens)", lambda: card_examples.GPT(card_examples.GPT_FULL), _tokens)


def loss_of(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension: classes of an image, or the vocabulary at each position."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), y.reshape(-1))


# ---------------------------------------------------------------------------------------------- the count
def state_bytes(params: int, bytes_per_number: int = 4, optimizer_states: int = ADAM_STATES) -> dict:
    """Parameters, their gradients and the optimizer's state, in bytes, for `params` numbers."""
    one = params * bytes_per_number
    return {"parameters": one, "gradients": one, "optimizer state": optimizer_states * one}


def saved_activations(example: Example, batch: int) -> dict:
    """One forward pass on the meta device: the bytes autograd saves for backward (parameters left out, a
    storage counted once); what activation checkpointing would keep (what is saved outside the blocks and the
    blocks' inputs) and what each block saves besides its input (recomputed in the backward pass)."""
    with torch.device("meta"):
        model = example.make()
        x, y = example.batch(batch, "meta")
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saves, where, inputs, size = [], [None], {}, {}
    found = blocks.find(model)

    def enter(i: int, args) -> None:
        where[0] = i
        s = args[0].untyped_storage()
        inputs[i], size[s._cdata] = s._cdata, s.nbytes()

    for i, block in enumerate(found):
        block.register_forward_pre_hook(lambda m, args, i=i: enter(i, args))
        block.register_forward_hook(lambda m, args, out: where.__setitem__(0, None))

    def pack(t):
        s = t.untyped_storage()
        if s._cdata not in params:
            saves.append((s._cdata, where[0]))
            size[s._cdata] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of(model(x), y)
    kept = {k for k, w in saves if w is None} | set(inputs.values())
    inside = [{k for k, w in saves if w == i} - {inputs[i]} for i in range(len(found))]
    return {"bytes": sum(size[k] for k in {k for k, _ in saves}), "params": sum(p.numel() for p in model.parameters()),
            "checkpointed": sum(size[k] for k in kept) + max((sum(size[k] for k in s) for s in inside), default=0),
            "largest_block": max((sum(p.numel() for p in b.parameters()) for b in found), default=0)}


@functools.lru_cache(maxsize=64)
def count(example: Example, batch: int, checkpointing: bool = False) -> dict:
    """The four parts in bytes, from the sizes. With activation checkpointing the blocks keep only their inputs,
    and one block's activations exist at a time (recomputed in the backward pass): the largest block's.
    A repeated block is found by blocks.find, the rule the engine's activation_checkpointing=blocks uses."""
    saved = saved_activations(example, batch)
    act = saved["checkpointed"] if checkpointing else saved["bytes"]
    return {**state_bytes(saved["params"]), "activations": act, "params": saved["params"], "batch": batch,
            "largest_block": saved["largest_block"]}


def largest_batch(example: Example, memory_bytes: int, checkpointing: bool = False, at: int = 64) -> int:
    """The largest batch whose counted parts fit in `memory_bytes`: the activations grow with the batch (counted
    at batch `at` and scaled), the rest does not."""
    c = count(example, at, checkpointing)
    fixed = sum(c[p] for p in PARTS[:3])
    if memory_bytes <= fixed:
        return 0
    return int((memory_bytes - fixed) / (c["activations"] / at))


# ---------------------------------------------------------------------------------------------- the measure
def measure(example: Example, batch: int, checkpointing: bool = False, steps: int = 3,
            device: str = "cuda") -> dict:
    """Real AdamW steps on the GPU, read by the caching allocator: the parts in bytes, the peak, what the
    allocator reserved, and each timed step's seconds (the first, warm-up step not timed). The optimizer's state
    and the gradients are their tensors' bytes (the allocator's total also holds cuBLAS's workspace)."""
    if not torch.cuda.is_available():
        raise UserError("memory.measure reads the CUDA caching allocator, and no GPU is visible here; "
                        "use memory.count (from the sizes) or the reference run")
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    model = example.make().to(device)
    blocks.apply_checkpointing(model, "blocks" if checkpointing else "none")
    params = torch.cuda.memory_allocated() - start
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)  # no foreach temporaries in the peak
    x, y = example.batch(batch, device)
    data = x.nbytes + y.nbytes
    times, out = [], {}
    for i in range(steps + 1):
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated() - start
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = loss_of(model(x), y)
        after_forward = torch.cuda.memory_allocated() - start
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
        state = sum(t.nbytes for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.is_cuda)
        out = {"parameters": params, "optimizer state": state, "activations": after_forward - before,
               "peak": torch.cuda.max_memory_allocated() - start, "reserved": torch.cuda.memory_reserved()}
    out["gradients"] = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    out.update(batch=batch, step_s=times, data=data)
    del model, opt, x, y, loss
    torch.cuda.empty_cache()
    return out


def beyond(m: dict) -> int:
    """What the measured peak holds beyond parameters, optimizer state and the forward's activations: the
    gradients and the backward pass's temporaries."""
    return max(0, m["peak"] - m["parameters"] - m["optimizer state"] - m["activations"] - m["data"])


def agreement(counted: int, measured: int) -> str:
    """'the count is 2% below the measure' for two byte figures."""
    d = (counted - measured) / measured
    return "the count equals the measure" if abs(d) < 0.005 else \
        f"the count is {abs(d):.0%} {'above' if d > 0 else 'below'} the measure"


def lines(counted: dict, measured: dict | None = None) -> list[str]:
    """One line per part: its count in MiB, and where measured, the measure beside it."""
    out = []
    for part in PARTS:
        text = f"  {part:16s} {counted[part] / MiB:9,.0f} MiB counted"
        if measured:
            text += f", {measured[part] / MiB:9,.0f} MiB measured: {agreement(counted[part], measured[part])}"
        out.append(text)
    if measured:
        out.append(f"  peak {measured['peak'] / MiB:,.0f} MiB allocated, {measured['reserved'] / MiB:,.0f} MiB "
                   f"reserved: the allocator's cache holds {(measured['reserved'] - measured['peak']) / MiB:,.0f} MiB")
    return out


def to_record(m: dict) -> dict:
    """A measure as reference figures: MiB, step times in ms."""
    keys = (*PARTS, "peak", "reserved", "data")
    return {**{k.replace(" ", "_") + "_mib": m[k] / MiB for k in keys}, "batch": m["batch"],
            "step_ms": [1000 * s for s in m["step_s"]]}


def from_record(figures: dict) -> dict:
    """The reference figures back as a measure (bytes)."""
    keys = (*PARTS, "peak", "reserved", "data")
    return {**{k: figures[k.replace(" ", "_") + "_mib"] * MiB for k in keys}, "batch": figures["batch"],
            "step_s": [ms / 1000 for ms in figures["step_ms"]]}


def step_times(example: Example, batch: int, checkpointing: bool, steps: int = 4, device: str = "cpu") -> list[float]:
    """Seconds of each of `steps` AdamW steps after one untimed step, on any device (a CPU's step times too)."""
    model = example.make().to(device)
    blocks.apply_checkpointing(model, "blocks" if checkpointing else "none")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = example.batch(batch, device)
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_of(model(x), y).backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return times


def slower_line(plain_s: list[float], checkpointed_s: list[float], batch: int) -> str:
    """Images/s with activation checkpointing against without, by the workbook's one rule (lessons/noise)."""
    from . import noise

    rate = lambda times: noise.of_runs([batch / t for t in times], "steps")  # noqa: E731
    a, b = rate(checkpointed_s), rate(plain_s)
    return (f"{a.value:,.1f} img/s checkpointed, {b.value:,.1f} without: " + noise.versus(a, b))


# ---------------------------------------------------------------------------------------------- sharded
BIG = card_examples.GPTSize(vocab=32000, width=5120, heads=40, layers=40, seq=2048, batch=1)  # a 13B model's shape
BIG_GPT = Example("a GPT of width 5120 and 40 layers", lambda: card_examples.GPT(BIG),
                  lambda n, device: _tokens(n, device, BIG))


def per_rank(example: Example, global_batch: int, ranks: int, sharded: bool, checkpointing: bool = False) -> dict:
    """Bytes each rank holds at the peak, counted: with DDP a whole copy of the training state; with FSDP 1/ranks
    of it, plus the one block gathered whole while it runs (its parameters and gradients). The activations of
    global_batch / ranks images either way."""
    c = count(example, global_batch // ranks, checkpointing)
    state = {p: c[p] / ranks if sharded else c[p] for p in PARTS[:3]}
    gathered = {"gathered block": 2 * 4 * c["largest_block"]} if sharded and ranks > 1 else {}
    return {**state, **gathered, "activations": c["activations"]}


def fits_line(label: str, parts: dict, card_bytes: float | None) -> str:
    total = sum(parts.values())
    verdict = "" if not card_bytes else (": fits the card" if total <= card_bytes else ": does not fit the card")
    return f"{label}: {total / GiB:,.1f} GiB per GPU{verdict}"


# ---------------------------------------------------------------------------------------------- the notebook's lines
def key(name: str, batch: int) -> str:
    """'resnet18_256': a measure's name in the reference file."""
    return f"{name.lower().replace('-', '')}_{batch}"


def from_reference(record: dict | None, counted: dict) -> dict | None:
    """The reference run's measures for the (model, batch) pairs of `counted`, or None without a record."""
    if record is None:
        return None
    return {k: from_record(record["figures"][key(*k)]) for k in counted if key(*k) in record["figures"]}


def largest_lines(examples: dict, card_bytes: float | None, where: str | None = None) -> list[str]:
    """The largest batch each model fits on the card by the count, with activation checkpointing and without."""
    if not card_bytes:
        return ["(the card's memory: no GPU here and no reference run recorded yet)"]
    out = [f"on {card_bytes / GiB:,.1f} GiB ({where or 'this card'}), by the count:"]
    for name, ex in examples.items():
        plain, ckpt = largest_batch(ex, card_bytes), largest_batch(ex, card_bytes, checkpointing=True)
        out.append(f"  {name:9s} largest batch {plain:7,d} without, {ckpt:7,d} with activation checkpointing")
    return out


def sharding_rows(card_bytes: float | None) -> list[tuple[str, str, dict]]:
    """(line, label, parts) per model and layout: ResNet-18 at global batch 512, and BIG_GPT at one sequence per
    GPU with activation checkpointing; DDP against FSDP on 2 and on 8 GPUs."""
    rows = []
    for name, ex, batch, ckpt in (("ResNet-18", RESNET18, lambda n: 512, False),
                                  ("large GPT", BIG_GPT, lambda n: n, True)):
        for ranks, sharded in ((2, False), (2, True), (8, False), (8, True)):
            label = f"{name}, {'FSDP' if sharded else 'DDP'} on {ranks}"
            parts = per_rank(ex, batch(ranks), ranks, sharded, ckpt)
            rows.append((fits_line(label, parts, card_bytes), label, parts))
    big = count(BIG_GPT, 1)["params"]
    rows.insert(4, (f"large GPT: {big / 1e9:.1f} billion parameters, {16 * big / GiB:,.0f} GiB of training state", "", {}))
    return rows
