"""The card: every measurement of the workbook asked of a model of yours, on one page (notebook 07).

    card = tl.card("my_models.py:make_model", "my_models.py:batch")      # or objects: tl.card(MyNet(), batch_fn)
    card = tl.card(torchvision.models.resnet50, images, precision=...)  # key=value: TrainConfig fields or the
                                                                         # card's own (CARD_KEYS)
    python -m tutorial_lib card my_models.py:make_model --batch my_models.py:batch [--loss MODULE:FUNCTION] [key=value ...]

What it measures, each with the workbook's own code: IO / SYNTHETIC / FULL and what bounds the step (lessons.bench,
in windows); the optimization ladder's rungs that apply to the model (lessons.ladder's rungs, each a training run
of engine.Run on your model: ownmodel.UserRun), each judged against the row it changes by lessons.noise and run
longer where the rule can't yet decide (lessons.card_decide), and run again on one resident batch where its steps
waited for yours (lessons.card_input); the FLOPs of one sample's forward pass and training step (flops.py: torch's
counter, checked) and MFU against the dense peak of each rung's precision and of bf16 (peaks.py); peak memory and,
on a GPU, the largest batch that fits; the gradient bytes, the all-reduce bus bandwidth (measured between this
node's GPUs, or typical links on a node with one: sites.interconnects) and the DDP efficiency they predict
(lessons.allreduce); a recommended configuration without the changes that measured slower, measured as
recommended, and an sbatch file that trains with it (jobs.py, with the site profile). The one page it prints is
card.md beside card.json in `out` (lessons/card_report.py, card_verdict.py). Sizes come from the one switch
(lessons.size).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import allreduce, bench, card_ddp, card_decide, card_input, card_memory, ladder, noise, size as size_switch
from .card_memory import largest_batch, search_batch  # noqa: F401  (the card's, and its tests')
from .card_report import Card, write_job
from .. import engine, flops, oom, ownmodel, sites
from ..config import TrainConfig, UserError, load
from ..meters import untimed_steps
from ..results import Result, make_folder
from ..values import is_whole

RUNGS = ("fp32", "tf32", "bf16", "channels_last", "fused_adamw", "compile", "step_graph")  # lessons.ladder's names
SPEED_KEYS = ("precision", "channels_last", "optimizer_impl", "compile", "compile_mode", "cuda_graph")


@dataclass(frozen=True)
class CardSizes:
    steps: int  # timed steps of each measure and each rung ...
    window: int  # ... in windows of this many (the spread)
    warmup: int  # untimed steps first (compiled rungs: at least meters.COMPILE_WARMUP)
    budget_s: float  # rungs that would start after this many seconds are skipped
    batch_cap: int  # the largest-batch search stops here (GPU)
    settle: bool = True  # run longer a rung the rule can't yet tell from its row, while the budget lasts
    checkpointed_s: float = 0  # the largest-batch search with activation checkpointing stops after this (GPU)


SMALL = CardSizes(steps=6, window=2, warmup=1, budget_s=90, batch_cap=0, settle=False)
# one H200 (ResNet-50): probe and bench ~15 s, the rungs <= 90 s (75 before any is settled), the recommendation and
# DDP in one process ~10-35 s each (compiled again), the two largest-batch searches ~10 + <= 15 s: about 170 s
FULL = CardSizes(steps=30, window=6, warmup=5, budget_s=90, batch_cap=4096, checkpointed_s=15)
# the card's own keys (everything else is a TrainConfig field, the base of every rung)
CARD_KEYS = {"steps": "timed steps per measure", "window": "steps per timed window", "warmup": "untimed steps first",
             "out": "folder of card.json, card.md, the runs and the job", "site": "site profile of the job",
             "rungs": "comma list: measure only these rungs (fp32 always)", "compile_on_cpu": "compile on a CPU too",
             "jobs_dir": "folder of the job's sbatch file (default: out)",
             "job_steps": "steps of the training job",
             "ddp_gpus": "DDP measured beside the prediction on this many: auto (2 or 4 GPUs where the node has them), 0, N"}


# ---------------------------------------------------------------------------------------- the call
def card(model: Any, batch: Any = None, loss: Any = None, *, small: bool | None = None, quiet: bool = False,
         **overrides) -> Card:
    """Measure the card of `model` on `batch` (see the module's docstring) and write card.json and card.md.
    model: an nn.Module (copied for every run), a function or class that builds one, or 'MODULE:FUNCTION';
    batch: a batch (input, target), a function returning one, a Dataset, a DataLoader, or 'MODULE:FUNCTION'
    (None: the function `batch` of the model's module); loss: (output, target) -> scalar, or 'MODULE:FUNCTION'."""
    started = time.perf_counter()
    opts, cfg = split_overrides(overrides)
    sizes = sized(size_switch.current(small), opts)
    ddp_gpus, no_ddp = card_ddp.gpus_to_measure(opts.get("ddp_gpus"))  # a bad value fails here, before any work
    parts, specs = user_parts(model, batch, loss)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    probe = probe_model(parts, cfg)
    if specs["name"].startswith(("make", "build", "create", "get", "model")) or isinstance(model, nn.Module):
        specs["name"] = _slug(probe["class"])  # make_model: say what it makes
    out = Path(opts.get("out", f"runs/card_{specs['name']}"))
    make_folder(out, f"out={str(out)!r}", "give a folder you can write")
    say(f"card of {specs['name']}: {probe['params']:,} parameters, batch {probe['batch']}, input "
        f"{probe['input']} -> output {probe['output']} on {probe['device']}")
    cfg = cfg.replace(batch_size=probe["batch"], num_workers=probe["workers"], out_dir=str(out / "runs"))
    bench_result = measure_bench(parts, cfg, sizes)
    say(bench_result.summary().replace("img/s", "samples/s"))
    plan = rung_plan(cfg, probe, opts.get("rungs"), opts.get("compile_on_cpu", False))
    rows = measure_rungs(parts, plan, sizes, say, card_input.resident_parts(parts, cfg))
    rec = card_decide.recommendation(rows, plan, recommend(rows, plan), lambda c: measure_rung(
        parts, card_decide.RECOMMENDED, timed(c, sizes)), SPEED_KEYS)  # without what measured slower, measured
    memory = largest_batch(parts, rec["config"], probe, sizes.batch_cap, sizes.checkpointed_s)
    alone = card_ddp.one_process(lambda c: measure_rung(parts, card_ddp.ONE_PROCESS, timed(c, sizes)), rec)
    ddp = predict_ddp(probe, rec["row"], alone, opts.get("site"))
    ddp["measured"] = card_ddp.measure(specs, rec["config"], ddp_gpus, no_ddp, sizes, out)
    job = write_job(specs, rec["config"], opts.get("jobs_dir", out), opts.get("site"), int(opts.get("job_steps", 1000)))
    result = Card.build(specs, probe, bench_result, rows, rec, memory, ddp, job, time.perf_counter() - started)
    result.save(out)
    say(result.markdown(), f"\nwrote {out / 'card.json'} and {out / 'card.md'}")
    return result


def train(model: Any, batch: Any = None, loss: Any = None, **overrides) -> Result:
    """Train `model` on `batch` with the engine (tl.train's loop, ownmodel.UserRun) at `overrides` (TrainConfig
    fields): what the card's job runs with the recommended configuration. Writes <out_dir>/result.json."""
    parts, _ = user_parts(model, batch, loss)
    cfg = load(None, {"eval": False, "tensorboard": False, **overrides})
    probe = probe_model(parts, cfg)
    cfg = cfg.replace(batch_size=probe["batch"], num_workers=probe["workers"])
    with engine.prepared_run(cfg, parts.make_run) as run:
        return run.fit()


def split_overrides(overrides: dict) -> tuple[dict, TrainConfig]:
    """The card's own keys, and the base TrainConfig from the rest (a bad key or value fails here, at once)."""
    opts = {k: v for k, v in overrides.items() if k in CARD_KEYS}
    base = {"eval": False, "tensorboard": False, "progress": False, "resume": False, "optimizer_impl": "foreach"}
    cfg = load(None, {**base, **{k: v for k, v in overrides.items() if k not in CARD_KEYS}})
    opts["rungs"] = _names(opts.get("rungs"))
    if "compile_on_cpu" in opts:
        opts["compile_on_cpu"] = load(None, {"compile": opts["compile_on_cpu"]}).compile  # true/false as TrainConfig reads
    for key in ("steps", "window", "warmup", "job_steps"):
        least = 0 if key == "warmup" else 1  # warmup=0 times every step; a window of 0 steps times nothing
        if key in opts and not (is_whole(opts[key]) and int(opts[key]) >= least):
            raise UserError(f"{key}={opts[key]!r}: the {CARD_KEYS[key]} must be a whole number >= {least}; give "
                            f"{key}={least} or more")
    return opts, cfg


def sized(size: size_switch.Size, opts: dict) -> CardSizes:
    sizes = size.pick(SMALL, FULL)
    changes = {k: int(opts[k]) for k in ("steps", "window", "warmup") if k in opts}
    sizes = dataclasses.replace(sizes, **changes)
    if sizes.steps < sizes.window:
        raise UserError(f"steps={sizes.steps} is shorter than one window of {sizes.window}; raise steps or lower window")
    return sizes


def _names(text: Any) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNGS]
    if unknown:
        raise UserError(f"rungs={text!r}: no rung {unknown[0]!r}; the card's rungs are {', '.join(RUNGS)}")
    return names


# ---------------------------------------------------------------------------------------- what the user gave
def user_parts(model: Any, batch: Any, loss: Any) -> tuple[ownmodel.Parts, dict]:
    """The model factory, batch source and loss as ownmodel.Parts, and how each was named (for the job)."""
    model_spec = model if isinstance(model, str) else ownmodel.spec_of(model)
    if isinstance(model, str):
        model = ownmodel.resolve(model, "model")
    if isinstance(model, nn.Module):
        instance, name = model, type(model).__name__
        factory = lambda: copy.deepcopy(instance)  # noqa: E731  (every run starts from the same weights)
        model_spec = None
    elif callable(model):
        named = getattr(model, "func", model)  # functools.partial(torchvision.models.resnet50, num_classes=10)
        factory, name = model, getattr(named, "__name__", type(named).__name__)
    else:
        raise UserError(f"model is a {type(model).__name__}; give an nn.Module, a function or class that builds "
                        "one, or 'MODULE:FUNCTION'")
    if batch is None:
        if not isinstance(model_spec, str) or ":" not in model_spec:
            raise UserError("no batch given; give batch= (or --batch MODULE:FUNCTION): a function returning "
                            "(input, target), a Dataset or a DataLoader")
        batch = model_spec.rsplit(":", 1)[0] + ":batch"
    batch_spec = batch if isinstance(batch, str) else ownmodel.spec_of(batch)
    source = source_of(ownmodel.resolve(batch, "batch") if isinstance(batch, str) else batch)
    loss_spec = loss if isinstance(loss, str) else ownmodel.spec_of(loss) if loss is not None else None
    loss_fn = ownmodel.resolve(loss, "loss") if isinstance(loss, str) else loss
    if loss_fn is not None and not callable(loss_fn):
        raise UserError(f"loss is a {type(loss_fn).__name__}; give a function (output, target) -> scalar tensor")
    specs = {"name": _slug(name), "model": model_spec, "batch": batch_spec, "loss": loss_spec,
             "loss_rule": "yours" if loss_fn is not None else "default (cross-entropy or MSE by the target)"}
    return ownmodel.Parts(factory, source, loss_fn), specs


def source_of(batch: Any) -> Any:
    """A function that returns a Dataset or DataLoader (rather than a batch) is called once here: its result is
    the source. A function returning a batch is the source itself, called once per step."""
    if callable(batch) and not isinstance(batch, (torch.utils.data.Dataset, torch.utils.data.DataLoader)):
        try:
            first = batch()
        except TypeError as e:
            raise UserError(f"the batch function {getattr(batch, '__name__', batch)!r} can't be called without "
                            f"arguments ({e}); give a function of no arguments (functools.partial binds them)") from None
        if isinstance(first, (torch.utils.data.Dataset, torch.utils.data.DataLoader)):
            return first
    return batch


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")[:40] or "model"


# ---------------------------------------------------------------------------------------- the probe
def probe_model(parts: ownmodel.Parts, cfg: TrainConfig) -> dict:
    """One training step of a fresh model on the first batch, on the run's device, under torch's FLOP counter:
    checks every rule of ownmodel at once (before anything is timed) and describes the model."""
    device = engine.distributed.pick_device(cfg.device)
    inp = ownmodel.UserInput(parts.source, cfg.batch_size, 0, False)
    saved: dict = {}
    batches = inp.epoch(0)
    x, y = next(batches)
    for _ in range(min(2, inp.steps_per_epoch - 1)):  # shapes that vary show in the first batches: say so now
        next(batches)
    batches.close()
    model = ownmodel.check_model(parts.factory()).to(device)
    xd, yd = x.to(device), y.to(device)
    try:  # the autotuner as the rungs will run it: PyTorch keeps the algorithm each convolution ran with first,
        # so a probe with it off would leave its untuned choice to every rung of the same shape (notebook 01)
        with engine.backend_flags(), flops.Counter() as counter, _countable_attention(device):
            engine.set_cudnn_benchmark(cfg)
            with card_memory.saved_activations(model, saved):  # the activations' bytes (card_memory.outlook)
                output = model(xd)
                described = _describe(output)
                loss = ownmodel.check_loss(parts.loss(output, yd)) if parts.loss else ownmodel.default_loss(output, yd)
            counter.forward_done()
            loss.backward()
    except UserError:
        raise
    except torch.cuda.OutOfMemoryError as e:  # one line: the batch, the peak, the card's memory, the fix
        raise oom.OutOfMemory(oom.message(e, device, int(x.shape[0]), cfg.precision)) from None
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        line = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"one training step of the model on a batch of input {tuple(x.shape)} {x.dtype} and target "
                        f"{tuple(y.shape)} {y.dtype} failed: {type(e).__name__}: {line}") from None
    grads = [p for p in model.parameters() if p.requires_grad]
    convs = any(isinstance(m, nn.Conv2d) for m in model.modules()) and x.dim() == 4 and x.is_floating_point()
    source = parts.source
    loader = inp.loader
    step = counter.result(x.shape[0])  # checked: flops.py's one rule
    parts.flops_per_sample = step.train or None
    return {"device": engine.device_name(device), "device_type": device.type, "batch": int(x.shape[0]),
            "class": type(model).__name__,
            "input": f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}",
            "target": f"{tuple(y.shape)} {str(y.dtype).replace('torch.', '')}", "output": described,
            "params": sum(p.numel() for p in grads), "grad_bytes": sum(p.numel() * p.element_size() for p in grads),
            "convolutions": convs, "flops_per_sample": parts.flops_per_sample,
            "flops_forward": step.forward or None, "flops_how": step.how,
            "activation_bytes": saved["bytes"], "checkpointed_activation_bytes": saved["checkpointed_bytes"],
            "block_bytes": card_memory.largest_block_bytes(model), "blocks": len(card_memory.blocks.find(model)),
            "source": type(loader.dataset).__name__ + " in a DataLoader" if loader is not None else
            "a function, called every step" if callable(source) else "one batch, reused every step",
            "workers": cfg.num_workers if isinstance(source, torch.utils.data.Dataset) else
            loader.num_workers if loader is not None else 0}


