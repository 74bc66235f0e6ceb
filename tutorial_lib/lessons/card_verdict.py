"""The card's verdict, its DDP outlook and the notes under its tables (lessons/card_report.py prints them).

The page opens with five lines: what bounds the step, the recommended configuration and its gain, MFU, memory
headroom, the DDP outlook. Every table cell stays short (at most CELL_WORDS words); what a cell would need more
words for is a note after the tables.
"""
from __future__ import annotations

from . import allreduce, card_input

CELL_WORDS = 30
SHORT_LINK = {"nvlink": "NVLink/NVSwitch", "pcie": "PCIe", "network": "network"}


def lines(card) -> list[str]:
    """The five lines of the verdict, each a markdown list item."""
    p, rec, r = card.probe, card.recommended, card.recommended["row"]
    bound = card.bound_line().split(";")[0]
    capped = card_input.verdict(card.rows, rec["rung"], (card.bench["figures"].get("io") or {}).get("img_s"))
    changes = " ".join(f"{k}={_word(v)}" for k, v in rec["changes"].items()) or "the fp32 baseline as it is"
    dropped = rec.get("dropped") or []
    ref = card.mfu_of_reference(r)
    precision = card.precision_of(r)
    mfu = ("n/a: no datasheet peak for this device" if not (r.get("mfu") and ref) else
           f"{100 * ref:.1f}% of the bf16 dense peak (see below)" if precision in ("bf16", "fp16") else
           f"{100 * r['mfu']:.1f}% of the {precision} peak, {100 * ref:.1f}% of the bf16 peak (see below)")
    largest = card.memory.get("largest_batch")
    memory = (f"{r['peak_mb']:,.0f} MiB at batch {p['batch']}; the largest batch that fits: {largest:,}"
              if r.get("peak_mb") and largest else card.memory["why"] if not r.get("peak_mb") else
              f"{r['peak_mb']:,.0f} MiB at batch {p['batch']}")
    outlook_ = (card.memory.get("outlook") or {})
    if outlook_.get("ddp_fits") is False:
        memory += "; DDP's training state does not fit one GPU: FSDP2's estimate is below"
    return [f"- **What bounds it**: {capped or bound}",
            f"- **Recommended**: {rec['rung']} ({changes}), {r['img_s']:,.1f} samples/s, x{r['speedup']:.2f} the "
            "fp32 baseline" + (f"; left out, measured slower: {', '.join(dropped)}" if dropped else ""),
            f"- **MFU**: {mfu}",
            f"- **Memory**: {memory}",
            f"- **DDP**: {outlook(card)}"]


def outlook(card) -> str:
    """The DDP line of the verdict: the measured efficiency where there is one, else the prediction's ends."""
    measured = card.ddp.get("measured") or {}
    if not measured.get("why") and measured.get("efficiency") is not None:
        return f"{measured['efficiency']:.2f} measured on {measured['gpus']} {measured.get('unit', 'GPUs')}"
    return predicted_cell(card)


def predicted_cell(card) -> str:
    """The predicted efficiencies in a few words: per link where a table gave the bandwidths, else per GPU count."""
    rows = card.ddp["rows"]
    if rows and rows[0].get("key"):
        return "; ".join(f"{SHORT_LINK.get(x['key'], x['key'])} {_ends(x)} on {x['gpus']}" for x in rows) + " GPUs"
    unit = "GPUs" if card.probe.get("device_type") == "cuda" else "CPU processes"
    return " / ".join(_ends(x) for x in rows) + f" on {'/'.join(str(x['gpus']) for x in rows)} {unit}"


def bandwidth_cell(card) -> str:
    b = card.ddp["bandwidth"]
    if b.get("backend") == "table":
        return "not measured: this node has 1 GPU; the prediction uses typical links (a site profile's interconnects)"
    return f"{_gb_s(b['bus_gb_s'])} between {b['where'].split(' (')[0]}, messages of {_bytes(b['nbytes'])}"


def formula(card) -> str:
    """The prediction's formula, once, with its inputs."""
    d = card.ddp
    alone = d.get("one_process") or {}
    step = d["step_ms"]
    ddp_step = max(step, alone["step_ms"]) if alone.get("why") is None and alone.get("step_ms") else step
    links = "; ".join(f"{x.get('name') or 'this node'} {_gb_s(x.get('bus_gb_s') or d['bandwidth']['bus_gb_s'])} "
                      f"({x.get('source', 'measured')})" for x in _one_per_link(d["rows"]))
    return (f"DDP's efficiency on n GPUs is the step over DDP's step plus the all-reduce time that the backward pass "
            f"does not hide. The all-reduce of B bytes takes B x 2(n-1)/n / bus bandwidth; the backward pass is "
            f"{allreduce.BACKWARD_SHARE:.2f} of a step. Here: step {step:.2f} ms, DDP's step {ddp_step:.2f} ms, "
            f"B = {_bytes(d['grad_bytes'])} of fp32 gradients, bus bandwidth: {links}.")


def _one_per_link(rows: list[dict]) -> list[dict]:
    seen, out = set(), []
    for x in rows:
        key = x.get("key") or "measured"
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def _bytes(n: float) -> str:
    """MB or kB of 1e6 and 1e3 bytes, the units of GB/s."""
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} kB"


def _gb_s(v: float) -> str:
    return f"{v:,.1f} GB/s" if v >= 10 else f"{v:.2f} GB/s" if v >= 0.1 else f"{v:.4f} GB/s"


def short_cells(rows: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
    """The summary's rows with every cell of more than CELL_WORDS words cut to its first words (a long failure
    message, a long reason), and the notes that give those cells whole."""
    short, notes = [], []
    for label, cell in rows:
        words = str(cell).split()
        if len(words) > CELL_WORDS:
            short.append((label, " ".join(words[:CELL_WORDS - 4]) + " ... (in full below)"))
            notes.append(f"{label[:1].upper()}{label[1:]}: {cell}")
        else:
            short.append((label, cell))
    return short, notes


def too_long(cells) -> list[str]:
    """The cells of more than CELL_WORDS words (a test holds every page to it)."""
    return [c for c in cells if len(str(c).split()) > CELL_WORDS]


def _ends(pred: dict) -> str:
    lo, hi = f"{pred['efficiency_exposed']:.2f}", f"{pred['efficiency_hidden']:.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _word(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
