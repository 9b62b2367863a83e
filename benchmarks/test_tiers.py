"""How long each test tier takes on this machine (issue 34: `make test`'s fast tier should take about
10 minutes on 2 quiet cores; docs/testing.md). Runs each tier's pytest command as `make` does, one
after the other, and records its wall time, its counts and its slowest tests.

    python benchmarks/test_tiers.py                 # the fast tier
    python benchmarks/test_tiers.py --tiers fast slow

Run it with nothing else on the machine: two torch processes at once slow each other many times over
on 2 cores (OpenMP threads spin while they wait).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from common import record

ROOT = Path(__file__).resolve().parent.parent
TIERS = {"fast": ["-m", "not slow"], "slow": ["-m", "slow"], "all": []}


def run_tier(tier: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests",
        *TIERS[tier],
        "--durations=10",
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", tail)}
    slowest = re.findall(r"^([\d.]+)s call\s+(\S+)", done.stdout, flags=re.M)[:10]
    print(f"{tier:<5} {wall:7.1f} s  {tail}")
    return {
        "tier": tier,
        "command": " ".join(["python", *cmd[1:]]),
        "wall_s": round(wall, 1),
        "returncode": done.returncode,
        **counts,
        "slowest": [{"test": name, "seconds": float(s)} for s, name in slowest],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiers", nargs="+", choices=list(TIERS), default=["fast"])
    args = ap.parse_args()
    rows = [run_tier(tier) for tier in args.tiers]
    record(
        "test_tiers",
        rows,
        {"wall_s": {r["tier"]: r["wall_s"] for r in rows}, "ok": all(r["returncode"] == 0 for r in rows)},
    )


if __name__ == "__main__":
    main()
