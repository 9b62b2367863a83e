"""Shared benchmark plumbing: timing, the results file, and the closing JSON line."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"


def git_sha() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def uncommitted() -> list[str]:
    """Tracked code files (src/, benchmarks/*.py) that differ from the commit: a results line that lists
    some was not measured on the commit its git_sha names."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks/*.py"],
            capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent.parent,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return ["unknown"]
    return sorted(line[3:] for line in out.splitlines() if line.strip())


def timed(fn, repeats: int, warmup: int = 1, after_warmup=None) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs (then ``after_warmup()``)."""
    for _ in range(warmup):
        fn()
    if after_warmup is not None:
        after_warmup()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def versions() -> dict[str, str]:
    """Versions of the packages a benchmark's numbers depend on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("spec-drafters", "torch", "lightning", "transformers"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


def record(name: str, rows: list[dict], summary: dict, results: Path = RESULTS) -> None:
    """Appends one line per run to results/<name>.jsonl (or ``results``) and prints the closing JSON line."""
    entry = {
        "benchmark": name,
        "git_sha": git_sha(),
        **({"uncommitted": changed} if (changed := uncommitted()) else {}),
        "torch": torch.__version__,
        "versions": versions(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": rows,
        **summary,
    }
    results.mkdir(exist_ok=True)
    with open(results / f"{name}.jsonl", "a") as fh:
        fh.write(json.dumps(entry) + "\n")
    print(json.dumps(summary))


def folder_drafter(path: str, model) -> tuple:
    """(FrozenTarget tapping the folder's fc layers, the folder's drafter, its fc ids) for decoding.

    The drafter is fp32, as decoding runs it: a folder may store bf16, and ``--model.init_from``
    loads it into an fp32 module."""
    from spec_drafters.artefacts.folders import build_drafter, read_folder
    from spec_drafters.target.frozen import FrozenTarget

    folder = read_folder(path, num_target_layers=model.config.num_hidden_layers)
    return FrozenTarget(model, folder.fc_ids), build_drafter(folder).float().eval(), folder.fc_ids
