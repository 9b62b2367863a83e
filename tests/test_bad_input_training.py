"""Bad input to training through the real CLI (harness: tests/bad_input.py): an objective or optimizer
that cannot train is refused before the run starts, and a checkpoint or resume that silently changes
a setting says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bad_input import Made, check_row, config, fit, validate, write


def _mix(coefficients: str) -> str:
    return (
        "model:\n  loss:\n    class_path: LossMix\n    init_args:\n"
        "      losses: [{class_path: HardCE}, {class_path: HardCE}]\n"
        f"      coefficients: {coefficients}\n"
    )


def _sgd(lr: str) -> str:
    return f"model:\n  optimizer:\n    class_path: torch.optim.SGD\n    init_args:\n      lr: {lr}\n"


K8 = "model:\n  drafter:\n    block_size: 8\n"


def _resume(tmp: Path, made: Made, *extra: str) -> list[str]:
    """Resumes a copy of the made checkpoint (the resumed run writes under tmp, never beside it)."""
    ckpt = str(shutil.copy(made.checkpoint, tmp / "resumed.ckpt"))
    return fit(tmp, "--trainer.callbacks.dirpath", str(tmp / "ckpt"), "--ckpt_path", ckpt, *extra)


ROWS = [
    # (id, input -> command line, exit status, message fragment)
    ("mix-nan-coefficient", lambda tmp, made: config(tmp, _mix("[.nan, 0.5]")), 1,
     "--model.loss: coefficient 0 is nan: every coefficient must be a finite number"),
    ("mix-inf-coefficient", lambda tmp, made: config(tmp, _mix("[1.0, .inf]")), 1,
     "--model.loss: coefficient 1 is inf"),
    ("mix-negative-coefficient", lambda tmp, made: config(tmp, _mix("[-1.0, 0.5]")), 1,
     "--model.loss: coefficient 0 is -1.0: a negative coefficient maximises its term's loss"),
    ("mix-all-zero", lambda tmp, made: config(tmp, _mix("[0.0, 0.0]")), 1,
     "--model.loss: coefficients [0.0, 0.0] are all 0: the objective is 0 and nothing trains"),
    ("lr-negative", lambda tmp, made: fit(tmp, "--model.lr", "-0.1"), 1,
     "--model.lr: must be a positive finite number, got -0.1"),
    ("lr-zero", lambda tmp, made: fit(tmp, "--model.lr", "0"), 1,
     "--model.lr: must be a positive finite number, got 0.0"),
    ("lr-nan", lambda tmp, made: fit(tmp, "--model.lr", ".nan"), 1,
     "--model.lr: must be a positive finite number, got nan"),
    ("lr-inf", lambda tmp, made: fit(tmp, "--model.lr", ".inf"), 1,
     "--model.lr: must be a positive finite number, got inf"),
    ("lr-nan-in-config", lambda tmp, made: config(tmp, "model:\n  lr: .nan\n"), 1,
     "--model.lr: must be a positive finite number, got nan"),
    ("weight-decay-negative", lambda tmp, made: fit(tmp, "--model.weight_decay", "-1"), 1,
     "--model.weight_decay: must be a finite number >= 0, got -1.0"),
    ("warmup-fraction-above-one", lambda tmp, made: fit(tmp, "--model.warmup_fraction", "2"), 1,
     "--model.warmup_fraction: must be in [0, 1], got 2.0"),
    ("min-lr-ratio-nan", lambda tmp, made: fit(tmp, "--model.min_lr_ratio", ".nan"), 1,
     "--model.min_lr_ratio: must be in [0, 1], got nan"),
    ("optimizer-lr-zero", lambda tmp, made: config(tmp, _sgd("0.0")), 1,
     "--model.optimizer: every parameter group has learning rate 0 ([0.0]): nothing trains"),
    ("optimizer-lr-negative", lambda tmp, made: config(tmp, _sgd("-0.1")), 1,
     "--model.optimizer: Invalid learning rate: -0.1"),
    (
        "ckpt-overrides-a-config-file-shape",  # runs with the checkpoint's shape, and names the file
        lambda tmp, made: validate(tmp, str(made.checkpoint), "--config", write(tmp / "k8.yaml", K8)),
        0,
        "model.drafter.block_size 8 (set in ",
    ),
    ("resume-other-batch-size", lambda tmp, made: _resume(tmp, made, "--data.batch_size", "2"), 0,
     "--data.batch_size 2 (saved run: 4); the resumed run does not continue it exactly"),
    (
        "resume-other-data-path",
        lambda tmp, made: _resume(
            tmp, made, "--data.path", str(shutil.copy("tests/data/tiny.jsonl", tmp / "moved.jsonl"))
        ),
        0,
        "moved.jsonl (saved run: ",
    ),
    ("resume-other-max-length", lambda tmp, made: _resume(tmp, made, "--data.max_length", "64"), 0,
     "--data.max_length 64 (saved run: 96)"),
]  # fmt: skip


@pytest.mark.parametrize("make, status, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_training_input_ends_as_one_line_or_a_warning(make, status, fragment, made, tmp_path, capsys):
    check_row(make(tmp_path, made), status, fragment, capsys)


def test_a_resume_with_the_same_data_says_nothing_about_it(made, tmp_path, recwarn):
    from spec_drafters.cli.main import main

    main(_resume(tmp_path, made))
    assert not [w for w in recwarn if "other data settings" in str(w.message)]