def _countable_attention(device: torch.device):
    """torch's FLOP counter knows the CUDA kernels of scaled_dot_product_attention but not the CPU's fused one
    (it counts 0 there): on a CPU the probe runs attention as its plain matmuls, which it counts."""
    if device.type == "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


def _describe(output: Any) -> str:
    if isinstance(output, torch.Tensor):
        return f"{tuple(output.shape)}"
    return type(output).__name__


# ---------------------------------------------------------------------------------------- the measures
def measure_bench(parts: ownmodel.Parts, cfg: TrainConfig, sizes: CardSizes) -> bench.BenchResult:
    """IO / SYNTHETIC / FULL (lessons.bench) of the model at fp32, on the engine with the user's parts."""
    with oom.one_line(engine.distributed.pick_device(cfg.device), cfg.batch_size, "fp32"):  # SYNTHETIC's steps
        return bench.bench(cfg.replace(out_dir=f"{cfg.out_dir}/bench", precision="fp32"), sizes.steps, sizes.window,
                           sizes.warmup, make_run=parts.make_run)


def rung_plan(cfg: TrainConfig, probe: dict, only: list[str] | None, compile_on_cpu: bool) -> list[tuple]:
    """The ladder's rungs that apply, each (Rung, config, why it is left out or None), one change on top of the
    last rung that runs or that `only` leaves out (its change is kept: rungs=step_graph measures the ladder's
    step_graph)."""
    cuda = probe["device_type"] == "cuda"
    current = cfg.replace(precision="fp32", channels_last=False, optimizer_impl="foreach", compile=False,
                          compile_mode="default", cuda_graph=False)
    plan = []
    for rung in (r for r in ladder.rungs(ladder.GPU) if r.name in RUNGS):
        if rung.name == "fused_adamw":
            rung = dataclasses.replace(rung, change=f"fused {cfg.optimizer} (one kernel) instead of foreach")
        reason = None
        try:
            run_cfg = current.replace(**rung.overrides, out_dir=f"{cfg.out_dir}/{rung.name}")
        except UserError as e:  # e.g. a CUDA graph without the fused optimizer, when that rung was left out
            run_cfg, reason = current, f"not on the rungs that run: {e}"
        if not cuda and rung.cpu_note:
            reason = rung.cpu_note
        elif rung.name == "channels_last" and not probe["convolutions"]:
            reason = "no 2-d convolution on 4-d float input: nothing to lay out"
        elif not cuda and rung.overrides.get("compile") and not compile_on_cpu:
            reason = "torch.compile takes minutes on a small CPU (compile_on_cpu=true includes it)"
        elif only and rung.name not in only and rung.name != "fp32":
            current = run_cfg  # not measured, but the rungs above build on its change, as on the whole ladder
            reason = "left out (rungs=...): its change is kept for the rungs above"
        if reason is None:
            current = run_cfg
        plan.append((rung, run_cfg, reason))
    return plan


