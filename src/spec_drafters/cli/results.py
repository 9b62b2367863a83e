"""``registry``, ``compare`` and ``validate --drafters``: what can be chosen, and results side by side.

spec-drafters registry [--json]
spec-drafters compare untrained.json trained.json
spec-drafters validate --config CONFIG --drafters A.ckpt B_FOLDER untrained [--results DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from spec_drafters.artefacts.diff import distinct_labels, legend
from spec_drafters.cli.checks import out_folder
from spec_drafters.cli.lightning_cli import run_lightning
from spec_drafters.errors import InputError, read_json
from spec_drafters.registry import KINDS, entries, load_components


def print_registry(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="spec-drafters registry",
        description="Every registered component, by kind: its name (for artefacts and listings), its "
        "class path (for configs) and its parameters.",
    )
    ap.add_argument("--json", action="store_true", help="print the listing as JSON")
    args = ap.parse_args(argv)
    load_components()
    listing = {
        kind: [
            {"name": e.name, "class_path": e.class_path, "parameters": e.parameters()} for e in entries(kind)
        ]
        for kind in KINDS
    }
    if args.json:
        print(json.dumps(listing, indent=2))
        return
    for kind, items in listing.items():
        print(f"{kind}: {KINDS[kind]}")
        for item in items:
            print(f"  {item['name']:<18} {item['class_path']}")
            print(f"  {'':<18} ({', '.join(item['parameters'])})")
        print()


def compare(argv: list[str]) -> None:
    """Prints the metrics of several ``--results`` files side by side."""
    ap = argparse.ArgumentParser(
        prog="spec-drafters compare",
        description="The metrics of several --results files (of fit or validate) side by side.",
    )
    ap.add_argument("results", nargs="+", metavar="RESULTS.json", help="a --results file")
    paths = ap.parse_args(argv).results
    runs = [_metrics(p) for p in paths]
    # Columns keyed by position, labelled by the shortest distinguishing path: two runs/*/fit.json
    # are two columns, not one (a dict keyed by file stem kept the last only).
    labels = distinct_labels([Path(p).with_suffix("") for p in paths])
    keys = sorted({k for m in runs for k in m})
    width = max([len("metric"), *map(len, keys)])
    cols = [max(14, len(label)) for label in labels]
    print(
        f"{'metric':<{width}}  " + "  ".join(f"{label:>{w}}" for label, w in zip(labels, cols, strict=True))
    )
    for k in keys:
        cells = [f"{m[k]:>{w}.4f}" if k in m else f"{'-':>{w}}" for m, w in zip(runs, cols, strict=True)]
        print(f"{k:<{width}}  " + "  ".join(cells))
    print(legend(labels, paths))


def _metrics(path: str) -> dict[str, float]:
    """The ``metrics`` of a ``--results`` file; anything else names the file and field."""
    data = read_json(path)
    metrics = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(metrics, dict):
        raise InputError(f"{path}: no 'metrics' object (compare reads the --results files of fit/validate)")
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InputError(f"{path}: metrics.{k} is {v!r}, not a number")
    return metrics


def validate_many(argv: list[str]) -> None:
    """``validate ... --drafters A B ...``: the same evaluation for several drafters, side by side.

    Each of A, B, ... is a Lightning checkpoint (.ckpt), a drafter folder of any layout (an imported
    reference drafter, say), or ``untrained``. Same config, seed and data for all; results go to
    ``--results DIR`` as <name>.json, then one table. Without ``--results``, each run gets a folder of
    its own under runs/validate_many (named by its start time), so no run overwrites another's; a
    ``--results`` folder that already holds one of the files is refused before anything runs.
    """
    i = argv.index("--drafters")
    j = next((n for n in range(i + 1, len(argv)) if argv[n].startswith("--")), len(argv))
    drafters, rest = argv[i + 1 : j], argv[:i] + argv[j:]
    if not drafters:
        raise InputError("--drafters needs at least one checkpoint, folder or 'untrained'")
    out_dir = None
    if "--results" in rest:
        k = rest.index("--results")
        if k + 1 >= len(rest):
            raise InputError("--results needs a folder (with --drafters, one <name>.json per drafter)")
        out_dir, rest = Path(rest[k + 1]), rest[:k] + rest[k + 2 :]
    names = _drafter_names(drafters)
    out_dir = _results_folder(out_dir, names)
    outputs: list[Path] = []
    for path, name in zip(drafters, names, strict=True):
        out = out_dir / f"{name}.json"
        run_lightning([*rest, *_drafter_args(path), "--results", str(out)])
        outputs.append(out)
    print()
    compare([str(o) for o in outputs])
    print(f"results of the {len(outputs)} drafters written to {out_dir}")


#: Where ``validate --drafters`` writes without ``--results``: a new folder per run inside it.
VALIDATE_MANY = Path("runs/validate_many")


def _drafter_names(drafters: list[str]) -> list[str]:
    """One file name per drafter, made distinct where two would share one."""
    names: list[str] = []
    for path in drafters:
        name = _drafter_name(path)
        names.append(f"{name}_{len(names)}" if name in names else name)
    return names


def _results_folder(given: Path | None, names: list[str]) -> Path:
    """``--results DIR`` when none of its files exists yet (refused otherwise, before any run);
    without it, a new folder under VALIDATE_MANY named by the time."""
    if given is not None:
        out_folder(given, "--results")
        taken = [f"{n}.json" for n in names if (given / f"{n}.json").exists()]
        if taken:
            raise InputError(
                f"--results {given}: already holds {', '.join(taken)} from an earlier run; "
                "give a new folder (or leave --results out for one of its own under "
                f"{VALIDATE_MANY})"
            )
        return given
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):  # two runs started in the same second get two folders
        folder = VALIDATE_MANY / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue
        return folder
    raise InputError(f"{VALIDATE_MANY}: no free folder for {stamp}")


def _drafter_name(path: str) -> str:
    if path == "untrained":
        return path
    return Path(path).stem if path.endswith(".ckpt") else Path(path).name


def _drafter_args(path: str) -> list[str]:
    """The arguments that put drafter ``path`` into a validate run."""
    if path == "untrained":
        return []
    return ["--ckpt_path", path] if path.endswith(".ckpt") else ["--model.init_from", path]


def run_validate(argv: list[str]) -> None:
    """``spec-drafters validate``: LightningCLI's, or several drafters side by side with ``--drafters``."""
    if "--drafters" in argv:  # several drafters, one table
        validate_many(["validate", *argv])
    else:
        run_lightning(["validate", *argv])
