"""A run interrupted mid-epoch and resumed from its last checkpoint continues exactly: the same losses,
step for step, as the uninterrupted run (optimizer, scheduler, data order and position, anchor RNG)."""

import csv
import warnings

import lightning.pytorch as pl
import pytest

from spec_drafters.cli.main import main


class StopAt(pl.Callback):
    """Ends fit after ``step`` optimizer steps, like a kill right after a checkpoint."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def _fit(root, *extra):
    main(
        ["fit", "--config", "tests/configs/tiny.yaml", "--data.batch_size", "2", "--trainer.max_steps", "14",
         "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(root),
         "--trainer.default_root_dir", str(root), "--trainer.callbacks.every_n_train_steps", "1",
         "--trainer.callbacks.dirpath", str(root / "ckpt"), *extra]
    )  # fmt: skip


def _losses(root) -> dict[int, float]:
    return {step: loss for step, (_, loss) in _epochs_and_losses(root).items()}


def _epochs_and_losses(root) -> dict[int, tuple[int, float]]:
    out = {}
    for metrics in root.rglob("metrics.csv"):
        for row in csv.DictReader(metrics.open()):
            if row.get("train/loss"):
                out[int(row["step"])] = (int(row["epoch"]), float(row["train/loss"]))
    return out


def test_resumed_run_matches_the_uninterrupted_one(tmp_path):
    _fit(tmp_path / "full")
    _fit(tmp_path / "cut", "--trainer.callbacks+=test_resume.StopAt", "--trainer.callbacks.step", "4")
    cut = _losses(tmp_path / "cut")
    assert max(cut) == 3  # stopped after 4 steps of a 10-batch epoch: mid-epoch
    with warnings.catch_warnings(record=True) as caught:
        _fit(tmp_path / "cut", "--ckpt_path", str(tmp_path / "cut" / "ckpt" / "last.ckpt"))
    # the resume is exact (below), so Lightning's "dataloader is not resumable" warning must not show
    assert not [w for w in caught if "not resumable" in str(w.message)]
    full, resumed = _losses(tmp_path / "full"), _losses(tmp_path / "cut")
    assert sorted(full) == sorted(resumed) == list(range(14))  # crosses into the second epoch
    for step in range(14):
        assert resumed[step] == full[step], (step, resumed[step], full[step])


def test_resume_from_the_last_batch_of_an_epoch_starts_the_next_epoch(tmp_path):
    # 3 batches per epoch; the last checkpoint before the cut is at step 6, the last batch of epoch 1.
    # Lightning finishes that epoch on restore: the next epoch must be 2, read from its first batch.
    small = ["--data.max_train_records", "6", "--trainer.max_steps", "10"]
    _fit(tmp_path / "full", *small)
    _fit(tmp_path / "cut", *small, "--trainer.callbacks+=test_resume.StopAt", "--trainer.callbacks.step", "6")
    assert max(_losses(tmp_path / "cut")) == 5
    _fit(tmp_path / "cut", *small, "--ckpt_path", str(tmp_path / "cut" / "ckpt" / "last.ckpt"))
    full, resumed = _epochs_and_losses(tmp_path / "full"), _epochs_and_losses(tmp_path / "cut")
    assert sorted(full) == sorted(resumed) == list(range(10))
    assert [full[s][0] for s in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    for step in range(10):
        assert resumed[step] == full[step], (step, resumed[step], full[step])


class KillDuringSave(pl.Callback):
    """From optimizer step ``step`` on, the next checkpoint write stops halfway and the process is
    SIGKILLed: a kill (OOM killer, preemption) in the middle of writing last.ckpt."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step < self.step:
            return
        import os
        import signal

        from fsspec.implementations.local import LocalFileOpener

        write = LocalFileOpener.write

        def half_then_die(opener, data):
            write(opener, bytes(data)[: len(data) // 2])
            opener.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        LocalFileOpener.write = half_then_die


@pytest.mark.slow  # a killed subprocess fit
def test_a_kill_during_a_save_leaves_the_previous_checkpoint_whole(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import torch

    cli = str(Path(sys.executable).parent / "spec-drafters")
    common = ["--config", "tests/configs/tiny.yaml", "--trainer.max_steps", "8",
              "--trainer.default_root_dir", str(tmp_path), "--trainer.callbacks.dirpath", str(tmp_path),
              "--trainer.callbacks.every_n_train_steps", "1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": "tests"}
    killed = subprocess.run([cli, "fit", *common, "--trainer.callbacks+=test_resume.KillDuringSave",
                             "--trainer.callbacks.step", "3"], env=env, capture_output=True)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)  # whole, not half written
    assert last["global_step"] == 2  # the save at step 3 never replaced it
    resumed = subprocess.run([cli, "fit", *common, "--ckpt_path", str(tmp_path / "last.ckpt")],
                             env=env, capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 8


class FailInValidation(pl.Callback):
    """Raises when validation starts at optimizer step ``step``: a kill during the run's last validation."""

    def __init__(self, step: int):
        self.step = step

    def on_validation_start(self, trainer, *args):
        if trainer.global_step == self.step:
            raise RuntimeError("killed during validation")


def _validations(root) -> dict[int, float]:
    return {
        int(row["step"]): float(row["val/tau"])
        for metrics in root.rglob("metrics.csv")
        for row in csv.DictReader(metrics.open())
        if row.get("val/tau")
    }


def test_reference_resume_point_redoes_a_validation_cut_by_a_kill(tmp_path):
    """configs/reference_smollm2.yaml's resume checkpoint, on the tiny target: a run killed during its
    last validation, resumed from last.ckpt, validates at max_steps like the uninterrupted run."""
    import json

    import pytest

    resume_point = _reference_callbacks()["resume"]

    def fit(root, *extra, kill=None):
        args = {**resume_point["init_args"], "dirpath": str(root / "ckpt")}
        callbacks = [{"class_path": resume_point["class_path"], "init_args": args}]
        if kill:
            callbacks.append({"class_path": "test_resume.FailInValidation", "init_args": {"step": kill}})
        main(["fit", "--config", "tests/configs/tiny.yaml", "--data.batch_size", "2",
              "--trainer.max_steps", "4", "--trainer.check_val_every_n_epoch", "null",
              "--trainer.val_check_interval", "2", "--trainer.logger", "CSVLogger",
              "--trainer.logger.save_dir", str(root), "--trainer.default_root_dir", str(root),
              "--trainer.callbacks", json.dumps(callbacks), *extra])  # fmt: skip

    fit(tmp_path / "full")
    full = _validations(tmp_path / "full")
    assert len(full) == 2  # after steps 2 and 4
    with pytest.raises(RuntimeError, match="killed during validation"):
        fit(tmp_path / "cut", kill=4)
    assert _validations(tmp_path / "cut") == {min(full): full[min(full)]}
    fit(tmp_path / "cut", "--ckpt_path", str(tmp_path / "cut" / "ckpt" / "last.ckpt"))
    assert _validations(tmp_path / "cut") == full  # the last one redone, and equal (exact resume)


def _reference_callbacks() -> dict:
    """configs/reference_smollm2.yaml's two ModelCheckpoints, by role, and its callback list."""
    from pathlib import Path

    import yaml

    config = yaml.safe_load((Path(__file__).parent.parent / "configs" / "reference_smollm2.yaml").read_text())
    callbacks = config["trainer"]["callbacks"]
    checkpoints = [c for c in callbacks if c["class_path"] == "ModelCheckpoint"]
    (resume,) = [c for c in checkpoints if c["init_args"].get("save_last")]
    (best,) = [c for c in checkpoints if c["init_args"].get("monitor") == "val/tau"]
    return {"resume": resume, "best": best, "all": callbacks}


class KillAt(pl.Callback):
    """Raises after optimizer step ``step``: a kill between validations (a stop would validate)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            raise RuntimeError("killed")


class ScriptedTau(pl.Callback):
    """Logs a scripted held-out score per optimizer step as ``scripted/tau``, for a ModelCheckpoint
    that monitors it in place of val/tau (whose real values on the tiny target are not ours to pick)."""

    def __init__(self, taus: dict):
        self.taus = {int(step): float(tau) for step, tau in taus.items()}

    def on_validation_epoch_end(self, trainer, pl_module):
        pl_module.log("scripted/tau", self.taus[trainer.global_step])


def test_reference_best_checkpoint_survives_a_resume(tmp_path):
    """The reference config's callbacks on the tiny target, the best one monitoring a held-out score
    scripted 1, 3, 2 at steps 2, 4, 6: a run killed after step 4's validation and resumed from
    last.ckpt must still leave step 4 as best/best.ckpt, alone (the file `make reference` exports).
    With the resume point listed before the best callback, the resume checkpoint held the best state
    of step 2: step 6 (2 > 1) overwrote it."""
    import json

    import pytest
    import torch

    roles = _reference_callbacks()
    taus = {2: 1.0, 4: 3.0, 6: 2.0}

    def fit(root, *extra, kill=None):
        callbacks = []
        for callback in roles["all"]:
            if callback is roles["resume"]:
                callback = {**callback, "init_args": {**callback["init_args"], "dirpath": str(root / "ckpt")}}
            elif callback is roles["best"]:
                args = {**callback["init_args"], "dirpath": str(root / "best"), "monitor": "scripted/tau"}
                callback = {**callback, "init_args": args}
            callbacks.append(callback)
        callbacks.append({"class_path": "test_resume.ScriptedTau", "init_args": {"taus": taus}})
        if kill:
            callbacks.append({"class_path": "test_resume.KillAt", "init_args": {"step": kill}})
        main(["fit", "--config", "tests/configs/tiny.yaml", "--data.batch_size", "2",
              "--trainer.max_steps", "6", "--trainer.check_val_every_n_epoch", "null",
              "--trainer.val_check_interval", "2", "--trainer.logger", "false",
              "--trainer.default_root_dir", str(root),
              "--trainer.callbacks", json.dumps(callbacks), *extra])  # fmt: skip

    with pytest.raises(RuntimeError, match="killed"):
        fit(tmp_path, kill=5)  # killed after step 5 (a stop would validate there): last.ckpt is step 4
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 4
    fit(tmp_path, "--ckpt_path", str(tmp_path / "ckpt" / "last.ckpt"))
    assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["best.ckpt"]
    best = torch.load(tmp_path / "best" / "best.ckpt", weights_only=False)
    assert best["global_step"] == 4
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 6
    (state,) = [s for key, s in last["callbacks"].items() if "scripted/tau" in key]
    assert float(state["best_model_score"]) == 3.0 and state["best_model_path"].endswith("best.ckpt")