def measure_rungs(parts: ownmodel.Parts, plan: list[tuple], sizes: CardSizes, say,
                  resident: ownmodel.Parts | None = None) -> list[dict]:
    """Each rung a training run (engine.Run.fit with the user's parts); a rung that fails is a row with its one-line
    reason, and the rungs above it build on the last one that ran. A rung whose steps waited for batches is run
    again on one `resident` batch: the model alone (lessons.card_input)."""
    rows, start = [], time.perf_counter()
    for rung, planned, reason in plan:
        if reason is None and time.perf_counter() - start > sizes.budget_s:
            reason = f"the card's time budget ({sizes.budget_s:.0f} s) was spent"
        cfg = timed(planned, sizes)
        row = ladder.skipped_row(rung, cfg, reason) if reason else measure_rung(parts, rung, cfg)
        row = card_input.add_resident(row, resident and (lambda n: measure_rung(  # noqa: B023 (called at once)
            resident, rung, timed(planned, card_decide.sized(sizes, n)).replace(out_dir=f"{cfg.out_dir}_resident"))),
            sizes.steps)
        rows.append({**row, "precision": cfg.precision})  # the peak its MFU is against (card_report.peaks_note)
        say(ladder.row_line(row).replace("img/s", "samples/s"))
    if sizes.settle:  # what is left of the budget: the rungs the rule can't yet tell apart, run longer
        rows = card_decide.settle_all(rows, plan, lambda rung, cfg, n: card_input.add_resident(
            measure_rung(parts, rung, timed(cfg, card_decide.sized(sizes, n))), None, n), start + sizes.budget_s)
    ladder.add_speedups(rows)
    return rows


