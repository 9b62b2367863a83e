"""benchmarks/hybrid_round.py runs end to end at tiny sizes, checks every mechanism before timing it,
stops on a wrong one, and writes no results file without --record."""

import json
from pathlib import Path

import pytest

from conftest import benchmark_module

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "hybrid_round.jsonl"
TINY = ["--hidden_size", "32", "--chain_tokens", "4", "--budgets", "3", "--repeats", "1", "--tree_depth", "3"]


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("hybrid_round") as module:
        yield module


def test_a_tiny_run_checks_times_and_prices_every_mechanism(bench, capsys):
    before = RESULTS.stat().st_mtime if RESULTS.exists() else None
    bench.main([*TINY, "--paper"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
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


def test_a_wrong_mechanism_stops_the_run_before_timing(bench, monkeypatch, capsys):
    commit = bench.hybrid.commit

    def one_token_short(cache, record, start, path):  # drops the last accepted token's state
        commit(cache, record, start, path[:-1] or path)
        if len(path) == 1:
            next(iter(bench.linear_layers(cache))).recurrent_states[0].mul_(1.5)

    monkeypatch.setattr(bench.hybrid, "commit", one_token_short)
    with pytest.raises(SystemExit, match="commit K=4 a=0: the cache after the round differs"):
        bench.main(TINY)
    assert "greedy step" not in capsys.readouterr().out  # stopped before any table
