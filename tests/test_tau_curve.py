"""A training curve over chained stages (spec_drafters/studies/curves.py, drawn by
experiments/tau_curve.py) counts training steps across resumed processes and chained stages: a later
stage's validations follow every step the earlier stages trained, checked on hand-written logs."""

from pathlib import Path

import pytest

from spec_drafters.studies import curves as tau_curve


def write_metrics(path: Path, rows: list[tuple[int, str, str]]) -> None:
    """rows of (0-based step, train/loss, val/tau) as Lightning's CSVLogger writes them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["epoch,step,train/loss,val/tau"] + [f"0,{step},{loss},{tau}" for step, loss, tau in rows]
    path.write_text("\n".join(lines) + "\n")


def test_a_second_stage_counts_after_the_first_and_a_revalidation_replaces_a_value(tmp_path):
    import os

    first, second = tmp_path / "stage1", tmp_path / "stage2"
    # stage 1: 6 steps (train logged at 2, 5), validated after 3 and 6, then resumed and 6 validated again
    write_metrics(first / "logs/version_0/metrics.csv", [(1, "2.0", ""), (2, "", "1.5"), (5, "", "1.7")])
    write_metrics(first / "logs/version_1/metrics.csv", [(5, "1.0", ""), (5, "", "1.8")])
    os.utime(first / "logs/version_0/metrics.csv", (1, 1))  # older: the resumed process's value wins
    write_metrics(second / "logs/version_0/metrics.csv", [(3, "", "1.6"), (7, "0.9", "2.1")])
    rows = tau_curve.chained([first, second], {})
    assert [(r["stage"], r["stage_step"], r["step"], r["val/tau"]) for r in rows] == [
        (1, 3, 3, 1.5),
        (1, 6, 6, 1.8),
        (2, 4, 10, 1.6),
        (2, 8, 14, 2.1),
    ]


def test_a_rerun_validation_lands_in_the_stage_that_holds_its_checkpoint(tmp_path):
    first, second = tmp_path / "stage1", tmp_path / "stage2"
    write_metrics(first / "logs/version_0/metrics.csv", [(3, "", "1.5"), (4, "1.1", "")])  # killed at 5
    write_metrics(second / "logs/version_0/metrics.csv", [(1, "", "1.9")])
    last = (first / "checkpoints/step=6.ckpt").resolve()
    rows = tau_curve.chained([first, second], {last: {5: {"val/tau": 1.7}}})
    assert [(r["stage"], r["step"], r["val/tau"]) for r in rows] == [(1, 4, 1.5), (1, 6, 1.7), (2, 8, 1.9)]
    with pytest.raises(SystemExit, match="outside every --run"):
        tau_curve.chained([second], {last: {5: {"val/tau": 1.7}}})


def test_a_rerun_validation_finds_its_checkpoint_in_the_checkout_it_ran_in(tmp_path):
    """``spec-drafters validate --results`` stores the --ckpt_path as typed (relative to the checkout
    it ran in, maybe another worktree): it is looked up above the results file too."""
    import json

    import torch

    checkout = tmp_path / "worktree"
    ckpt = checkout / "runs/ref/checkpoints/last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"global_step": 6}, ckpt)
    results = checkout / "runs/ref/last_val.json"
    results.write_text(
        json.dumps({"ckpt_path": "runs/ref/checkpoints/last.ckpt", "metrics": {"val/tau": 1.7}})
    )
    assert tau_curve.rerun_validations([results]) == {ckpt.resolve(): {5: {"val/tau": 1.7}}}
    results.write_text(json.dumps({"ckpt_path": "runs/other/last.ckpt", "metrics": {"val/tau": 1.7}}))
    with pytest.raises(SystemExit, match="found neither here nor above it"):
        tau_curve.rerun_validations([results])
