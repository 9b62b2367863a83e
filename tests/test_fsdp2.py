"""FSDP2 (Lightning's ModelParallelStrategy, fully_shard per drafter layer) on 2 CPU processes over gloo
trains step for step like one process on the same global batch: same losses, same weights."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # two gloo processes per test (the slow tier: make test-all, CI)

CLI = str(Path(sys.executable).parent / "spec-drafters")


def _fit(root: Path, *extra: str) -> str:
    cmd = [CLI, "fit", "--config", "tests/configs/tiny.yaml", "--trainer.max_steps", "5",
           "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(root),
           "--trainer.callbacks.dirpath", str(root / "ckpt"), *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _losses(root: Path) -> list[float]:
    (metrics,) = root.rglob("metrics.csv")
    return [float(r["train/loss"]) for r in csv.DictReader(metrics.open()) if r.get("train/loss")]


def test_two_sharded_cpu_processes_match_one_process(tmp_path):
    _fit(tmp_path / "one", "--data.batch_size", "4")
    _fit(tmp_path / "two", "--config", "configs/presets/fsdp2_cpu.yaml", "--data.batch_size", "2")
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(one) == len(two) == 5
    for step, (a, b) in enumerate(zip(one, two, strict=True)):
        assert abs(a - b) < 1e-5 * abs(a), (step, a, b)
    assert one[0] != one[-1]  # it trained
    # The sharded run's checkpoint is one consolidated file with the same drafter weights.
    w1 = torch.load(tmp_path / "one" / "ckpt" / "last.ckpt", weights_only=True)["state_dict"]
    w2 = torch.load(tmp_path / "two" / "ckpt" / "last.ckpt", weights_only=True)["state_dict"]
    assert sorted(w1) == sorted(w2) and any(k.startswith("drafter.layers.0.") for k in w1)
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=1e-4, atol=1e-5)
    # The memory options change nothing either: target sharded too, layers recomputed, loss in chunks.
    _fit(tmp_path / "lean", "--config", "configs/presets/fsdp2_cpu.yaml", "--data.batch_size", "2",
         "--model.shard_target", "true", "--model.activation_checkpointing", "true",
         "--model.loss_chunk_rows", "8")  # fmt: skip
    for step, (a, b) in enumerate(zip(one, _losses(tmp_path / "lean"), strict=True)):
        assert abs(a - b) < 1e-5 * abs(a), (step, a, b)


def test_validate_under_fsdp2_loads_the_checkpoint_and_reports(tmp_path):
    _fit(tmp_path / "one", "--data.batch_size", "4")
    out = tmp_path / "val.json"
    cmd = [CLI, "validate", "--config", "tests/configs/tiny.yaml",
           "--config", "configs/presets/fsdp2_cpu.yaml", "--data.val_batch_size", "2",
           "--trainer.logger", "false",
           "--trainer.default_root_dir", str(tmp_path), "--results", str(out),
           "--ckpt_path", str(tmp_path / "one" / "ckpt" / "last.ckpt")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["val/tau"] >= 1.0 and 0 < metrics["val/loss"] < 20


def test_the_target_loaded_once_reaches_every_rank(tmp_path):
    """load_target_once: rank 1 builds the target on the meta device and receives it from rank 0
    after sharding (whole where replicated, its shards with shard_target): the same losses as one
    process on the same global batch."""
    _fit(tmp_path / "one", "--data.batch_size", "4")
    one = _losses(tmp_path / "one")
    for shard in ("false", "true"):
        out = _fit(tmp_path / shard, "--config", "configs/presets/fsdp2_cpu.yaml", "--data.batch_size", "2",
                   "--model.load_target_once", "true", "--model.shard_target", shard)  # fmt: skip
        assert "received from rank 0 (built on meta here)" in out, out[-2000:]
        assert "rank 1: the target's" in out and "rank 0: the target's" not in out
        for step, (a, b) in enumerate(zip(one, _losses(tmp_path / shard), strict=True)):
            assert abs(a - b) < 1e-5 * abs(a), (shard, step, a, b)
