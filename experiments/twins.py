"""The field reports' experiments as small twins on the embedded target, same budget, side by side.

Runs ``spec-drafters fit`` on configs/twins/{dflash_v3, dflash_v5, dflash_v6, experiment_ddtree}.yaml
(260 steps each), then ``spec-drafters validate`` on each last checkpoint over the 93 held-out
records (95 before the split by content),
with labels from the target's real output for every twin (what a verifier accepts, whatever the twin
trained on), and prints per-slot top-1 accuracy and chain tau, with tau as a ratio to v6, the field reports'
reference fix. Slow: about 8 minutes a twin on 2 cores.

    python experiments/twins.py [--steps 260] [--only dflash_v6 ...] [--checkpoint NAME=PATH ...]

``--checkpoint`` validates an existing checkpoint for that twin instead of training it. Each twin
finished is a kept stage under ``--out``/kept (spec_drafters/studies/stages.py; identity: the twin's
config file, the steps, the checkpoint given): a rerun trains only the twins not kept.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from spec_drafters.files import sha256_file
from spec_drafters.studies.results import recorder
from spec_drafters.studies.runner import run_cli
from spec_drafters.studies.stages import Stages

RESULTS = Path(__file__).parent / "results"
record = recorder(RESULTS)

ROOT = Path(__file__).resolve().parent.parent
TWINS = ["dflash_v3", "dflash_v5", "dflash_v6", "experiment_ddtree"]


def _tree_tau(metrics: dict) -> float | None:
    """The configured DDTree's tau: val/tau_ddtree_b<budget> (val/tau_ddtree in results before issue 34)."""
    keys = [k for k in metrics if re.fullmatch(r"val/tau_ddtree(_b\d+)?", k)]
    return round(metrics[keys[0]], 4) if keys else None


def run_twin(name: str, steps: int, out_dir: Path, checkpoint: str | None) -> dict:
    config = str(ROOT / "configs" / "twins" / f"{name}.yaml")
    t0 = time.perf_counter()
    fit_cmd = ["fit", "--config", config, "--trainer.max_steps", str(steps),
               "--trainer.val_check_interval", str(steps), "--trainer.limit_val_batches", "0",
               "--trainer.default_root_dir", str(out_dir / name),
               "--results", str(out_dir / f"{name}.fit.json")]  # fmt: skip
    if checkpoint is None:
        run_cli(*fit_cmd)
        checkpoint = json.loads((out_dir / f"{name}.fit.json").read_text())["last_checkpoint"]
    fit_seconds = time.perf_counter() - t0
    results = out_dir / f"{name}.json"
    val_cmd = ["validate", "--config", config, "--ckpt_path", str(checkpoint), "--trainer.logger", "false",
               "--trainer.default_root_dir", str(out_dir / name), "--results", str(results)]  # fmt: skip
    run_cli(*val_cmd)
    payload = json.loads(results.read_text())
    m = payload["metrics"]
    k = payload["drafter"]["drafter"]["block_size"]
    return {
        "twin": name,
        "block_size": k,
        "fit_seconds": round(fit_seconds, 1),
        "acc_slot": [round(m[f"val/acc_slot{i}"], 4) for i in range(1, k)],
        "acc": round(m["val/acc"], 4),
        "tau": round(m["val/tau"], 4),
        "tau_pooled": round(m["val/tau_pooled"], 4),
        "tau_ddtree": _tree_tau(m),
        "val_loss": round(m["val/loss"], 4),
        "checkpoint": str(checkpoint),
        "commands": ["spec-drafters " + " ".join(fit_cmd), "spec-drafters " + " ".join(val_cmd)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=260)
    ap.add_argument("--only", nargs="*", default=TWINS, choices=TWINS)
    ap.add_argument("--out", default=str(ROOT / "runs" / "twins"))
    ap.add_argument("--checkpoint", nargs="*", default=[], metavar="NAME=PATH")
    args = ap.parse_args()
    given = dict(item.split("=", 1) for item in args.checkpoint)
    stages = Stages(Path(args.out) / "kept")  # a twin finished is kept: a rerun trains only the others

    def twin(name: str) -> dict:
        config = ROOT / "configs" / "twins" / f"{name}.yaml"
        identity = {"config_sha256": sha256_file(config), "steps": args.steps, "checkpoint": given.get(name)}
        run = lambda: run_twin(name, args.steps, Path(args.out), given.get(name))  # noqa: E731
        return stages.run(name, run, identity)["result"]

    rows = [twin(name) for name in args.only]
    ref = next((r for r in rows if r["twin"] == "dflash_v6"), rows[0])
    print(f"\n{'twin':<18} {'K':>3} {'acc@1':>7} {'acc@2':>7} {'acc@3':>7} {'acc':>7} {'tau':>7} "
          f"{'tau/v6':>7} {'ddtree':>7} {'fit min':>7}")  # fmt: skip
    for r in rows:
        s = r["acc_slot"]
        tree = f"{r['tau_ddtree']:>7.3f}" if r["tau_ddtree"] is not None else f"{'-':>7}"
        print(
            f"{r['twin']:<18} {r['block_size']:>3} {s[0]:>7.3f} {s[1]:>7.3f} {s[2]:>7.3f} {r['acc']:>7.3f} "
            f"{r['tau']:>7.3f} {r['tau'] / ref['tau']:>7.3f} {tree} {r['fit_seconds'] / 60:>7.1f}"
        )
    summary = {"steps": args.steps, "tau": {r["twin"]: r["tau"] for r in rows}}
    summary["tau_ratio_to_v6"] = {r["twin"]: round(r["tau"] / ref["tau"], 4) for r in rows}
    record("twins", rows, summary)


if __name__ == "__main__":
    main()
