"""Checkpoints and drafter folders written by an earlier main (tests/fixtures/main_b8dab2d, made
before the package was split into layers) still load, validate to the same numbers and export to
the same tensors."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spec_drafters.cli.main import main

FIX = Path("tests/fixtures/main_b8dab2d")
TINY = "tests/configs/tiny.yaml"
RUNS = [("tiny.ckpt", "validate.json", []), ("tiny_vocab64.ckpt", "validate_vocab64.json", [])]


@pytest.mark.parametrize(("ckpt", "expected", "extra"), RUNS)
def test_old_checkpoint_validates_to_the_recorded_numbers(tmp_path, ckpt, expected, extra):
    out = tmp_path / "now.json"
    root = ["--trainer.default_root_dir", str(tmp_path)]  # its config and calibration files go there
    main(["validate", "--config", TINY, *root, "--ckpt_path", str(FIX / ckpt), "--results", str(out), *extra])
    then = json.loads((FIX / expected).read_text())["metrics"]
    now = json.loads(out.read_text())["metrics"]
    assert set(then) <= set(now)
    for key, value in then.items():
        assert now[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize(
    ("ckpt", "folder", "layout"),
    [
        ("tiny.ckpt", "folder", "spec_drafters"),
        ("tiny.ckpt", "folder_speculators", "speculators"),
        ("tiny_vocab64.ckpt", "folder_vocab64_speculators", "speculators"),
    ],
)
def test_old_checkpoint_exports_to_the_old_folder(tmp_path, ckpt, folder, layout):
    main(["export", str(FIX / ckpt), "--out", str(tmp_path / "f"), "--layout", layout])
    then = load_file(FIX / folder / "model.safetensors")
    now = load_file(tmp_path / "f" / "model.safetensors")
    assert then.keys() == now.keys()
    for key in then:
        assert torch.equal(then[key], now[key]), key
    now_config = json.loads((tmp_path / "f" / "config.json").read_text())
    then_config = json.loads((FIX / folder / "config.json").read_text())
    # The changes since the fixtures were written, each named (issue 33; docs/serving.md):
    # dflash_config.block_size, equal to the top-level block_size they already hold;
    added = now_config.get("dflash_config", {}).pop("block_size", None)
    assert added in (None, now_config.get("block_size"))
    if layout == "speculators":
        # the speculators_config block vLLM recognises the format by (no --verifier: the recorded
        # target, no architectures) and sample_from_anchor, both absent before;
        block = now_config.pop("speculators_config")
        assert block["verifier"] == {"name_or_path": "tiny-qwen3-6x32-s0", "architectures": []}
        assert block["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 3}]
        assert now_config.pop("sample_from_anchor") is False
        # sliding_window_non_causal true for these all-full drafters (false made vLLM run every layer
        # causal, vllm#56692); the same drafter for speculators, whose flag concerns sliding layers only.
        assert then_config.pop("sliding_window_non_causal") is False
        assert now_config.pop("sliding_window_non_causal") is True
        assert "sliding_attention" not in now_config["transformer_layer_config"]["layer_types"]
    assert then_config == now_config


@pytest.mark.parametrize("folder", ["folder", "folder_speculators", "folder_vocab64_speculators"])
def test_old_folder_starts_a_drafter(tmp_path, folder):
    """init_from reads the old folder; a 0-step validate gives the checkpoint's numbers."""
    ckpt = "tiny_vocab64.ckpt" if "vocab64" in folder else "tiny.ckpt"
    expected = "validate_vocab64.json" if "vocab64" in folder else "validate.json"
    extra = []
    if "vocab64" in folder:
        counts = str(FIX / "counts.json")
        extra = ["--model.draft_vocab", "FrequentTokens", "--model.draft_vocab.counts", counts]
        extra += ["--model.draft_vocab.size", "64"]
    out = tmp_path / "now.json"
    root = ["--trainer.default_root_dir", str(tmp_path)]
    main(
        [
            "validate",
            "--config",
            TINY,
            *root,
            "--model.init_from",
            str(FIX / folder),
            *extra,
            "--results",
            str(out),
        ]
    )
    then = json.loads((FIX / expected).read_text())["metrics"]
    now = json.loads(out.read_text())["metrics"]
    for key in ("val/loss", "val/tau", "val/acc"):
        assert now[key] == pytest.approx(then[key], rel=1e-5, abs=1e-6), (ckpt, key)


def test_class_paths_of_moved_modules_and_classes_still_resolve():
    """A checkpoint names its components by class path: the flat package's (before b8dab2d) and the
    acceptance losses' old module (before they left train/losses.py) are read as today's."""
    from spec_drafters.artefacts.checkpoints import upgrade_class_paths
    from spec_drafters.cli.checks import resolve_class
    from spec_drafters.train.acceptance_losses import CAP, TreeCoverage

    old = {
        "injection": {"class_path": "spec_drafters.injection.ZLabTaps"},  # num_taps defaulted to 5
        "taps": {
            "class_path": "spec_drafters.target.injection.ExplicitTaps",
            "init_args": {"layer_ids": [1, 2]},
        },
        "more": {"class_path": "spec_drafters.target.injection.ZLabTaps", "init_args": {"num_taps": 3}},
        "loss": {"class_path": "spec_drafters.train.losses.CAP", "init_args": {"main": {"class_path": "x"}}},
        "eval": [{"class_path": "spec_drafters.train.losses.TreeCoverage"}],
        "other": "spec_drafters.train.losses.HardCE",
    }
    new = upgrade_class_paths(old)
    assert resolve_class(new["loss"]["class_path"]) is CAP
    assert resolve_class(new["eval"][0]["class_path"]) is TreeCoverage
    all_taps = "spec_drafters.target.injection.AllTaps"  # the first release's aliases merged into it
    assert new["injection"] == {"class_path": all_taps, "init_args": {"layer_ids": None, "num_taps": 5}}
    assert new["taps"] == {"class_path": all_taps, "init_args": {"layer_ids": [1, 2], "num_taps": None}}
    assert new["more"]["init_args"] == {"layer_ids": None, "num_taps": 3}
    assert new["other"] == "spec_drafters.train.losses.HardCE"  # not moved: unchanged
