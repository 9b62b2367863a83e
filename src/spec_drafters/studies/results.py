"""The results files of benchmarks/ and experiments/: one JSON line per run appended to
``results/<name>.jsonl``, with what makes the line a fact rather than a number: the git commit (and the
code files that differed from it), the command, the machine, the package versions and the time.
docs/results.md, generated from these files (``make results-index``), says which line is current."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

CODE = ("src", "benchmarks/*.py", "experiments/*.py")  # what a results line's numbers depend on
# The checkout the studies and benchmarks run from (the package installed editable, as `make setup` does).
CHECKOUT = Path(__file__).resolve().parents[3]


def _git(*args: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=cwd)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout


def git_sha(cwd: Path | None = None) -> str:
    return (_git("rev-parse", "--short", "HEAD", cwd=cwd) or "unknown").strip()


def uncommitted(cwd: Path | None = None) -> list[str]:
    """Tracked code files that differ from the commit: a results line that lists some was not measured
    on the commit its git_sha names."""
    top = _git("rev-parse", "--show-toplevel", cwd=cwd)
    out = top and _git("status", "--porcelain", "--untracked-files=no", "--", *CODE, cwd=Path(top.strip()))
    if out is None:
        return ["unknown"]
    return sorted(line[3:] for line in out.splitlines() if line.strip())


def versions() -> dict[str, str]:
    """Versions of the packages a result's numbers depend on."""
    out = {}
    for package in ("spec-drafters", "torch", "lightning", "transformers"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "absent"
    return out


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine() -> str:
    """What ran it, in words: architecture, CPU model, the cores this process may use, the GPU if any."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = [platform.machine(), cpu_model(), f"{cores} cores"]
    torch = sys.modules.get("torch")  # a GPU is named only where the run imported torch (never here)
    if torch is not None and torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name(0))
    return ", ".join(p for p in parts if p)


def command_line(argv: list[str] | None = None) -> str:
    """The command that ran, as one shell line: the script by its path inside the checkout when it is
    one (``python experiments/ablation.py --steps 400``)."""
    argv = list(sys.argv if argv is None else argv)
    top = _git("rev-parse", "--show-toplevel")
    if argv and top and os.path.isfile(argv[0]):
        script = os.path.relpath(os.path.abspath(argv[0]), top.strip())
        argv[0] = script if not script.startswith("..") else argv[0]
        argv.insert(0, "python")
    return shlex.join(argv)


def record(name: str, rows: list[dict], summary: dict, results: Path) -> dict:
    """Appends one line to ``results/<name>.jsonl`` and prints the closing JSON line (the summary)."""
    torch = sys.modules.get("torch")
    entry = {
        "benchmark": name,
        "git_sha": git_sha(CHECKOUT),  # the code that ran: this checkout, wherever the results go
        **({"uncommitted": changed} if (changed := uncommitted(CHECKOUT)) else {}),
        "command": command_line(),
        "torch": torch.__version__ if torch else None,
        "versions": versions(),
        "machine": machine(),
        "threads": torch.get_num_threads() if torch else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": rows,
        **summary,
    }
    results.mkdir(parents=True, exist_ok=True)
    with open(results / f"{name}.jsonl", "a") as fh:
        fh.write(json.dumps(entry) + "\n")
    print(json.dumps(summary))
    return entry


def recorder(results: Path):
    """``record`` bound to one results folder: ``record = recorder(RESULTS)`` in a study script."""

    def bound(name: str, rows: list[dict], summary: dict) -> dict:
        return record(name, rows, summary, results)

    return bound
