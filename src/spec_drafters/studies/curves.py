"""A training curve over chained stages (a run resumed, then a second stage started from its best
checkpoint): every validation placed at the steps trained since the first stage began, and at the
training tokens seen (experiments/tau_curve.py draws it; docs/reference_drafter.md).

Read from the stages' CSVLogger files (a resumed process writes a new logger version; a step validated
twice keeps its newest value) and from ``spec-drafters validate --results`` files of checkpoints
validated again afterwards.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from spec_drafters.studies.results import CHECKOUT


def validations(run: Path) -> tuple[dict[int, dict[str, float]], int]:
    """step -> the val/* metrics logged at that step, over every metrics.csv of the run; and the
    number of optimizer steps the run logged (its last logged step + 1)."""
    out: dict[int, dict[str, float]] = {}
    files = sorted(run.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise SystemExit(f"tau_curve: no metrics.csv under {run}")
    last = -1
    for file in files:  # oldest first: a resumed run's re-validation of a step replaces the old value
        for row in csv.DictReader(file.open()):
            if not row.get("step"):
                continue
            last = max(last, int(row["step"]))
            values = {k: float(v) for k, v in row.items() if k.startswith("val/") and v not in ("", None)}
            if values:
                out.setdefault(int(row["step"]), {}).update(values)
    return out, last + 1


def rerun_validations(files: list[Path]) -> dict[Path, dict[int, dict[str, float]]]:
    """checkpoint path -> {step (0-based, as the logger writes it) -> val/*} of ``spec-drafters
    validate --results`` files."""
    import torch  # only here: the rest of the curve is plain files

    out: dict[Path, dict[int, dict[str, float]]] = {}
    for file in files:
        result = json.loads(file.read_text())
        ckpt = result.get("ckpt_path")
        if not ckpt:
            raise SystemExit(f"tau_curve: {file} names no --ckpt_path: its training step is unknown")
        # relative to here, to the repository root, or to a folder above the results file (the
        # checkout the validation ran in, when that is another worktree)
        candidates = [Path(ckpt), CHECKOUT / ckpt, *(up / ckpt for up in file.resolve().parents)]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            raise SystemExit(f"tau_curve: {file} names {ckpt}, found neither here nor above it")
        step = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["global_step"]
        values = {k: float(v) for k, v in result["metrics"].items() if k.startswith("val/")}
        out.setdefault(path.resolve(), {})[step - 1] = values
    return out


def chained(runs: list[Path], rerun: dict[Path, dict[int, dict[str, float]]]) -> list[dict]:
    """One row per validation over the stages in order: stage, the stage's own step (1-based) and the
    steps trained since the first stage began."""
    rows, offset = [], 0
    for stage, run in enumerate(runs, 1):
        steps, trained = validations(run)
        for ckpt, values in rerun.items():
            if ckpt.is_relative_to(run.resolve()):
                for step, metrics in values.items():
                    steps.setdefault(step, {}).update(metrics)
                    trained = max(trained, step + 1)
        rows += [
            {"stage": stage, "stage_step": s + 1, "step": offset + s + 1, **v}
            for s, v in sorted(steps.items())
        ]
        offset += trained
    if unused := [c for c in rerun if not any(c.is_relative_to(r.resolve()) for r in runs)]:
        raise SystemExit(f"tau_curve: --validated checkpoints outside every --run: {unused}")
    return rows


def tokens_per_record(cache: Path) -> float:
    index = json.loads((cache / "index.json").read_text())
    shards = index["shards"]
    return sum(s["tokens"] for s in shards) / max(1, sum(s["records"] for s in shards))
