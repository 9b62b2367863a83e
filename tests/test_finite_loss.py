"""The finite guard: a run whose loss, gradients or weights stop being finite ends at once with one line
naming the step, the loss terms and the last checkpoint, and no checkpoint it writes holds a NaN or an
infinity; and ``lint`` flags an objective that cannot train."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bad_input import TINY, fit, write
from spec_drafters.cli.main import main
from spec_drafters.lightning.module import DFlashModule
from spec_drafters.train.losses import HardCE, LossMix, TotalVariation
from spec_drafters.train.objective import Diverged, divergence_message


def _diverging(tmp: Path, *extra: str) -> list[str]:
    """lr 1e30 on the tiny config, a checkpoint after every step: step 0 moves the weights to ~1e30
    (finite), and step 1's loss and gradients are NaN."""
    every_step = [
        "--trainer.callbacks.every_n_train_steps",
        "1",
        "--trainer.callbacks.dirpath",
        str(tmp / "ckpt"),
    ]
    return fit(tmp, "--model.lr", "1e30", "--trainer.max_steps", "8", *every_step, *extra)


def _nonfinite_tensors(path: Path) -> list[str]:
    """Every tensor of a checkpoint file that holds a NaN or an infinity, but for its callbacks' state,
    where Lightning's ModelCheckpoint keeps inf on purpose (kth_value: no k-th best score yet)."""
    checkpoint = torch.load(path, weights_only=True, map_location="cpu")
    found = []

    def walk(name, value):
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and not torch.isfinite(value).all():
                found.append(name)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{name}.{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{name}.{i}", v)

    for key, value in checkpoint.items():
        if key != "callbacks":
            walk(key, value)
    return found


def test_the_tiny_config_diverges_at_lr_1e30_without_the_guard(tmp_path, monkeypatch):
    """The control for the test below: with the guard switched off, the same fit ends with rc 0 and a
    last.ckpt whose every weight is NaN (the issue's report)."""
    monkeypatch.setattr(DFlashModule, "_stop_unless_finite", lambda self, named, outcome: None)
    main([*_diverging(tmp_path), "--trainer.max_steps", "3"])
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert all(torch.isnan(v).all() for v in checkpoint["state_dict"].values() if v.is_floating_point())


def test_a_diverging_fit_stops_within_a_few_steps_and_writes_only_finite_checkpoints(tmp_path):
    with pytest.raises(SystemExit) as exited:
        main(_diverging(tmp_path))
    message = exited.value.code
    assert isinstance(message, str) and message.startswith("spec-drafters: error: training diverged at step ")
    assert "\n" not in message
    assert 1 <= int(re.search(r"at step (\d+)", message).group(1)) <= 3, message
    assert "the step was not taken: non-finite train/loss" in message
    assert "loss terms: train/loss=nan" in message
    assert f"last checkpoint (finite): {tmp_path / 'ckpt' / 'last.ckpt'}" in message
    written = sorted(tmp_path.rglob("*.ckpt"))
    assert written  # step 0's, whose weights are huge but finite
    for path in written:
        assert _nonfinite_tensors(path) == [], path


@pytest.fixture(scope="module")
def module():
    from conftest import module_from_config

    return module_from_config(TINY)


def _trainer(tmp: Path, failed_ranks: float = 0.0, world_size: int = 1, step: int = 7):
    """What the guard reads of a Trainer: the flag's reduction over ranks (here: this rank's flag
    plus ``failed_ranks`` others), the precision plugin, the checkpoint callbacks."""
    last = write(tmp / "last.ckpt", b"written before")
    return SimpleNamespace(
        precision_plugin=SimpleNamespace(),
        strategy=SimpleNamespace(
            root_device=torch.device("cpu"), reduce=lambda t, reduce_op: t + failed_ranks
        ),
        world_size=world_size,
        global_rank=0,
        global_step=step,
        checkpoint_callbacks=[SimpleNamespace(last_model_path=last, best_model_path="")],
    )


def test_the_guard_refuses_a_step_on_a_nonfinite_gradient_naming_step_terms_and_checkpoint(
    module, tmp_path, monkeypatch
):
    monkeypatch.setattr(module, "_trainer", _trainer(tmp_path))
    weight = module.drafter.fc.weight
    weight.grad = torch.zeros_like(weight)
    weight.grad[0, 0] = float("inf")
    module._step_parts = [{"loss": torch.tensor(1.5), "ce": torch.tensor(2.25)}]
    try:
        with pytest.raises(Diverged) as refused:
            module.on_before_optimizer_step(None)
    finally:
        weight.grad = None
    message = str(refused.value)
    assert message.startswith("training diverged at step 7, the step was not taken: ")
    assert "non-finite gradient of drafter.fc.weight;" in message
    assert "loss terms: train/loss=1.5, train/ce=2.25;" in message
    assert f"last checkpoint (finite): {tmp_path / 'last.ckpt'}" in message


def test_every_rank_stops_when_another_rank_diverged(module, tmp_path, monkeypatch):
    monkeypatch.setattr(module, "_trainer", _trainer(tmp_path, failed_ranks=1.0, world_size=2))
    module._step_parts = [{"loss": torch.tensor(1.5)}]  # finite here
    with pytest.raises(Diverged, match=r"at step 7 \(on another rank\), the step was not taken"):
        module.on_before_optimizer_step(None)


def test_a_finite_step_passes(module, tmp_path, monkeypatch):
    monkeypatch.setattr(module, "_trainer", _trainer(tmp_path))
    module._step_parts = [{"loss": torch.tensor(1.5)}]
    module.on_before_optimizer_step(None)


def test_a_nonfinite_checkpoint_is_never_written(module):
    module._last_terms = {"loss": torch.tensor(float("nan")), "kl": torch.tensor(0.5)}
    state = {"drafter.fc.weight": torch.tensor([1.0, float("nan")]), "drafter.norm.weight": torch.ones(2)}
    optimizer = [{"state": {0: {"exp_avg": torch.tensor([float("inf")])}}}]
    with pytest.raises(Diverged) as refused:
        module.on_save_checkpoint({"state_dict": state, "optimizer_states": optimizer})
    message = str(refused.value)
    assert message.startswith("training diverged at step 0, no checkpoint written: non-finite ")
    assert "drafter.fc.weight, optimizer.0.state.0.exp_avg;" in message
    assert "train/loss=nan, train/kl=0.5" in message and "no checkpoint was written" in message
    module.on_save_checkpoint({"state_dict": {"drafter.norm.weight": torch.ones(2)}})  # finite: saved


def test_the_message_shortens_a_long_list():
    message = divergence_message("step 3", [f"t{i}" for i in range(5)], {"loss": 2.0}, "a/last.ckpt")
    assert (
        "non-finite t0, t1, t2 and 2 more; loss terms: loss=2; last checkpoint (finite): a/last.ckpt"
        in message
    )


@pytest.mark.parametrize(
    "coefficients, fragment",
    [
        ([float("nan"), 1.0], "coefficient 0 is nan"),
        ([1.0, float("-inf")], "coefficient 1 is -inf"),
        ([-0.5, 1.0], "coefficient 0 is -0.5: a negative coefficient"),
        ([0.0, 0.0], "are all 0"),
    ],
)
def test_a_loss_mix_refuses_coefficients_that_cannot_train(coefficients, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        LossMix([HardCE(), TotalVariation()], coefficients)


def test_a_zero_coefficient_beside_a_positive_one_switches_its_term_off():
    assert LossMix([HardCE(), TotalVariation()], [0.0, 1.0]).coefficients == [0.0, 1.0]


def test_lint_flags_an_optimizer_that_cannot_train(tmp_path, capsys):
    sgd = write(tmp_path / "sgd.yaml", "model:\n  optimizer:\n    class_path: torch.optim.SGD\n"
                "    init_args:\n      lr: 0.0\n")  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        main(["lint", "--config", TINY, "--config", sgd])
    assert exited.value.code == 1
    assert re.search(
        r"error +objective-cannot-train +--model.optimizer: every parameter group", capsys.readouterr().out
    )


def test_lint_flags_coefficients_that_bypassed_validation(module, monkeypatch):
    from spec_drafters.artefacts.lint import lint_setup

    mix = LossMix([HardCE(), TotalVariation()], [0.1, 0.9])
    mix.coefficients = [0.0, 0.0]  # set after the constructor checked them
    monkeypatch.setattr(module.built, "loss_fn", mix)
    found = lint_setup(module.built)
    assert [(f.severity, f.code) for f in found if "LossMix" in f.message] == [
        ("error", "objective-cannot-train")
    ]


@pytest.mark.slow  # two FSDP2 processes
def test_under_fsdp2_every_rank_stops_at_the_same_step(tmp_path):
    """The repo's sharded path (ModelParallelStrategy, 2 CPU processes over gloo): each rank reduces the
    flag, so both end at step 1 with the one line, and the consolidated last.ckpt is finite."""
    cli = str(Path(sys.executable).parent / "spec-drafters")
    cmd = [cli, *_diverging(tmp_path, "--config", "configs/presets/fsdp2_cpu.yaml", "--data.batch_size", "2")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    # each rank prints its line (two processes writing at once may join them on one line)
    stopped = re.findall(r"spec-drafters: error: training diverged at step (\d+) \(rank (\d)\)", done.stderr)
    assert sorted(stopped) == [("1", "0"), ("1", "1")], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert _nonfinite_tensors(tmp_path / "ckpt" / "last.ckpt") == []
