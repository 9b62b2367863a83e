"""The seeds' experiments as small twins on the embedded target, same budget, side by side.

Runs ``spec-drafters fit`` on configs/twins/{dflash_v3, dflash_v5, dflash_v6, experiment_ddtree}.yaml
(260 steps each, then one teacher-forced validation over the 95 held-out records) and prints per-slot
top-1 accuracy and chain tau for each, as ratios to v6, the seeds' reference fix. Slower than the
other benchmarks: about 8 minutes a twin on 2 cores.

    python benchmarks/twins.py [--steps 260] [--only dflash_v6 ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import record

ROOT = Path(__file__).resolve().parent.parent
TWINS = ["dflash_v3", "dflash_v5", "dflash_v6", "experiment_ddtree"]


def run_twin(name: str, steps: int, out_dir: Path) -> dict:
    results = out_dir / f"{name}.json"
    cmd = [
        sys.executable, "-m", "spec_drafters.cli", "fit",
        "--config", str(ROOT / "configs" / "twins" / f"{name}.yaml"),
        "--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(steps),
        "--trainer.default_root_dir", str(out_dir / name),
        "--results", str(results),
    ]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    payload = json.loads(results.read_text())
    m = payload["metrics"]
    k = payload["drafter"]["drafter"]["block_size"]
    return {
        "twin": name,
        "block_size": k,
        "seconds": round(time.perf_counter() - t0, 1),
        "acc_slot": [round(m[f"val/acc_slot{i}"], 4) for i in range(1, k)],
        "acc": round(m["val/acc"], 4),
        "tau": round(m["val/tau"], 4),
        "tau_pooled": round(m["val/tau_pooled"], 4),
        "tau_ddtree": round(m["val/tau_ddtree"], 4) if "val/tau_ddtree" in m else None,
        "val_loss": round(m["val/loss"], 4),
        "command": " ".join(["spec-drafters", *cmd[3:]]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=260)
    ap.add_argument("--only", nargs="*", default=TWINS, choices=TWINS)
    ap.add_argument("--out", default=str(ROOT / "runs" / "twins"))
    args = ap.parse_args()
    rows = [run_twin(name, args.steps, Path(args.out)) for name in args.only]
    ref = next((r for r in rows if r["twin"] == "dflash_v6"), rows[0])
    print(f"\n{'twin':<18} {'K':>3} {'acc@1':>7} {'acc@2':>7} {'acc@3':>7} {'acc':>7} {'tau':>7} "
          f"{'tau/v6':>7} {'ddtree':>7} {'min':>5}")  # fmt: skip
    for r in rows:
        s = r["acc_slot"]
        tree = f"{r['tau_ddtree']:>7.3f}" if r["tau_ddtree"] is not None else f"{'-':>7}"
        print(
            f"{r['twin']:<18} {r['block_size']:>3} {s[0]:>7.3f} {s[1]:>7.3f} {s[2]:>7.3f} {r['acc']:>7.3f} "
            f"{r['tau']:>7.3f} {r['tau'] / ref['tau']:>7.3f} {tree} {r['seconds'] / 60:>5.1f}"
        )
    summary = {"steps": args.steps, "tau": {r["twin"]: r["tau"] for r in rows}}
    summary["tau_ratio_to_v6"] = {r["twin"]: round(r["tau"] / ref["tau"], 4) for r in rows}
    record("twins", rows, summary)


if __name__ == "__main__":
    main()