def timed(cfg: TrainConfig, sizes: CardSizes) -> TrainConfig:
    """`cfg` run for the card's untimed steps, then its timed ones, logged once at the end."""
    warm = untimed_steps(cfg, sizes.warmup)
    return cfg.replace(steps=warm + sizes.steps, timing_warmup=warm, log_every=warm + sizes.steps)


def measure_rung(parts: ownmodel.Parts, rung, cfg: TrainConfig) -> dict:
    if cfg.compile:
        torch._dynamo.reset()  # each compiled rung compiles afresh: its compile time is its own
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), engine.prepared_run(cfg, parts.make_run) as run:
            result = run.fit()
    except Exception as e:  # noqa: BLE001  (a rung that fails is a finding: its row says why, in one line)
        if rung.name == "fp32":
            raise
        row = ladder.skipped_row(rung, cfg, f"failed: {failure_line(e)}")
        return {**row, "failed": True}
    return ladder.row(rung, cfg, result, time.perf_counter() - t0)


def failure_line(e: BaseException) -> str:
    """An exception in one line: its type and the first line that says something (a graph break, dynamic
    shapes, an unsupported op)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().startswith(("from user code",
                                                                                                    "File "))]
    return f"{type(e).__name__}: {(lines or ['(no message)'])[0][:220]}"


# ---------------------------------------------------------------------------------------- the advice
def recommend(rows: list[dict], plan: list[tuple]) -> dict:
    """The earliest rung within noise of the fastest one (as fast as the noise rule can tell; the rungs stack, so it
    keeps every change below it, one that measured slower too: the page names those), its config and the
    keys it changes from the fp32 rung."""
    measured = [r for r in rows if not r["skipped"]]
    best = max(measured, key=lambda r: r["img_s"])
    pick = next(r for r in measured if noise.relation(ladder.figure(r), ladder.figure(best)) != "<")
    configs = {rung.name: cfg for rung, cfg, _ in plan}
    fp32, chosen = configs["fp32"], configs[pick["rung"]]
    changes = {k: getattr(chosen, k) for k in SPEED_KEYS if getattr(chosen, k) != getattr(fp32, k)}
    return {"rung": pick["rung"], "fastest": best["rung"], "row": pick, "config": chosen, "changes": changes}


def predict_ddp(probe: dict, row: dict, alone: dict, site: str | None = None) -> dict:
    """The gradient bytes, the all-reduce bandwidth and the DDP efficiency they predict, each rank's step being DDP's
    in one process (`alone`, card_ddp.one_process) where it was measured. The bandwidth: measured between the GPUs
    of this node (NCCL) or, on a CPU, between 2 processes (gloo); on a node with one GPU, the links a job would run
    on (sites.interconnects: typical figures, or the site profile's), each predicted for its GPUs."""
    step_ms = 1000 * row["batch"] / row["img_s"]
    ddp_step = card_ddp.predicted_step_ms(alone, step_ms)
    out = {"grad_bytes": probe["grad_bytes"], "step_ms": step_ms, "one_process": alone}
    if probe["device_type"] == "cuda" and torch.cuda.device_count() < 2:
        rows = [{**allreduce.predict(step_ms, probe["grad_bytes"], link["bus_gb_s"], (link["gpus"],), ddp_step)[0],
                 **link} for link in sites.interconnects(sites.load_site(site))]
        return {**out, "rows": rows, "bandwidth": {"bus_gb_s": None, "nbytes": None, "ranks": None,
                                                   "backend": "table", "where": "typical links"}}
    bw = allreduce.measure(min(probe["grad_bytes"], (64 if probe["device_type"] == "cuda" else 4) * 2**20))
    return {**out, "bandwidth": dataclasses.asdict(bw),
            "rows": allreduce.predict(step_ms, probe["grad_bytes"], bw.bus_gb_s, ddp_step_ms=ddp_step)}
