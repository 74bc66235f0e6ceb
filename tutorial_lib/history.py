"""A run's validation history (notebook 06): [step, training seconds, accuracy] every eval_every steps; when it
ends the run early (target_accuracy, patience); and its training clock, which a resumed run carries on from its
checkpoint, so that a requeued run reports its whole history with the time counted from its original start.
No torch here: the engine gives it the times.
"""
from __future__ import annotations

from pathlib import Path

from .config import ConfigError, TrainConfig, UserError
from .results import Result, load_result


def check_eval_every(cfg: TrainConfig, total_steps: int) -> None:
    """target_accuracy and patience act at the validation passes: there must be some, and one within the run.
    (The run checks it before its first step, a job when it is rendered.)"""
    if cfg.patience and not cfg.eval_every:
        raise ConfigError(f"patience={cfg.patience} needs eval_every > 0 (it counts validation passes), e.g. "
                          "patience=3 eval_every=50")
    stop = "target_accuracy" if cfg.target_accuracy is not None else "patience" if cfg.patience else None
    if stop and cfg.eval_every > total_steps:
        raise ConfigError(f"{stop}={getattr(cfg, stop)} with eval_every={cfg.eval_every}: the run has {total_steps} "
                          f"steps, so no validation pass within the run could stop it; use eval_every <= {total_steps}")


def kept_result(out: Path, step: int, stopped_by: str | None) -> tuple[Result | None, str]:
    """A finished run's result.json (nothing is trained again) and the line that says so; (None, line) when the
    file is missing or damaged: the run then finishes from its checkpoint and writes it, training nothing."""
    why = f"stopped by {stopped_by} at step {step}" if stopped_by else f"{step} steps"
    try:
        result = load_result(out)
    except UserError:
        state = "is damaged" if (out / "result.json").exists() else "is missing"
        return None, (f"{out} holds a finished run ({why}) whose result.json {state}: writing it again from the "
                      "checkpoint (no step is trained again)")
    longer = "" if stopped_by else ", a larger steps= continues it"
    return result, (f"{out} holds a finished run ({why}; result.json kept); resume=false trains it again from "
                    f"step 0{longer}")


class History:
    """The validation passes of one run and its training clock: seconds of training since the end of the run's
    first step (that step's one-off costs, cuDNN autotuning, are not training), the validation passes left out.
    A resumed run counts on from its checkpoint's seconds, and its own first step as an average step of before."""

    def __init__(self, cfg: TrainConfig):
        self.cfg, self.points, self.stopped_by = cfg, [], None
        self.t_loop, self.eval_seconds = None, 0.0  # this process: the end of its first step; its validation passes
        self.seconds_before = self.first_step_s = self.wall_before = 0.0  # a resumed run's clocks before it

    def seconds(self, now: float) -> float:
        if self.t_loop is None:
            return self.seconds_before
        return self.seconds_before + self.first_step_s + now - self.t_loop - self.eval_seconds

    def record(self, step: int, now: float, accuracy: float, spent: float) -> str:
        """The validation pass at `step` (started at `now`, `spent` seconds long); its log line."""
        self.points.append([step, round(self.seconds(now), 4), accuracy])
        self.eval_seconds += spent
        self.stopped_by = self.early_stop()
        why = {None: "", "target_accuracy": f"; target_accuracy={self.cfg.target_accuracy} reached: stopping",
               "patience": f"; no better accuracy in {self.cfg.patience} passes (patience): stopping"}
        return f"step {step}: val acc {100 * accuracy:.1f}% after {self.points[-1][1]:.1f} s" + why[self.stopped_by]

    def early_stop(self) -> str | None:
        """Why the run stops at this pass: 'target_accuracy' once its accuracy reaches the target, 'patience' when
        the last `patience` passes found no better accuracy than the best before them; or None."""
        cfg, accuracies = self.cfg, [a for _, _, a in self.points]
        if cfg.target_accuracy is not None and accuracies[-1] >= cfg.target_accuracy:
            return "target_accuracy"
        if cfg.patience and len(accuracies) > cfg.patience and \
                max(accuracies[-cfg.patience:]) <= max(accuracies[:-cfg.patience]):
            return "patience"
        return None

    def finished(self, step: int, total_steps: int) -> bool:
        """Nothing left to train: all the steps, or the run stopped early (target_accuracy, patience)."""
        return step >= total_steps or self.stopped_by is not None

    def state(self, now: float, wall: float) -> dict:
        """What a checkpoint carries (only numbers, strings and lists: weights_only loading)."""
        return {"val_history": self.points, "stopped_by": self.stopped_by,
                "clock": {"seconds": self.seconds(now), "wall_s": self.wall_before + wall}}

    def resume(self, state: dict, step: int) -> None:
        """Carry on the history, the early stop and the clocks of a checkpoint at `step` (older ones have none)."""
        self.points = [list(h) for h in state.get("val_history") or []]
        self.stopped_by = state.get("stopped_by")
        clock = state.get("clock") or {}
        self.seconds_before, self.wall_before = float(clock.get("seconds", 0.0)), float(clock.get("wall_s", 0.0))
        self.first_step_s = self.seconds_before / (step - 1) if step > 1 else 0.0
