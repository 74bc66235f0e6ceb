"""FLOPs of a training step, counted and checked: the one rule behind every MFU of the workbook (the engine's and
the ladder's through models.train_flops, notebook 04's, the card's).

    with flops.Counter() as c:
        loss = loss_fn(model(x), y)
        c.forward_done()
        loss.backward()
    step = c.result(samples=x.shape[0])   # step.forward, step.train (per sample), step.how (in words)

torch's FLOP counter (torch.utils.flop_counter: matmuls, convolutions and attention, 2 FLOPs per multiply-add)
counts the forward pass right, but it counts the weight gradient of a grouped convolution once per group over
(a depthwise convolution of 96 channels: 96 times). Here every convolution's backward pass is counted by the
formula per group: the input gradient and the weight gradient each cost what the forward convolution costs.
The check: a training step's backward pass does one or two times the forward's arithmetic (the input gradient
and the weight gradient of each layer), so a step is 2-4x its forward pass. Where it still counts more than
that, the step is taken as 3x the forward, and `how` says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils import flop_counter

LOW, HIGH = 2.0, 4.0  # a training step over its forward pass, for layers that train (see above)
SLACK = 0.05  # counted ratios a little past either end are rounding (a loss's own matmul, a layer without bias)


@dataclass(frozen=True)
class StepFlops:
    """FLOPs per sample: the forward pass, the training step as torch's counter gives it, and the training step
    used (`train`, the numerator of MFU), with the rule that gave it."""
    forward: float
    counted: float
    train: float
    rule: str  # "counted", "per_group" (grouped convolutions' backward counted per group) or "three_forward"

    @property
    def ratio(self) -> float | None:
        return self.train / self.forward if self.forward else None

    @property
    def how(self) -> str:
        """How `train` was counted, in one sentence, with the counter's own figure where it was not used."""
        if not self.forward:
            return "torch's FLOP counter, no forward count to check it against"
        said = f"x{self.counted / self.forward:.1f} the forward"
        if self.rule == "per_group":
            return (f"grouped convolutions' backward counted per group (torch's counter gave {short(self.counted)}, "
                    f"{said}: it counts their weight gradients once per group over)")
        if self.rule == "three_forward":
            return (f"3x the forward: torch's counter gave {short(self.counted)}, {said}, more than the "
                    f"{HIGH:.0f}x a backward pass needs")
        if self.ratio < LOW * (1 - SLACK):
            return (f"torch's FLOP counter, x{self.ratio:.1f} the forward: below the {LOW:.0f}x of a step that trains "
                    "every layer (frozen layers, or operations the counter does not know)")
        return f"torch's FLOP counter, x{self.ratio:.1f} the forward ({LOW:.0f}-{HIGH:.0f}x for layers that train)"


def short(v: float | None) -> str:
    """'3.90 GFLOP'; 'n/a' for none."""
    if not v:
        return "n/a"
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if v >= scale:
            return f"{v / scale:,.2f} {unit}"
    return f"{v:,.0f} FLOP"


def conv_backward_macs(grad_out_shape, x_shape, w_shape, transposed: bool) -> int:
    """Multiply-adds of one convolution pass (forward, input gradient or weight gradient: they cost the same), per
    group as the weight's shape holds it: batch x the positions the kernel visits x the weight's elements."""
    positions = (x_shape if transposed else grad_out_shape)[2:]
    return x_shape[0] * math.prod(positions) * math.prod(w_shape)


class Counter:
    """torch's FlopCounterMode with every convolution's backward counted per group (and torch's own count of it
    kept, to show); forward_done() marks the end of the forward pass."""

    def __init__(self):
        self.stock_backward = self.fixed_backward = 0
        self.mode = flop_counter.FlopCounterMode(display=False, custom_mapping={
            torch.ops.aten.convolution_backward: self._conv_backward})
        self.forward_flops = None

    def _conv_backward(self, grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation, transposed,
                       output_padding, groups, output_mask, out_shape=None, **kwargs) -> int:
        stock = flop_counter.conv_backward_flop(grad_out_shape, x_shape, w_shape, bias, stride, padding, dilation,
                                                transposed, output_padding, groups, output_mask, out_val=out_shape)
        fixed = 2 * conv_backward_macs(grad_out_shape, x_shape, w_shape, transposed) * sum(map(bool, output_mask[:2]))
        self.stock_backward += stock
        self.fixed_backward += fixed
        return fixed

    def __enter__(self) -> "Counter":
        self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)

    def forward_done(self) -> None:
        self.forward_flops = self.mode.get_total_flops()

    def result(self, samples: int = 1) -> StepFlops:
        total = self.mode.get_total_flops()
        forward = total if self.forward_flops is None else self.forward_flops
        return checked(forward / samples, (total - self.fixed_backward + self.stock_backward) / samples,
                       total / samples)


def checked(forward: float, counted: float, per_group: float) -> StepFlops:
    """The rule of the module's docstring: torch's count where the per-group one agrees with it, else the per-group
    count where it is at most HIGH x the forward, else 3x the forward."""
    if not forward or per_group <= HIGH * (1 + SLACK) * forward:
        return StepFlops(forward, counted, per_group, "counted" if per_group == counted else "per_group")
    return StepFlops(forward, counted, 3 * forward, "three_forward")
