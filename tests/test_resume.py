"""A run interrupted mid-epoch and resumed from its last checkpoint continues exactly: the same losses,
step for step, as the uninterrupted run (optimizer, scheduler, data order and position, anchor RNG)."""

import csv

import lightning.pytorch as pl

from spec_drafters.cli import main


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
    out = {}
    for metrics in root.rglob("metrics.csv"):
        for row in csv.DictReader(metrics.open()):
            if row.get("train/loss"):
                out[int(row["step"])] = float(row["train/loss"])
    return out


def test_resumed_run_matches_the_uninterrupted_one(tmp_path):
    _fit(tmp_path / "full")
    _fit(tmp_path / "cut", "--trainer.callbacks+=test_resume.StopAt", "--trainer.callbacks.step", "4")
    cut = _losses(tmp_path / "cut")
    assert max(cut) == 3  # stopped after 4 steps of a 10-batch epoch: mid-epoch
    _fit(tmp_path / "cut", "--ckpt_path", str(tmp_path / "cut" / "ckpt" / "last.ckpt"))
    full, resumed = _losses(tmp_path / "full"), _losses(tmp_path / "cut")
    assert sorted(full) == sorted(resumed) == list(range(14))  # crosses into the second epoch
    for step in range(14):
        assert resumed[step] == full[step], (step, resumed[step], full[step])
