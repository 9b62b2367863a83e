"""Tracking: Aim by default with its repository in the run folder, holding hyperparameters, losses,
per-slot accuracy, tau and the acceptance figure; CSV and TensorBoard selectable instead."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spec_drafters.cli.main import main

VAL_AT_END = ["--trainer.max_steps", "6", "--trainer.check_val_every_n_epoch", "null",
              "--trainer.val_check_interval", "6"]  # fmt: skip


def _config_without_logger(tmp_path) -> str:
    cfg = yaml.safe_load(Path("tests/configs/tiny.yaml").read_text())
    del cfg["trainer"]["logger"]  # what a user's config without a logger gets
    path = tmp_path / "tiny_default_logger.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_aim_is_the_default_and_records_what_validation_measures(tmp_path):
    from aim import Repo
    from aim.storage.context import Context

    run_dir = tmp_path / "run"
    main(["fit", "--config", _config_without_logger(tmp_path), "--trainer.default_root_dir", str(run_dir),
          "--trainer.callbacks.dirpath", str(run_dir / "ckpt"), *VAL_AT_END])  # fmt: skip
    assert (run_dir / ".aim").is_dir()  # the repository sits in the run folder
    # Aim indexes runs when its UI starts (`aim up`); the public CLI does the same for a script.
    aim = str(Path(sys.executable).parent / "aim")
    subprocess.run(
        [aim, "storage", "--repo", str(run_dir), "reindex", "--yes"], check=True, capture_output=True
    )
    (run,) = list(Repo(str(run_dir)).iter_runs())
    names = {seq.name for seq in run.metrics()}
    want = {
        "train/loss",
        "train/acc",
        "val/loss",
        "val/tau",
        "val/acc",
        "val/accept_ge1",
        "val/calibration_ece",
    }
    assert want | {f"val/acc_slot{k}" for k in (1, 2, 3)} <= names, names
    assert run["hparams"]["lr"] == 0.003 and run["hparams"]["drafter"]["block_size"] == 4
    figure = run.get_image_sequence("acceptance_curve", Context({"subset": "val"}))
    assert figure is not None and list(figure.values.values_list())  # one image per validation


@pytest.mark.parametrize("logger", ["CSVLogger", "TensorBoardLogger"])
def test_csv_or_tensorboard_instead(tmp_path, logger):
    main(["fit", "--config", "tests/configs/tiny.yaml", "--trainer.logger", logger,
          "--trainer.logger.save_dir", str(tmp_path), "--trainer.callbacks.dirpath", str(tmp_path / "ckpt"),
          "--trainer.callbacks+=TrainingThroughput", *VAL_AT_END])  # fmt: skip
    if logger == "CSVLogger":
        assert list(tmp_path.rglob("acceptance_curve_step6.png"))
        rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
        assert any(r.get("val/tau") for r in rows)
        speeds = [float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s")]
        assert speeds and all(s > 0 for s in speeds)  # TrainingThroughput
        # Lightning's ThroughputMonitor counts; the run's rate is its totals' ratio at the last step.
        last = [r for r in rows if r.get("train/lengths")][-1]
        rate = float(last["train/lengths"]) / float(last["train/time"])
        assert speeds[-1] == pytest.approx(rate, rel=1e-4)
    else:
        assert list(tmp_path.rglob("events.out.tfevents.*"))
    assert not (tmp_path / ".aim").exists()


def test_throughput_is_lightnings_monitor_counting_real_tokens():
    from lightning.pytorch.callbacks import ThroughputMonitor

    from spec_drafters.data.records import Example, collate
    from spec_drafters.lightning.callbacks import TrainingThroughput, count_sequences, count_tokens

    lengths = [5, 2, 7]
    batch = collate([Example(list(range(n)), [1] * n) for n in lengths])
    assert batch["input_ids"].shape == (3, 7)  # padded to the longest
    assert count_sequences(batch) == 3 and count_tokens(batch) == 14  # padding is not a token
    monitor = TrainingThroughput()
    assert isinstance(monitor, ThroughputMonitor) and monitor.length_fn is count_tokens


@pytest.mark.slow  # a fresh interpreter per logger
def test_aim_is_imported_only_when_its_logger_is_built():
    modules = "spec_drafters.lightning.tracking, spec_drafters.cli.main, spec_drafters.cli.lightning_cli"
    code = f"import {modules}, sys; assert 'aim' not in sys.modules, 'aim imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    built = "from spec_drafters.lightning.tracking import RunAimLogger; import sys; RunAimLogger(); "
    subprocess.run([sys.executable, "-c", built + "assert 'aim' in sys.modules"], check=True)


SEEN: dict = {}


def _spy_class():
    from torch.utils.flop_counter import FlopCounterMode

    from spec_drafters.lightning.callbacks import TrainingThroughput

    class FlopSpy(TrainingThroughput):
        """TrainingThroughput, also counting a direct forward of the target over the first batch."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0:
                with FlopCounterMode(display=False) as direct:
                    pl_module.target(batch["input_ids"].to(pl_module.device))
                SEEN["direct"] = direct.get_total_flops()
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

        def on_before_backward(self, trainer, pl_module, loss):
            super().on_before_backward(trainer, pl_module, loss)
            SEEN.setdefault("counted", dict(self.counted))
            SEEN.setdefault("per_batch", pl_module.flops_per_batch)

    return FlopSpy


FlopSpy = _spy_class()


def test_throughput_counts_a_steps_flops_and_the_targets_share(tmp_path):
    """The first batch's forward counted (FlopCounterMode): the frozen target's part is what a direct
    forward of the target over the same batch counts, and flops_per_batch = target + 3 x the rest."""
    SEEN.clear()
    out = tmp_path / "fit.json"
    main(["fit", "--config", "tests/configs/tiny.yaml", "--trainer.max_steps", "2",
          "--trainer.default_root_dir", str(tmp_path), "--trainer.callbacks+=test_tracking.FlopSpy",
          "--results", str(out)])  # fmt: skip
    counted = SEEN["counted"]
    assert counted["target_forward"] == SEEN["direct"] > 0 and counted["trained_forward"] > 0
    assert SEEN["per_batch"] == counted["target_forward"] + 3 * counted["trained_forward"]
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["train/flops_per_batch"] == pytest.approx(SEEN["per_batch"])
    assert metrics["train/flops_per_s"] > 0 and "train/mfu" not in metrics  # no CPU in Lightning's table
