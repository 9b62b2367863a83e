"""``calibrate``: per-slot temperatures for the drafter's probabilities, fitted on held-out blocks, with
the prefix ECE before and after (decode/calibration.py).

    spec-drafters calibrate --config CONFIG --ckpt_path CKPT --out FOLDER_OR_JSON
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch

from spec_drafters.artefacts.setup import DrafterSetup
from spec_drafters.cli.checks import out_file
from spec_drafters.cli.setup_args import load_setup
from spec_drafters.errors import InputError


def calibrate_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="spec-drafters calibrate",
        description="Fit one temperature per block slot on the validation records (--data.*), so that "
        "the drafter's probability of each top-1 prefix is calibrated; write calibration.json into a "
        "drafter folder (or to a .json path) for DDTree's init_args.calibration. Other arguments "
        "(--config, --ckpt_path, --model.*, --data.*) are LightningCLI's.",
        allow_abbrev=False,
    )
    ap.add_argument(
        "--out", required=True, help="a drafter folder (calibration.json goes in it) or a .json file"
    )
    ap.add_argument("--fit_fraction", type=float, default=0.5, help="blocks fitted on; the rest measure ECE")
    return ap


@torch.no_grad()
def held_out(setup: DrafterSetup, data) -> tuple[torch.Tensor, torch.Tensor]:
    """Every validation block of ``data``: logits (A, K-1, V) and labels (A, K-1)."""
    from spec_drafters.data.records import collate

    try:
        _, val = data.examples(setup.tokenizer)
    except InputError:
        raise
    except ValueError as e:  # no usable records in a split
        raise InputError(
            f"calibrate: {e}; it fits and measures on the validation records of --data.path "
            "('split': 'val') or --data.val_path"
        ) from None
    logits, labels, steps = [], [], setup.step_builder()
    for i in range(0, len(val), data.val_batch_size):
        batch = collate(val[i : i + data.val_batch_size])
        inp = setup.held_out_inputs(batch, i)
        per_block, block_labels = setup.scored_blocks(inp, steps.draft_hidden(inp))
        logits.append(per_block.float())
        labels.append(block_labels)
    return torch.cat(logits), torch.cat(labels)


def calibrate(argv: list[str]) -> None:
    from spec_drafters.decode.calibration import fit_temperatures, prefix_ece, save

    ap = calibrate_parser()
    args, rest = ap.parse_known_args(argv)
    if not 0 < args.fit_fraction < 1:
        raise InputError(f"--fit_fraction must be in (0, 1), got {args.fit_fraction}")
    out = Path(args.out)
    out = out_file(out / "calibration.json" if out.is_dir() or not out.suffix else out)  # before the work
    setup, data = load_setup(rest, with_data=True)
    logits, labels = held_out(setup, data)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(len(order) * args.fit_fraction)
    if not 0 < cut < len(order):
        raise InputError(
            f"calibrate: {len(order)} held-out blocks, {cut} of them to fit (--fit_fraction "
            f"{args.fit_fraction}): both the fitted and the measured share need at least one"
        )
    fit, test = order[:cut], order[cut:]
    temps = fit_temperatures(logits[fit], labels[fit])
    report = {
        "blocks_fitted": len(fit),
        "blocks_measured": len(test),
        "ece_before": prefix_ece(logits[test], labels[test]),
        "ece_after": prefix_ece(logits[test], labels[test], temps),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    save(out, temps, report)
    print("slot temperatures: " + " ".join(f"{t:.3g}" for t in temps))
    print(
        f"prefix ECE on {len(test)} held-out blocks: {report['ece_before']:.4f} -> {report['ece_after']:.4f}"
    )
    if report["ece_after"] > report["ece_before"]:
        # Written all the same (the report beside them says so): DDTree ranks with them only if asked.
        warnings.warn(
            f"calibrate: the temperatures made the held-out prefix ECE worse "
            f"({report['ece_before']:.4f} -> {report['ece_after']:.4f} on {len(test)} blocks); "
            f"{out} records both. Ranking with them is likely worse than without: more held-out "
            "records (--data.*) or another --fit_fraction may help",
            stacklevel=1,
        )
    print(json.dumps({"out": str(out), "slot_temperatures": temps, **report}))
