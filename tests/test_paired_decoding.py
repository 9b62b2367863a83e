"""Two decoding-run folders paired prompt by prompt (spec_drafters/studies/stats.py, run by
benchmarks/paired_decoding.py): hand-computed differences and wins, an exactly known bootstrap interval,
and refusals for folders that cannot pair."""

import json
from pathlib import Path

import pytest

from spec_drafters.studies import decoding_runs, stats


def folder(path: Path, pieces: list[list[tuple[int, float, float]]]) -> Path:
    """A result folder: per piece, (prompt tokens, chain tau, DDTree-32 tau) of each prompt."""
    path.mkdir()
    n = sum(len(p) for p in pieces)
    (path / "identity.json").write_text(json.dumps({"parts": len(pieces), "num_prompts": n}))
    for part, rows in enumerate(pieces):
        lines = [
            json.dumps({"prompt": i, "prompt_tokens": t, "tau": c, "tau_ddtree_b32": d})
            for i, (t, c, d) in enumerate(rows)
        ]
        piece = path / f"part-{part:02d}-of-{len(pieces):02d}"
        piece.with_suffix(".jsonl").write_text("\n".join(lines) + "\n")
        piece.with_suffix(".json").write_text(json.dumps({"result": {}}))  # the piece's kept stage
    return path


def test_differences_and_wins_by_hand(tmp_path):
    # prompt counts restart in every piece: pairing is by (piece, prompt), not by prompt alone
    a = folder(tmp_path / "a", [[(10, 2.0, 3.0), (20, 1.0, 2.0)], [(30, 1.5, 2.5)]])
    b = folder(tmp_path / "b", [[(10, 1.0, 3.0), (20, 1.0, 2.5)], [(30, 2.0, 2.0)]])
    rows = stats.paired(decoding_runs.folder_rows(a), decoding_runs.folder_rows(b), resamples=200)
    chain, tree = rows
    assert (chain["decoder"], tree["decoder"]) == ("chain", "ddtree B=32")
    assert chain["tau_a"] == pytest.approx(1.5) and chain["tau_b"] == pytest.approx(4 / 3)
    assert chain["diff"] == pytest.approx((1.0 + 0.0 - 0.5) / 3)
    assert (chain["a_wins"], chain["ties"], chain["b_wins"]) == (1, 1, 1)
    assert tree["diff"] == pytest.approx((0.0 - 0.5 + 0.5) / 3)
    assert (tree["a_wins"], tree["ties"], tree["b_wins"]) == (1, 1, 1)
    # the interval lies between the smallest and largest per-prompt difference and holds the mean
    assert -0.5 <= chain["low"] <= chain["diff"] <= chain["high"] <= 1.0


def test_bootstrap_interval_exactly_known():
    # one value: every resample has that mean
    assert stats.bootstrap_interval([0.25] * 7, resamples=500, seed=3) == (0.25, 0.25)
    # two values 0 and 1: a resample's mean is 0, 0.5 or 1 with chances 1/4, 1/2, 1/4, so the 2.5th and
    # 97.5th percentiles of 2,000 resamples (the 50th and 1,950th) are 0 and 1 unless fewer than 50 resamples
    # are all 0s or fewer than 51 all 1s: a chance far below 1e-100
    assert stats.bootstrap_interval([0.0, 1.0], resamples=2000, seed=0) == (0.0, 1.0)


def test_folders_that_cannot_pair_are_refused(tmp_path):
    a = folder(tmp_path / "a", [[(10, 2.0, 3.0)], [(30, 1.5, 2.5)]])
    other_prompt = folder(tmp_path / "b", [[(10, 2.0, 3.0)], [(31, 1.5, 2.5)]])
    with pytest.raises(ValueError, match="different prompts"):
        stats.paired(decoding_runs.folder_rows(a), decoding_runs.folder_rows(other_prompt))
    unfinished = folder(tmp_path / "c", [[(10, 2.0, 3.0)], [(30, 1.5, 2.5)]])
    (unfinished / "part-01-of-02.jsonl").unlink()
    with pytest.raises(SystemExit, match="piece 2 of 2 is missing"):
        decoding_runs.folder_rows(unfinished)


def test_speed_against_prompt_lookup_by_hand():
    rows = [
        {"new_tokens": 10, "seconds": 1.0, "tokens_per_s": 10.0,
         "new_tokens_prompt_lookup": 10, "seconds_prompt_lookup": 2.0, "tokens_per_s_prompt_lookup": 5.0},
        {"new_tokens": 20, "seconds": 4.0, "tokens_per_s": 5.0,
         "new_tokens_prompt_lookup": 20, "seconds_prompt_lookup": 2.0, "tokens_per_s_prompt_lookup": 10.0},
    ]  # fmt: skip
    (chain,) = stats.speed_against(rows, resamples=400)
    # pooled: 30 tokens in 5 s against 30 tokens in 4 s
    assert chain["decoder"] == "chain" and chain["ratio"] == pytest.approx(0.8) and chain["faster_on"] == 1
    # a resample holds only the first prompt (2.0), only the second (0.5), or both (0.8)
    assert 0.5 <= chain["low"] <= chain["ratio"] <= chain["high"] <= 2.0
    with pytest.raises(ValueError, match="no prompt lookup rows"):
        stats.speed_against([{"new_tokens": 1, "seconds": 1.0}])
