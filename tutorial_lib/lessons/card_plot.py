"""A picture of a card (tl.card, notebook 07): its rungs' samples/s and their MFU against one peak, beside its
five-line verdict; and one rung of two cards compared like with like.

    tl.card_plot.show(card)            # the verdict, the picture, the path of the whole page (card.md)
    tl.card_plot.plot(card)            # the picture alone: a Card, a card.json record or its path
    tl.card_plot.versus(card, again, "fp32", "sequences")   # the same rung of two cards, both sides named

The picture: one bar per measured rung (samples/s, the mean with its 95% interval), the recommended rung dark; a
rung your batches cap (the model alone faster, lessons.card_input) hatched, with a diamond at the model alone;
and, on a card with a datasheet peak, every rung's MFU against the card's bf16 dense peak, so that rungs compare
(each rung's MFU against its own precision's peak is in the page's table).
"""
from __future__ import annotations

from pathlib import Path

from . import card_input, card_verdict, ladder, noise
from .card_report import Card
from .. import peaks
from ..config import UserError
from ..results import atomic_write_text, make_folder, read_record


def as_card(card) -> Card:
    """A Card from a Card, a card.json record (a dict) or the path of a card.json."""
    if isinstance(card, Card):
        return card
    if isinstance(card, (str, Path)):
        path = Path(card)
        if not path.is_file():
            raise UserError(f"card={str(card)!r}: no such card.json; give a Card, its record or the path of a "
                            "card.json (tl.card writes one into runs/card_<model>/)")
        card = read_record(path, "a card's record (card.json)", "run the card again: tl.card(...) writes it")
    if not isinstance(card, dict):
        raise UserError(f"card is a {type(card).__name__}; give a Card, a card.json record or its path")
    return Card(**card)


def bars(card) -> list[dict]:
    """One entry per measured rung, in the ladder's order: its figure, its MFU against the bf16 dense peak (None
    without a peak), what caps it and the model alone's samples/s where that was measured."""
    card = as_card(card)
    out = []
    for r in card.rows:
        if r.get("skipped"):
            continue
        fig, alone = ladder.figure(r), r.get("resident")
        out.append({"rung": r["rung"], "img_s": fig.value, "low": fig.low, "high": fig.high,
                    "mfu_bf16": card.mfu_of_reference(r), "cap": card_input.cap(r),
                    "alone_img_s": alone["img_s"] if alone else None,
                    "recommended": r["rung"] == card.recommended["rung"]})
    return out


