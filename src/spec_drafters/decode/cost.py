"""What a speculative round costs on this machine, in plain greedy steps.

A round is one drafter pass plus one target forward over the bonus token and T tree nodes. How that
forward's time grows with T depends on the machine and the target (benchmarks/round_profile.py shows
it on this project's 2-core CPU), so it is measured once per machine and target
(``spec-drafters cost-model``, decode/timing.py) and stored; the adaptive verifier reads it to pick
each round's budget.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from spec_drafters.errors import InputError, read_json


@dataclass
class RoundCost:
    """Costs relative to one greedy step (a target forward over one token with its KV cache)."""

    tokens: list[int]  # verify sizes measured (bonus + nodes), ascending, starting at 1
    verify: list[float]  # the target's forward over that many tree tokens, in greedy steps
    draft: float  # one drafter pass (layers and head over the block), in greedy steps
    machine: dict | None = None  # what it was measured on (target, threads, torch)

    def __post_init__(self):
        if not self.tokens or self.tokens[0] != 1 or self.tokens != sorted(set(self.tokens)):
            raise ValueError(f"tokens must be ascending from 1, got {self.tokens}")
        if len(self.verify) != len(self.tokens) or min(self.verify) <= 0 or self.draft < 0:
            raise ValueError("verify needs one positive cost per token count, draft >= 0")

    def round(self, t: int) -> float:
        """A round verifying ``t`` tokens: the drafter pass plus the verify forward (linear between
        measured sizes, constant slope past the last)."""
        xs, ys = self.tokens, self.verify
        if t <= xs[0]:
            return self.draft + ys[0]
        i = next((i for i in range(1, len(xs)) if t <= xs[i]), len(xs) - 1)  # the segment holding t
        if len(xs) == 1:
            return self.draft + ys[0]
        slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])  # past the last size: the last segment's slope
        return self.draft + ys[i - 1] + slope * (t - xs[i - 1])

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RoundCost:
        """A cost file; any other JSON (a calibration.json given as the cost model) names the file."""
        data = read_json(path)
        fields = ("tokens", "verify", "draft")
        if not isinstance(data, dict) or any(k not in data for k in fields):
            raise InputError(
                f"{path}: not a cost file (spec-drafters cost-model writes one: {', '.join(fields)})"
            )
        try:
            return cls(**{k: data[k] for k in (*fields, "machine") if k in data})
        except (TypeError, ValueError) as e:  # wrong types or values: the file, not a traceback
            raise InputError(f"{path}: {e}") from None
