"""Post-hoc calibration of the drafter's slot probabilities for tree ranking (DSpark's idea, arXiv
2607.05147; docs/verifiers.md).

DDTree ranks a prefix by the product of its tokens' drafter probabilities (docs/method.md section 4).
That product should be the chance the prefix is right. One temperature per slot, T_d, divides slot d's
logits; they are fitted on held-out blocks one slot at a time: with T_1..T_{d-1} fixed, T_d minimises
the binary log-loss of the event "the drafter's top tokens of slots 1..d are all the labels" against
its predicted probability prod over i <= d of softmax(z_i / T_i)[top_i]. Fitted sequentially, the
product (not only each factor) is calibrated. Stored as calibration.json in the drafter's folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from spec_drafters.errors import InputError, read_json

#: Temperatures tried per slot: 0.25 .. 4, geometric.
GRID = torch.logspace(-2, 2, 41, base=2.0).tolist()


def prefix_events(logits: torch.Tensor, labels: torch.Tensor, temperatures: list[float] | None = None):
    """(A, D, V) logits, (A, D) labels -> (predicted (A, D), happened (A, D)): for each depth d, the
    probability the top-1 prefix through d is right, and whether it was."""
    d = logits.shape[1]
    temps = torch.tensor(temperatures if temperatures is not None else [1.0] * d, dtype=torch.float32)
    probs = torch.softmax(logits.float() / temps[None, :, None], dim=-1)  # (A, D, V)
    top_p, top = probs.max(-1)  # (A, D)
    return top_p.cumprod(-1), (top == labels).long().cumprod(-1).bool()


def _log_loss(p: torch.Tensor, y: torch.Tensor) -> float:
    p = p.clamp(1e-7, 1 - 1e-7)
    return float(-(y * p.log() + (~y) * (1 - p).log()).mean())


def fit_temperatures(logits: torch.Tensor, labels: torch.Tensor, grid: list[float] = GRID) -> list[float]:
    """One temperature per slot, fitted sequentially (module docstring). The top-1 token of a slot does
    not depend on its temperature, so only slot d's top probability is recomputed per candidate."""
    prev_p = torch.ones(logits.shape[0])  # prod over the fitted slots of their top probability
    prev_hit = torch.ones(logits.shape[0], dtype=torch.bool)  # their top-1 prefix was right so far
    temps: list[float] = []
    for d in range(logits.shape[1]):
        z = logits[:, d].float()
        hit = prev_hit & (z.argmax(-1) == labels[:, d])
        top = {t: torch.softmax(z / t, dim=-1).max(-1).values for t in grid}
        best = min(grid, key=lambda t: _log_loss(prev_p * top[t], hit))
        temps.append(best)
        prev_p, prev_hit = prev_p * top[best], hit
    return temps


def prefix_ece(
    logits: torch.Tensor, labels: torch.Tensor, temperatures: list[float] | None = None, bins: int = 10
):
    """Expected calibration error of the prefix events over all depths: |mean predicted - frequency| per
    equal-width bin of the prediction, weighted by the bin's share."""
    p, y = (x.flatten() for x in prefix_events(logits, labels, temperatures))
    which = (p * bins).long().clamp(max=bins - 1)
    ece = 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            ece += float(sel.float().mean()) * abs(float(p[sel].mean()) - float(y[sel].float().mean()))
    return ece


def save(path: str | Path, temperatures: list[float], report: dict) -> None:
    Path(path).write_text(json.dumps({"slot_temperatures": temperatures, **report}, indent=1) + "\n")


def load(path: str | Path) -> list[float]:
    """The slot temperatures of a calibration.json (a drafter folder's, or the file itself); a file
    of another kind (a cost model, a results file) names the file."""
    path = Path(path)
    file = path / "calibration.json" if path.is_dir() else path
    data = read_json(file)
    if not isinstance(data, dict) or "slot_temperatures" not in data:
        raise InputError(
            f"{file}: not a calibration file (no 'slot_temperatures'; spec-drafters calibrate writes one)"
        )
    temps = data["slot_temperatures"]
    if (
        not isinstance(temps, list)
        or not temps
        or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 for t in temps)
    ):
        raise InputError(f"{file}: slot_temperatures must be a list of positive numbers")
    return [float(t) for t in temps]
