"""What the training loop (engine.py) watches between its steps: the validation passes of val_history (every
eval_every steps, and one a stop cut short, done again when the run resumes) and the loss, which must stay finite.
A NaN says different things at different steps: this module says what is known at the step it appears."""
from __future__ import annotations

import math
import time

from .config import UserError


class NonFiniteLoss(UserError):
    """The loss became NaN or infinite: training can't recover, so the run stops (without a checkpoint)."""


def check_finite(run, step: int, values: list[float]) -> None:
    """Stop at the first NaN or infinite loss of the log interval ending at `step` (read where the losses
    arrive anyway: no extra device sync)."""
    bad = next((i for i, v in enumerate(values) if not math.isfinite(v)), None)
    if bad is not None:
        raise NonFiniteLoss(nonfinite_message(run.cfg, step - len(values) + bad + 1, values[bad],
                                              run.batch_size * run.env.world_size))


def nonfinite_message(cfg, step: int, value: float, global_batch: int) -> str:
    """Why the loss of `step` is `value` (NaN or infinite), as far as it is known. The loss of step 1 comes from
    the weights the run started with, before any update: the learning rate can't be the cause there."""
    fp16 = cfg.precision == "fp16"
    if step == 1:
        overflow = "; or an fp16 overflow in the forward pass (try precision=bf16)" if fp16 else ""
        return (f"the loss became {value} at step 1, before any weight update, so the learning rate is not the "
                "cause: the model's output or the loss is not finite on the first batch (look for NaN or inf in "
                f"the inputs and targets, a log or a division by 0 in the model or the loss){overflow}")
    overflow = " or an fp16 overflow (try precision=bf16)" if fp16 else ""
    return (f"the loss became {value} at step {step}: the learning rate lr={cfg.lr:g} is likely too high for "
            f"batch size {global_batch} at precision={cfg.precision}{overflow}; lower lr or add warmup_steps (no "
            "checkpoint written for this step)")


def periodic_eval(run, log) -> bool:
    """A validation pass at the run's step, recorded as [step, training seconds, accuracy] (notebook 06:
    accuracy against time; history.History keeps them) and said with `log`. True once the run stops early
    (target_accuracy, patience). A pass cut short (a stop signal) counts as validation time too: the
    checkpoint's training clock leaves it out, and the run does the pass again when it resumes (redo)."""
    now = run.synced_time()
    try:
        accuracy = run.evaluate()
    except BaseException:
        run.history.eval_seconds += time.perf_counter() - now
        raise
    log(run.env, run.history.record(run.step, now, accuracy, time.perf_counter() - now))
    run.clock.pause_ended()  # the validation pass is not a training step: left out of the step times
    return run.history.stopped_by is not None


def redo(run, log) -> None:
    """A resumed run whose checkpoint is at a step with a validation pass but without its point (a stop during
    the pass, or at that step before it): the pass, now, before the next step, so that val_history loses
    nothing. Every rank resumed at the same step with the same history: all do it, or none."""
    cfg, points = run.cfg, run.history.points
    if run.resumed_from is None or not cfg.eval_every or not run.step or run.step % cfg.eval_every:
        return
    if run.history.stopped_by is None and not (points and points[-1][0] == run.step):
        log(run.env, f"step {run.step}: the validation pass the stop left undone, done now")
        periodic_eval(run, log)
