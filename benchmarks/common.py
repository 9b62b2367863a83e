"""Shared benchmark plumbing: the results folder, the timer and the results line (both from the package:
spec_drafters.clock, spec_drafters.studies.results), and a drafter folder loaded for decoding."""

from __future__ import annotations

from pathlib import Path

from spec_drafters.clock import median_seconds as timed  # noqa: F401 (the benchmarks' name for it)
from spec_drafters.studies import results as _results
from spec_drafters.studies.results import git_sha  # noqa: F401

RESULTS = Path(__file__).parent / "results"


def record(name: str, rows: list[dict], summary: dict, results: Path = RESULTS) -> None:
    """One line appended to results/<name>.jsonl (or ``results``), the closing JSON line printed."""
    _results.record(name, rows, summary, results)


def folder_drafter(path: str, model) -> tuple:
    """(FrozenTarget tapping the folder's fc layers, the folder's drafter, its fc ids) for decoding.

    The drafter is fp32, as decoding runs it: a folder may store bf16, and ``--model.init_from``
    loads it into an fp32 module."""
    from spec_drafters.artefacts.folders import build_drafter, read_folder
    from spec_drafters.target.frozen import FrozenTarget

    folder = read_folder(path, num_target_layers=model.config.num_hidden_layers)
    return FrozenTarget(model, folder.fc_ids), build_drafter(folder).float().eval(), folder.fc_ids
