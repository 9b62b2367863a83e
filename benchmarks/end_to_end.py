"""End to end on the embedded target: training tokens/s of ``make demo``'s fit and the real decoding
speedups of ``make verifiers``, read from their ``--results`` files, each decoder as a ratio to plain
greedy decoding of the same prompts in the same run.

Run after ``make demo`` and ``make verifiers``: ``python benchmarks/end_to_end.py [--run runs/quickstart]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import record

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=str(ROOT / "runs" / "quickstart"))
    args = parser.parse_args()
    run = Path(args.run)
    missing = [n for n in ("fit.json", "trained.json") if not (run / n).is_file()]
    if missing:
        raise SystemExit(f"{run}: no {', '.join(missing)}; run `make demo` (and `make verifiers`) first")
    fit = json.loads((run / "fit.json").read_text())["metrics"]
    decode = dict(json.loads((run / "trained.json").read_text())["metrics"])
    if (run / "verifiers.json").is_file():
        decode.update(json.loads((run / "verifiers.json").read_text())["metrics"])
    rows = [
        {"what": "fit", "train_tokens_per_s": fit.get("train/tokens_per_s"), "val_tau": fit.get("val/tau")}
    ]
    greedy = decode.get("decode/greedy_tokens_per_s")
    labels = sorted({k[len("decode/speedup") :] for k in decode if k.startswith("decode/speedup")})
    for suffix in labels:
        rows.append(
            {
                "what": "decode" + (suffix or "_chain"),
                "tau": decode.get(f"decode/tau{suffix}"),
                "tokens_per_s": decode.get(f"decode/tokens_per_s{suffix}"),
                "speedup_vs_greedy": decode.get(f"decode/speedup{suffix}"),
                "lossless": decode.get(f"decode/lossless{suffix}"),
            }
        )
    tps = rows[0]["train_tokens_per_s"]
    print(f"training: {tps:.0f} tokens/s" if tps else "training: no train/tokens_per_s in fit.json")
    print(f"plain greedy decoding: {greedy:.2f} tokens/s" if greedy else "no decode/greedy_tokens_per_s")
    print(f"{'decoder':>24} {'tau':>7} {'tok/s':>7} {'speedup':>8} {'lossless':>9}")
    for r in rows[1:]:
        cells = [r["tau"], r["tokens_per_s"], r["speedup_vs_greedy"], r["lossless"]]
        print(f"{r['what']:>24} " + " ".join(f"{c:>7.3f}" if c is not None else "      -" for c in cells))
    summary = {
        "benchmark": "end_to_end",
        "train_tokens_per_s": tps,
        "greedy_tokens_per_s": greedy,
        "speedup_vs_greedy": {r["what"]: r["speedup_vs_greedy"] for r in rows[1:]},
        "tau": {r["what"]: r["tau"] for r in rows[1:]},
    }
    record("end_to_end", rows, summary)


if __name__ == "__main__":
    main()
