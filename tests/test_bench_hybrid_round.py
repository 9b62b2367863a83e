"""benchmarks/hybrid_round.py, run as the program it is (no test imports a benchmark script), at tiny
sizes: it checks every mechanism before timing it, stops on a wrong one, and writes no results file
without --record."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "hybrid_round.jsonl"
TINY = ["--hidden_size", "32", "--chain_tokens", "4", "--budgets", "3", "--repeats", "1", "--tree_depth", "3"]

# The library's commit made wrong (it drops the last accepted token's state) before the script runs.
WRONG_COMMIT = """
import runpy, sys
from transformers.cache_utils import LinearAttentionCacheLayerMixin
from spec_drafters.decode import hybrid
commit = hybrid.commit
def one_token_short(cache, record, start, path):
    commit(cache, record, start, path[:-1] or path)
    if len(path) == 1:
        layer = next(l for l in cache.layers if isinstance(l, LinearAttentionCacheLayerMixin))
        layer.recurrent_states[0].mul_(1.5)
hybrid.commit = one_token_short
sys.path.insert(0, "benchmarks")
sys.argv = ["benchmarks/hybrid_round.py", *sys.argv[1:]]
runpy.run_path("benchmarks/hybrid_round.py", run_name="__main__")
"""


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_tiny_run_checks_times_and_prices_every_mechanism():
    before = RESULTS.stat().st_mtime if RESULTS.exists() else None
    done = run("benchmarks/hybrid_round.py", *TINY, "--paper")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"benchmark", "threads", "repeats", "prompt_tokens", "targets", "paper"} <= set(summary)
    (target,) = summary["targets"]
    assert {"hidden_size", "layers", "greedy_step_ms", "checks", "rounds"} <= set(target)
    # K = 4: accepted 0, 2, 3 for each of the three chain mechanisms; a tree's paths of depths 0, 2, max.
    checks = target["checks"]
    assert checks["passed"] >= 9 + 2 and set(checks["max_rel_diff"]) == {
        "commit",
        "record",
        "rerun",
        "commit_tree",
    }
    assert all(d <= checks["tolerance"] for d in checks["max_rel_diff"].values())
    rounds = target["rounds"]
    assert {f"chain K=4 {m} a={a}" for m in ("commit", "record", "rerun") for a in (0, 2, 3)} <= set(rounds)
    assert any(name.startswith("ddtree B=3 commit") for name in rounds)
    for r in rounds.values():
        assert r["verify"] > 0 and r["state"] >= 0 and 0 <= r["state_share"] < 1
    paper = summary["paper"]
    assert paper["gdn_layers"] == 48 and paper["attention_layers"] == 16
    assert set(paper["rounds"]["chain K=4 a=0"]) == {"commit", "record", "rerun"}
    assert set(paper["rounds"]["ddtree B=3"]) == {"commit", "per_node_states"}
    assert (RESULTS.stat().st_mtime if RESULTS.exists() else None) == before  # no --record: nothing written


def test_a_wrong_mechanism_stops_the_run_before_timing():
    done = run("-c", WRONG_COMMIT, *TINY)
    assert done.returncode != 0
    assert "commit K=4 a=0: the cache after the round differs" in done.stderr
    assert "greedy step" not in done.stdout  # stopped before any table
