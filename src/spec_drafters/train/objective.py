"""Whether an objective can train: the numbers a config gives the loss and the optimizer, and the
values a run produces.

One copy of each rule, used where the numbers enter (LossMix, the LightningModule's constructor and
its optimizer) and by ``lint`` on a module built some other way. Each returns what is wrong, in
words, or nothing: the caller raises with its own argument's name. A NaN never satisfies a
comparison, so every rule is written as "must be" rather than "must not be".

The finite guard (the LightningModule's ``on_before_optimizer_step`` and ``on_save_checkpoint``)
reads the run's loss terms, gradients and checkpoint tensors with :func:`all_finite` and stops with
:class:`Diverged`.
"""

from __future__ import annotations

import math

import torch

from spec_drafters.errors import InputError


def coefficients_problem(coefficients: list[float]) -> str | None:
    """What makes a weighted sum of losses untrainable: a NaN or infinite coefficient (the objective
    is NaN from the first step), a negative one (that term's loss is maximised), or none positive
    (the objective is 0 and nothing trains). A zero beside a positive one only switches a term off."""
    for i, c in enumerate(coefficients):
        if not math.isfinite(c):
            return f"coefficient {i} is {c}: every coefficient must be a finite number"
        if not c >= 0:
            return f"coefficient {i} is {c}: a negative coefficient maximises its term's loss"
    if not any(c > 0 for c in coefficients):
        return f"coefficients {list(coefficients)} are all 0: the objective is 0 and nothing trains"
    return None


def optimizer_problems(
    lr: float, weight_decay: float, warmup_fraction: float, min_lr_ratio: float
) -> list[tuple[str, str]]:
    """(argument, what is wrong) for the default optimizer's and schedule's numbers."""
    found = []
    if not (math.isfinite(lr) and lr > 0):
        found.append(("lr", f"must be a positive finite number, got {lr}"))
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        found.append(("weight_decay", f"must be a finite number >= 0, got {weight_decay}"))
    for name, value in (("warmup_fraction", warmup_fraction), ("min_lr_ratio", min_lr_ratio)):
        if not 0 <= value <= 1:
            found.append((name, f"must be in [0, 1], got {value}"))
    return found


def learning_rates_problem(lrs: list[float]) -> str | None:
    """A built optimizer's learning rates, one per parameter group: none may be NaN, infinite or
    negative, and one at least must be positive (a group at 0 is frozen on purpose only if another
    trains)."""
    for i, lr in enumerate(lrs):
        if not (math.isfinite(lr) and lr >= 0):
            return f"parameter group {i} has learning rate {lr}: it must be a finite number >= 0"
    if not any(lr > 0 for lr in lrs):
        return f"every parameter group has learning rate 0 ({lrs}): nothing trains"
    return None


# --- a run that diverged --------------------------------------------------------------------------


class Diverged(InputError):
    """Training produced a NaN or infinite loss, gradient or weight: the run stops, saying where.
    An InputError: the cause is a setting (the learning rate, the objective), and ``spec-drafters``
    prints it as one line without a traceback."""


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's (FSDP2) local shard, or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def all_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One bool tensor, True when every floating-point value of every tensor is finite; computed on
    the device without a host sync (the caller decides when to read it)."""
    checks = [torch.isfinite(local_tensor(t)).all() for t in tensors if t.is_floating_point()]
    if not checks:
        return torch.ones((), dtype=torch.bool)
    return torch.stack([c.to(checks[0].device) for c in checks]).all()  # weights and states may differ


def first_nonfinite(named: list[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the tensors holding a NaN or an infinity, in order (host side: only once the
    cheap :func:`all_finite` said something is wrong)."""
    return [n for n, t in named if t.is_floating_point() and not bool(torch.isfinite(local_tensor(t)).all())]


def divergence_message(where: str, bad: list[str], terms: dict[str, float], checkpoint: str | None) -> str:
    """One line: where training stopped, what was not finite, the loss terms' values, and the last
    checkpoint written (every checkpoint written is finite: non-finite ones are refused)."""
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    values = ", ".join(f"{k}={v:.6g}" for k, v in terms.items()) or "none logged"
    last = f"last checkpoint (finite): {checkpoint}" if checkpoint else "no checkpoint was written"
    return (
        f"training diverged at {where}: non-finite {shown or 'values on another rank'}; loss terms: "
        f"{values}; {last}. Lower the learning rate or check the objective (spec-drafters lint)"
    )


def named_tensors(prefix: str, value) -> list[tuple[str, torch.Tensor]]:
    """Every tensor in nested dicts and lists (an optimizer's state), named by its path."""
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in named_tensors(f"{prefix}.{k}", v)]
    if isinstance(value, (list, tuple)):
        return [pair for i, v in enumerate(value) for pair in named_tensors(f"{prefix}.{i}", v)]
    return []
