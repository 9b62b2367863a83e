"""``calibrate``: per-slot temperatures for the drafter's probabilities, fitted on held-out blocks, with
the prefix ECE before and after (decode/calibration.py).

    spec-drafters calibrate --config CONFIG --ckpt_path CKPT --out FOLDER_OR_JSON
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from spec_drafters.cli.lightning_cli import load_module


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
def held_out(module, data) -> tuple[torch.Tensor, torch.Tensor]:
    """Every validation block of ``data``: logits (A, K-1, V) and labels (A, K-1)."""
    from spec_drafters.data.records import collate

    _, val = data.examples(module.tokenizer)
    logits, labels = [], []
    for i in range(0, len(val), data.val_batch_size):
        _, per_block, block_labels, _ = module.held_out_blocks(collate(val[i : i + data.val_batch_size]), i)
        logits.append(per_block.float())
        labels.append(block_labels)
    return torch.cat(logits), torch.cat(labels)


def calibrate(argv: list[str]) -> None:
    from spec_drafters.decode.calibration import fit_temperatures, prefix_ece, save

    ap = calibrate_parser()
    args, rest = ap.parse_known_args(argv)
    if not 0 < args.fit_fraction < 1:
        ap.error(f"--fit_fraction must be in (0, 1), got {args.fit_fraction}")
    module, data = load_module(rest, with_data=True)
    logits, labels = held_out(module, data)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(len(order) * args.fit_fraction)
    fit, test = order[:cut], order[cut:]
    temps = fit_temperatures(logits[fit], labels[fit])
    report = {
        "blocks_fitted": len(fit),
        "blocks_measured": len(test),
        "ece_before": prefix_ece(logits[test], labels[test]),
        "ece_after": prefix_ece(logits[test], labels[test], temps),
    }
    out = Path(args.out)
    out = out / "calibration.json" if out.is_dir() or not out.suffix else out
    out.parent.mkdir(parents=True, exist_ok=True)
    save(out, temps, report)
    print("slot temperatures: " + " ".join(f"{t:.3g}" for t in temps))
    print(
        f"prefix ECE on {len(test)} held-out blocks: {report['ece_before']:.4f} -> {report['ece_after']:.4f}"
    )
    print(json.dumps({"out": str(out), "slot_temperatures": temps, **report}))
