"""The recipe study's test over seeds (spec_drafters/studies/stats.py ``permutation_p``, quoted by
experiments/stats.py), against hand-counted cases:
it must say that two seeds a side cannot separate two recipes, and separate them with enough seeds."""

import pytest

from spec_drafters.studies import stats


def test_two_seeds_a_side_never_go_below_one_sixth():
    # 6 ways to pick 2 of 4; only the observed split has a difference >= +2: p = 1/6, never less
    assert stats.permutation_p([3.0, 4.0], [1.0, 2.0]) == pytest.approx(1 / 6)
    # reversed, every split but the most extreme one in the other direction is >= the observed -2
    assert stats.permutation_p([1.0, 2.0], [3.0, 4.0]) == pytest.approx(1.0)


def test_ties_and_overlap_counted_by_hand():
    # a = {2, 3}, b = {1, 4}: observed 0; splits (means) {2,3}|{1,4} 0, {2,1}|{3,4} -2, {2,4}|{3,1} +1,
    # {3,1}|{2,4} -1, {3,4}|{2,1} +2, {1,4}|{2,3} 0: four of six are >= 0
    assert stats.permutation_p([2.0, 3.0], [1.0, 4.0]) == pytest.approx(4 / 6)


def test_four_seeds_a_side_can_separate():
    # C(8, 4) = 70 splits; the observed one is the only one with all of a above all of b
    assert stats.permutation_p([5.0, 6.0, 7.0, 8.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(1 / 70)


def test_the_table_and_its_summary_word_two_seeds_as_not_separated():
    rows = [
        {"recipe": "v6", "val/tau": 1.5, "val/tau_ddtree_b32": 2.18},
        {"recipe": "v6", "val/tau": 1.5, "val/tau_ddtree_b32": 2.19},
        {"recipe": "speculators_2026", "val/tau": 1.6, "val/tau_ddtree_b32": 2.25},
        {"recipe": "speculators_2026", "val/tau": 1.7, "val/tau_ddtree_b32": 2.32},
    ]
    for r in rows:
        r.update({"val/calibration_ece": 0.01, "val/acc_slot1": 0.4})
    table = stats.recipe_table(rows)
    assert [r["recipe"] for r in table] == ["speculators_2026", "v6"]
    assert table[0]["p_vs_v6"] == pytest.approx(1 / 6) and table[1]["p_vs_v6"] is None
    summary = stats.table_summary(table, 400, 3200, [0, 1])
    assert summary["best"] == "speculators_2026" and summary["separated_from_v6"] is False
    assert summary["best_minus_v6_ddtree_tau"] == pytest.approx(0.1)
