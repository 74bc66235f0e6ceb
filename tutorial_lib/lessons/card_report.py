"""The card's one page (lessons/card.py measures it): a table for the notebook and the terminal, card.json and
card.md to paste into a ticket, and the sbatch file that trains the model at the recommended configuration."""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from . import bench, card_input, card_memory, card_verdict, ladder, noise
from .. import flops, jobs, peaks
from ..config import TrainConfig, UserError
from ..perfdoc import fmt
from ..results import atomic_write_text


@dataclass
class Card:
    name: str
    specs: dict  # how the model, batch and loss were named ("MODULE:FUNCTION" or None for objects)
    device: str
    torch_version: str
    probe: dict  # parameters, batch, shapes, FLOPs per sample, gradient bytes (card.probe_model)
    bench: dict  # IO / SYNTHETIC / FULL figures with their windows, the bound and the verdict
    rows: list  # one per rung (lessons.ladder's row), skipped and failed ones with their reason
    verdicts: dict  # rung -> its samples/s against the row it changes (lessons.noise)
    recommended: dict  # rung, the keys it changes, its row
    memory: dict  # largest_batch and why
    ddp: dict  # gradient bytes, bandwidth, predicted efficiencies
    job: dict  # path of the sbatch file, or why there is none
    wall_s: float

    @classmethod
    def build(cls, specs, probe, bench_result: bench.BenchResult, rows, rec, memory, ddp, job, wall_s) -> "Card":
        import torch

        figures = {m: asdict(f) for m, f in bench_result.figures.items()}
        recommended = {k: v for k, v in rec.items() if k != "config"}
        return cls(specs["name"], specs, probe["device"], torch.__version__, probe,
                   {"figures": figures, "bound": bench_result.bound, "verdict": _bound_only(bench_result.verdict),
                    "waited": bench_result.full_data_wait_fraction},
                   rows, ladder.verdicts(rows), recommended, memory, ddp, job, wall_s)

    # ------------------------------------------------------------------------------------ the page
    def bound_line(self) -> str:
        """What bounds the step, judged from the stored windows with today's rule (bench.verdict, without its
        advice), so that a card written by an older bench prints its figures as the row above it does."""
        f = {m: _measurement(fig) for m, fig in self.bench["figures"].items()}
        if "io" not in f or "synthetic" not in f:
            return self.bench["verdict"] or "-"
        return _bound_only(bench.verdict(f, TrainConfig(), self.probe.get("device_type", "cuda"),
                                         self.bench.get("waited"))[1])

    def summary_rows(self) -> list[tuple[str, str]]:
        """The table under the verdict: short cells (card_verdict.CELL_WORDS); what needs more words is in notes()."""
        p, rec, r = self.probe, self.recommended, self.recommended["row"]
        f = self.bench["figures"]
        io_syn_full = " / ".join(_band(f[m]) if m in f else "-" for m in bench.MEASURES)
        largest = self.memory["largest_batch"]
        alone = self.ddp.get("one_process") or {"why": "not measured"}
        return [
            ("model", f"{self.specs.get('model') or self.name}: {p['params']:,} parameters; input {p['input']} -> "
                      f"output {p['output']}"),
            ("batches", f"{p['source']}; batch {p['batch']}; target {p['target']}; loss "
                        f"{self.specs['loss'] or self.specs['loss_rule']}"),
            ("IO / SYNTHETIC / FULL (fp32, samples/s)", io_syn_full),
            ("what bounds the step", self.bound_line()),
            ("FLOPs per sample: forward / training step", _flops_cells(p)),
            ("recommended", self.recommended_line()),
            ("peak memory (recommended, batch %d)" % p["batch"], f"{fmt(r.get('peak_mb'), ',.0f', 'n/a on a CPU')}"
                                                                 + (" MiB" if r.get("peak_mb") else "")),
            ("largest batch that fits", f"{largest:,} ({self.memory['why']})" if largest else self.memory["why"]),
            ("largest batch with activation checkpointing", card_memory.checkpointed_cell(self.memory, p["batch"])),
            ("memory per GPU: DDP, FSDP2", card_memory.fsdp_cell(self.memory)),
            ("gradients all-reduced per step", f"{_mb(p['grad_bytes'])} (fp32)"),
            ("all-reduce bus bandwidth", card_verdict.bandwidth_cell(self)),
            ("DDP in one process (its own cost)", one_process_line(alone)),
            (f"DDP efficiency predicted ({_units(p)})", card_verdict.predicted_cell(self)),
            ("DDP efficiency measured", measured_line(self.ddp.get("measured") or {"why": "not measured"},
                                                      self.ddp["rows"])),
            ("training job", self.job.get("path") or self.job["why"]),
        ]

    def recommended_line(self) -> str:
        """The recommended rung, what it changes from fp32 and its figures (the rest is in notes())."""
        rec, r = self.recommended, self.recommended["row"]
        changes = " ".join(f"{k}={_word(v)}" for k, v in rec["changes"].items()) or "the fp32 baseline as it is"
        return f"{rec['rung']}: {changes} -> {r['img_s']:,.1f} samples/s, x{r['speedup']:.2f} fp32"

    def notes(self) -> list[str]:
        """What the short cells leave out: how the FLOPs were counted, the recommendation against the fastest rung and
        the changes it keeps, what DDP's own cost is, which end of the prediction applies, the formula."""
        rec, r, p = self.recommended, self.recommended["row"], self.probe
        out = [f"FLOPs: {p['flops_how']}."] if p.get("flops_how") else []
        if rec["fastest"] != rec["rung"]:
            best = next(x for x in self.rows if x["rung"] == rec["fastest"])
            said = noise.compare(ladder.figure(r), ladder.figure(best))
            out.append(f"The recommendation against the fastest rung, {rec['fastest']}: {said}, {said.words()}.")
        if rec.get("dropped"):
            out.append(f"Left out of the recommendation, measured slower than the row each changed: "
                       f"{', '.join(rec['dropped'])}; the recommendation without them was trained and timed as such.")
        if rec.get("kept_slower"):
            out.append(f"Kept although measured slower: {', '.join(rec['kept_slower'])} ("
                       f"{rec.get('why_kept') or 'the configuration above needs it'}).")
        kept = self.kept_without_gain()
        if kept:
            out.append("The rungs stack, so the recommendation carries every change below it, among them these, which "
                       "gained nothing beyond noise where they were added: " +
                       ", ".join(f"{k} ({self.judged()[k]})" for k in kept) + ".")
        alone = self.ddp.get("one_process") or {"why": "not measured"}
        if alone.get("why") is None:
            out.append(f"DDP in one process: what {ddp_work(rec.get('changes') or {})} every rank before any byte "
                       "travels to another.")
        out.append("The predicted range runs from nothing overlapping to the all-reduce hidden behind the backward "
                   "pass" + ("; each rank's step is DDP's in one process" if alone.get("why") is None
                             else "; DDP's own cost is left out") + _overlap_note(rec.get("changes") or {})
                   + _floor_note(p, self.ddp["bandwidth"]) + ".")
        estimate = card_memory.estimate_note(self.memory)
        out += [estimate] if estimate else []
        out.append(card_verdict.formula(self))
        flagged = measured_flag(self.ddp.get("measured") or {}, self.ddp["rows"])
        return out + ([flagged] if flagged else [])

    def judged(self) -> dict:
        """rung -> its verdict against the row it changes by today's rule (ladder.verdicts), from the stored rows:
        a card stored by an older workbook keeps the words of its day in `verdicts`, the page judges again."""
        return ladder.verdicts(self.rows)

    def kept_without_gain(self) -> list[str]:
        """The measured rungs up to the recommended one (their changes stack in it) that were not faster than the row
        they change by the rule (noise.relation)."""
        rows, upto = [x for x in self.rows if not x["skipped"]], self.recommended["rung"]
        rows = rows[:[x["rung"] for x in rows].index(upto) + 1]
        base = ladder.compared_with(self.rows)
        got = {x["rung"]: x for x in rows}
        left_out = self.recommended.get("dropped") or []
        return [x["rung"] for x in rows if x["rung"] in base and base[x["rung"]] in got and x["rung"] not in left_out
                and noise.relation(ladder.figure(x), ladder.figure(got[base[x["rung"]]])) != ">"]

    def rung_table(self) -> str:
        head = ["rung", "change", "samples/s (band)", "x fp32", "against the row it changes", "step ms",
                "peak MiB", "MFU (its precision)", "MFU (bf16 peak)", "compile s", "what caps it"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            if r["skipped"]:
                said = ("**failed**: " if r.get("failed") else "skipped: ") + r["skipped"]
                cells = [r["rung"], r["change"], card_verdict.short_cells([("", said)])[0][0][1]]
                cells += [""] * (len(head) - 3)
            else:
                fig = ladder.figure(r)
                cells = [r["rung"], r["change"], noise.shown(fig),
                         fmt(r.get("speedup"), ".2f"), self.judged().get(r["rung"], "-"), f"{r['step_ms']:.2f}",
                         fmt(r["peak_mb"], ",.0f"), _pct(r["mfu"]), _pct(self.mfu_of_reference(r)),
                         fmt(r["compile_s"], ".1f", "-"), card_input.cap_cell(r)]
            lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
        return "\n".join(lines)

    def mfu_of_reference(self, r: dict) -> float | None:
        """A rung's MFU against one peak for every rung, the card's bf16 dense peak, so that rungs compare."""
        ref, flops_per_sample = (peaks.dense_peaks(self.device) or {}).get("bf16"), self.probe.get("flops_per_sample")
        return r["img_s"] * flops_per_sample / (ref * 1e12) if ref and flops_per_sample and r.get("img_s") else None

    def precision_of(self, r: dict) -> str | None:
        """The precision a measured rung ran at (the peak its own MFU is against)."""
        return _precision(r, peaks.dense_peaks(self.device) or {}, self.probe)

    def peaks_note(self) -> str:
        """The peaks the two MFU columns divide by, and where they come from."""
        table = peaks.dense_peaks(self.device)
        if not table:
            return f"MFU is n/a: the workbook has no datasheet peak for {self.device}."
        used = [p for p in ("fp32", "tf32", "bf16", "fp16") if p in {_precision(r, table, self.probe) for r in self.rows}]
        named = ", ".join(f"{p} {table[p]:,.1f}" for p in used or ["bf16"])
        return (f"MFU is the training step's FLOPs per sample x samples/s over a dense peak of the {self.device}: "
                f"{named} TFLOP/s ({peaks.source(self.device)}, without sparsity). Each rung is divided by the peak of "
                f"the precision it runs; the bf16 column divides every rung by {table['bf16']:,.1f} TFLOP/s, so that "
                "rungs compare.")

    def markdown(self) -> str:
        head = f"## Card: {self.name} on {self.device} (torch {self.torch_version})"
        summary, long = card_verdict.short_cells(self.summary_rows())
        rows = ["| | |", "|---|---|"] + [f"| {k} | {str(v).replace('|', '/')} |" for k, v in summary]
        note = (f"Each rung is one change on top of the last rung that ran, and keeps every change below it. A rung's "
                f"figure is the mean of its steps, ± the 95% interval of that mean; two figures differ when the interval "
                f"of their ratio excludes 1 and, between two runs, by more than {100 * noise.FLOOR:.0f}%. Recommended is "
                f"the earliest rung not slower than the fastest. Measured in {self.wall_s:.0f} s"
                + self.phases() + ".")
        long += [f"{r['rung']}: {r['skipped']}" for r in self.rows
                 if r["skipped"] and len(r["skipped"].split()) > card_verdict.CELL_WORDS - 1]
        notes = [x for n in self.notes() + long for x in ("", n)]
        return "\n".join([head, "", *card_verdict.lines(self), "", *rows, "", self.rung_table(), "", note, "",
                          self.peaks_note(), *notes])

    def phases(self) -> str:
        """Where the card's seconds went: ': the rungs 120 s, the largest-batch search 9.4 s, measuring DDP 80 s'
        (each part the card timed; '' when it timed none)."""
        parts = [("the rungs", sum(r.get("wall_s") or 0 for r in self.rows) or None),
                 ("the largest-batch search", self.memory.get("search_s")),
                 ("with activation checkpointing", (self.memory.get("checkpointed") or {}).get("search_s")),
                 ("measuring DDP", (self.ddp.get("measured") or {}).get("wall_s"))]
        said = [f"{what} {s:.0f} s" if s >= 10 else f"{what} {s:.1f} s" for what, s in parts if s]
        return (": " + ", ".join(said)) if said else ""

    def __repr__(self) -> str:
        return self.markdown()

    def _repr_markdown_(self) -> str:  # a notebook shows the page as a table
        return self.markdown()

    def save(self, out) -> tuple[Path, Path]:
        record = {k: v for k, v in asdict(self).items()}
        return (atomic_write_text(Path(out) / "card.json", json.dumps(record, indent=1, default=str)),
                atomic_write_text(Path(out) / "card.md", self.markdown() + "\n"))


def reference_pages(folder: str | Path | None = None) -> dict[Path, str]:
    """notebooks/reference/07_card_<model>.md, each the page of the card.json that scripts/gpu/cards.sh wrote on a
    GPU node, kept in cards/card_<model>.json: rendered again from its stored figures, so that the pages read as
    today's card prints them. The job is named by its file name (the node's folder was not kept)."""
    from .. import reference

    where = Path(folder or reference.FOLDER)
    pages = {}
    for path in sorted((where / "cards").glob("card_*.json")):
        record = json.loads(path.read_text())
        if record["job"].get("path"):
            record["job"] = {**record["job"], "path": f"{Path(record['job']['path']).name} (beside card.json)"}
        pages[where / f"07_{path.stem}.md"] = Card(**record).markdown() + "\n"
    return pages


def write_reference_pages(folder: str | Path | None = None) -> list[Path]:
    """Write reference_pages (python -c 'from tutorial_lib.lessons import card_report as c; c.write_reference_pages()'),
    then docs/performance.md (python -m tutorial_lib ladder --doc), which shows them."""
    return [atomic_write_text(path, text) for path, text in reference_pages(folder).items()]


def measured_line(measured: dict, predicted: list[dict]) -> str:
    """The card's row "DDP efficiency measured" (lessons/card_ddp.py measures it): the efficiency beside the
    predicted range for the same GPU count, or why there is none."""
    if measured.get("why"):
        return measured["why"]
    n, unit = measured["gpus"], measured.get("unit", "GPUs")
    pred = next((p for p in predicted if p["gpus"] == n), None)
    beside = f"; predicted {_ends(pred)}" if pred else ""
    return (f"{measured['efficiency']:.2f} on {n} {unit} ({measured['ddp_samples_s']:,.1f} samples/s against "
            f"{n} x {measured['one_gpu_samples_s']:,.1f} on 1){beside}")


def measured_flag(measured: dict, predicted: list[dict]) -> str | None:
    """A note where the measured efficiency lies outside the range predicted for the same GPU count."""
    pred = next((p for p in predicted if p["gpus"] == measured.get("gpus")), None)
    if measured.get("why") or not pred or measured.get("efficiency") is None:
        return None
    if round(measured["efficiency"], 2) < round(pred["efficiency_exposed"], 2):
        return ("DDP measured below the predicted range. The prediction leaves out what it does not model: "
                "communication and compute slowing each other on the GPU, and ranks waiting for the slowest one.")
    if round(measured["efficiency"], 2) > round(pred["efficiency_hidden"], 2):
        return ("DDP measured above the predicted range: the step and the bandwidth it was predicted from were "
                "measured in other runs.")
    return None


def one_process_line(alone: dict) -> str:
    """The card's row "DDP in one process": the recommendation as DDP with no other rank (card_ddp.one_process)
    against the recommendation, or why it was not measured (what it costs is a note: ddp_work)."""
    if alone.get("why"):
        return alone["why"]
    r = alone["row"]
    words = {"<": "slower", "≈": "within noise", ">": "faster: counted as no cost",
             "?": "not settled"}[alone["relation"]]
    return f"x{alone['factor']:.2f} of the recommendation ({words}): {r['img_s']:,.1f} samples/s, step {alone['step_ms']:.2f} ms"


def ddp_work(changes: dict) -> str:
    """What the engine's DDP adds to the step of a configuration that changes `changes` (engine.Run.wrap), with its
    verb: DDP's module with its hooks and buckets, or, with the whole step as one CUDA graph, no DDP module at all."""
    cfg = TrainConfig(parallel="ddp", **{k: v for k, v in changes.items() if k in TrainConfig.__dataclass_fields__})
    if cfg.cuda_graph:
        return ("DDP's work, done by hand inside the step's CUDA graph (no DDP module: rank 0's buffers broadcast, the "
                "gradients packed into one buffer and all-reduced after the backward pass), costs")
    if cfg.sync_mode() == "flat":
        return "DDP's module and one flat all-reduce of the gradients after the backward pass cost"
    return "DDP's gradient hooks and buckets" + (" (and a compiled graph cut at the buckets)" if cfg.compile else "") + " cost"


def _ends(pred: dict) -> str:
    """A predicted efficiency's two ends ("0.48-0.79"), or one figure where they print the same ("0.10")."""
    lo, hi = f"{pred['efficiency_exposed']:.2f}", f"{pred['efficiency_hidden']:.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _bound_only(verdict: str | None) -> str | None:
    """The bench's verdict without its generic advice (the rungs of the card measure each change instead)."""
    if not verdict:
        return None
    bound = verdict.replace("img/s", "samples/s").split("\n")[0].split(" — ")[0]
    return bound + "; the rungs below measure what each change buys" if "\n" in verdict or " — " in verdict else bound


def _band(m: dict) -> str:
    """A bench figure with the 95% interval of its mean, as the bench prints it (bench.figure: its windows)."""
    return noise.shown(bench.figure(_measurement(m)), bench.spec(m["img_s"]))


def _measurement(m: dict) -> bench.Measurement:
    return bench.Measurement(**{"per_rank_img_s": [], **m})


def _mb(nbytes: float) -> str:
    """Bytes in MB or kB of 1e6 and 1e3 bytes, the units of the bandwidth's GB/s (1e9 bytes) beside them, so that
    bytes over GB/s gives the time: 27,566,080 fp32 parameters are '110.3 MB'."""
    return f"{nbytes / 1e6:,.1f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:,.0f} kB"


def _word(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _pct(v: float | None) -> str:
    return fmt(v and 100 * v, ".1f") + ("%" if v else "")


def _precision(r: dict, table: dict, probe: dict) -> str | None:
    """The precision a measured rung ran at: stored with the row, or (a card stored before) the peak its MFU used."""
    if r.get("skipped") or not r.get("mfu"):
        return None
    if r.get("precision"):
        return r["precision"]
    if not table:
        return None
    peak = r["img_s"] * probe["flops_per_sample"] / r["mfu"] / 1e12
    return min(table, key=lambda p: abs(table[p] - peak))


def _flops_cells(p: dict) -> str:
    """Forward / training step FLOPs per sample (how they were counted is a note); a card stored before the forward
    was counted: its step alone."""
    if not p.get("flops_forward"):
        return _flops(p["flops_per_sample"])
    return f"{flops.short(p['flops_forward'])} / {flops.short(p['flops_per_sample'])}"


def _flops(v: float | None) -> str:
    if not v:
        return "n/a (no matmul or convolution counted)"
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if v >= scale:
            return f"{v / scale:,.2f} {unit}"
    return f"{v:,.0f} FLOP"


# ---------------------------------------------------------------------------------------- the job
def train_args(specs: dict) -> list[str] | None:
    """`MODEL --batch B [--loss L] --train`: the card's command line that trains the model (a job, a DDP measure);
    None when the model, batch or loss was given as an object with no MODULE:FUNCTION (no fresh process can build it)."""
    if not specs.get("model") or not specs.get("batch") or (specs["loss_rule"] == "yours" and not specs.get("loss")):
        return None
    return [specs["model"], "--batch", specs["batch"], *(["--loss", specs["loss"]] if specs.get("loss") else []), "--train"]


def job_command(specs: dict, cfg: TrainConfig, steps: int, out_dir: str) -> list[str] | None:
    """`python -m tutorial_lib card MODEL --batch B [--loss L] --train key=value ...`: the model trained with the
    recommended configuration; None when the model or batch was given as an object with no MODULE:FUNCTION."""
    args = train_args(specs)
    if args is None:
        return None
    keys = [o for o in cfg.to_overrides() if o.split("=", 1)[0] in
            ("precision", "channels_last", "optimizer_impl", "compile", "compile_mode", "cuda_graph", "optimizer", "lr",
             "weight_decay", "momentum", "num_workers", "seed")]
    return ["python", "-m", "tutorial_lib", "card", *args, f"steps={steps}", *keys, f"out_dir={out_dir}"]


def write_job(specs: dict, rec_cfg: TrainConfig, jobs_dir, site: str | None, steps: int) -> dict:
    """card_<model>.sbatch in `jobs_dir` (the card's folder; jobs/ holds the workbook's own jobs): one GPU training
    the model at the recommended configuration (jobs.write, with the site profile: $WORKBOOK_SITE or generic unless
    site= names one; its header names its own path)."""
    command = job_command(specs, rec_cfg, steps, f"runs/card_{specs['name']}_train")
    if command is None:
        return {"path": None, "why": "none: the model or the batch was given as an object; name them as "
                                     "MODULE:FUNCTION (a .py file or a module) to get a job"}
    try:
        path = jobs.write(f"card_{specs['name']}", command=command, site=site, gpus_per_node=1, jobs_dir=jobs_dir,
                          show=False, description=f"train {specs['model']} at the card's recommended configuration")
    except UserError as e:
        return {"path": None, "why": f"none: {e}"}
    return {"path": jobs.shown_path(path), "command": " ".join(shlex.quote(w) for w in command),
            "site": site or jobs.default_site()}


def _units(probe: dict) -> str:
    """What the prediction is for: GPUs on a GPU card, CPU processes (gloo) on a CPU, whose step and bandwidth it uses."""
    return "GPUs" if probe.get("device_type") == "cuda" else "CPU processes (gloo)"


def _overlap_note(changes: dict) -> str:
    """Which end the recommendation runs at as the engine's DDP: with the whole step as one CUDA graph, ddp_sync=auto
    all-reduces after the backward pass (engine.Run.graph_body), so nothing overlaps unless ddp_sync=buckets."""
    if not changes.get("cuda_graph"):
        return ""
    return ("; as one CUDA graph the recommendation all-reduces after the backward pass, at the first end "
            "(ddp_sync=buckets lets the all-reduce overlap the backward pass inside the graph)")


def _floor_note(probe: dict, bandwidth: dict) -> str:
    """What the prediction's figures were measured on, where it is not GPUs talking over their own link: a CPU card
    predicts for CPU processes; a GPU card whose all-reduce was timed between CPU processes (a node with one GPU)
    predicts for GPUs that talk no faster than that, which NVLink or PCIe GPUs do not."""
    if probe.get("device_type") != "cuda":
        return ("; from this CPU's step and gloo's bandwidth between CPU processes: it says nothing about GPUs, for "
                "which a card made on a GPU node predicts")
    if bandwidth.get("backend") != "gloo":
        return ""
    return ("; at the CPU floor above: GPUs joined by NVLink or PCIe all-reduce many times faster; on a node with 2 "
            "or more GPUs the card times their own link")