def plot(card, title: str | None = None):
    """The card as a picture (see the module's docstring); returns the matplotlib figure (shown inline)."""
    import matplotlib.pyplot as plt  # most of a second to import: only plots need it

    card = as_card(card)
    got = bars(card)
    if not got:
        raise UserError(f"card {card.name!r} measured no rung: nothing to draw")
    bf16 = (peaks.dense_peaks(card.device) or {}).get("bf16")
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 0.42 * len(got) + 1.6), sharey=True,
                                      gridspec_kw={"width_ratios": (3, 2)})
    ys = range(len(got))
    colors = ["tab:blue" if b["recommended"] else "lightsteelblue" for b in got]
    left.barh(ys, [b["img_s"] for b in got], color=colors, hatch=None,
              xerr=[[b["img_s"] - b["low"] for b in got], [b["high"] - b["img_s"] for b in got]],
              error_kw={"elinewidth": 1, "capsize": 2})
    for y, b in zip(ys, got):
        if b["cap"] == "input":
            left.barh(y, b["img_s"], color="none", edgecolor="tab:orange", hatch="//", lw=0)
        if b["alone_img_s"]:
            left.plot(b["alone_img_s"], y, "D", color="tab:orange", ms=5,
                      label="the model alone (one resident batch)" if y == next(
                          i for i, x in enumerate(got) if x["alone_img_s"]) else None)
    left.set_yticks(list(ys), [b["rung"] + (" (recommended)" if b["recommended"] else "") for b in got], fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("samples/s (bar: mean, line: its 95% interval)", fontsize=8)
    if any(b["cap"] == "input" for b in got):
        left.legend(fontsize=7, loc="lower right", title="hatched: your batches cap the rung", title_fontsize=7)
    if bf16 and any(b["mfu_bf16"] for b in got):
        right.barh(ys, [100 * (b["mfu_bf16"] or 0) for b in got], color=colors)
        for y, b in zip(ys, got):
            right.text(100 * (b["mfu_bf16"] or 0), y, f" {100 * (b['mfu_bf16'] or 0):.1f}%", va="center", fontsize=7)
        right.set_xlim(0, 125 * max(b["mfu_bf16"] or 0 for b in got))
        right.set_xlabel(f"MFU, % of the bf16 dense peak ({bf16:,.1f} TFLOP/s)", fontsize=8)
    else:
        right.set_xticks([])
        right.text(0.5, 0.5, f"MFU n/a:\nno datasheet peak for\n{card.device}", ha="center", va="center",
                   transform=right.transAxes, fontsize=8, color="0.4")
    skipped = [r["rung"] for r in card.rows if r.get("skipped")]
    fig.suptitle(title or f"card of {card.name} on {card.device}, torch {card.torch_version}"
                 + (f"\nnot measured here: {', '.join(skipped)}" if skipped else ""), fontsize=9)
    fig.tight_layout()
    plt.show()
    return fig


def page_path(card, folder: str | Path | None = None) -> Path:
    """The card's whole page, card.md, in `folder`: by default the folder of its card.json (a path given), of its
    job, or tl.card's default runs/card_<model>/. Written there from the card when it is not there yet; another
    card's page there is never overwritten (a one-line error asks for folder=)."""
    job = None if isinstance(card, (str, Path)) else (as_card(card).job or {}).get("path")
    if folder is None:
        folder = (Path(card).parent if isinstance(card, (str, Path)) else
                  Path(job).parent if job and (Path(job).parent / "card.json").is_file() else None)
    card = as_card(card)
    page = Path(folder or f"runs/card_{card.name}") / "card.md"
    if not page.is_file():
        make_folder(page.parent, f"folder={str(page.parent)!r}", "give a folder you can write")
        atomic_write_text(page, card.markdown() + "\n")
    elif page.read_text() != card.markdown() + "\n":
        raise UserError(f"{page} is the page of another card; give folder= (the out= of this card) to show its own")
    return page


def show(card, folder: str | Path | None = None):
    """The card's five-line verdict, its picture and the path of its whole page (a notebook cell's output)."""
    from IPython.display import Markdown, display

    page = page_path(card, folder)
    card = as_card(card)
    head = f"**Card of {card.name} on {card.device}, torch {card.torch_version}**"
    verdict = [line.replace("(see below)", "(the page names the peaks)") for line in card_verdict.lines(card)]
    display(Markdown("\n".join([head, "", *verdict, "",
                                f"The whole page (the table, every rung, the notes): `{page}`"])))
    plot(card)


def same_rung(a, b, rung: str) -> tuple[dict, dict]:
    """The row of `rung` in each of two cards: the ladder's rows, measured with the same configuration in both
    (the recommended row may be a configuration of its own: without the changes that measured slower)."""
    rows = []
    for card in (as_card(a), as_card(b)):
        row = next((r for r in card.rows if r["rung"] == rung), None)
        if row is None or row.get("skipped"):
            why = row["skipped"] if row else "no such rung"
            raise UserError(f"rung {rung!r} of the card of {card.name} (batch {card.probe['batch']}) was not measured "
                            f"({why}); compare a rung both cards measured")
        rows.append(row)
    return rows[0], rows[1]


def versus(a, b, rung: str, unit: str = "samples") -> str:
    """One line: `rung` at the first card's batch and at the second's, each figure with its interval, and the
    second against the first by the rule (noise.versus): both sides named, like with like."""
    try:
        first, second = same_rung(a, b, rung)
    except UserError as e:
        return f"{rung}: not compared: {e}"
    fa, fb = ladder.figure(first), ladder.figure(second)
    return (f"{rung} at batch {first['batch']}: {noise.shown(fa, ',.1f')} {unit}/s; at batch {second['batch']}: "
            f"{noise.shown(fb, ',.1f')} {unit}/s; batch {second['batch']} against batch {first['batch']}: "
            f"{noise.versus(fb, fa)}")
