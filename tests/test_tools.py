"""inspect, diff and lint: each pitfall is flagged on a config that has it; v6 is clean; inspect reads
the number of injected layers from fc's shape even when the config lies."""

import json

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.cli import main
from spec_drafters.export import DrafterFolder, write_folder
from spec_drafters.masks import DFlashBlockMask, context_before_anchor, training_mask
from spec_drafters.tools import diff, inspect_drafter, lint_config

TINY = ["--config", "tests/configs/tiny.yaml"]


class LeakyMask(DFlashBlockMask):
    """SpecForge PR #473's bug: the context rule t <= anchor instead of t < anchor."""

    def training_mask(self, anchors, anchor_valid, seq_len, block_size, layer):
        mask = training_mask(anchors, anchor_valid, seq_len, block_size, layer)
        q_anchor = anchors.repeat_interleave(block_size, dim=1)  # (b, Q)
        own = ~context_before_anchor(q_anchor[:, :, None] + 1, torch.arange(seq_len)[None, None])
        mask[:, 0, :, :seq_len] |= ~own & (torch.arange(seq_len) == q_anchor[:, :, None])
        return mask


def codes(*overrides: str) -> set[str]:
    return {f.code for f in lint_config([*TINY, *overrides])}


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        (["--model.noise", "test_noise.InPlaceNoise"], "noise-reaches-labels"),
        (["--model.injection", "AllButLast", "--model.injection.init_args.num_taps", "3"],
         "tap-kept-out-of-fc"),
        (["--model.target_source", "LayerLogits", "--model.target_source.init_args.layer_id", "3"],
         "labels-not-model-output"),
        (["--model.loss.init_args.gamma", "40"], "gamma-unusual"),
        (["--model.loss.init_args.gamma", "null"], "gamma-off"),
        (["--model.target.init_args.mask_token_id", "300"], "mask-token-outside-vocab"),
        (["--model.target.init_args.mask_token_id", "32"], "mask-token-in-text"),  # the space byte
        (["--model.injection", "ExplicitTaps", "--model.injection.init_args.layer_ids", "[2, 3, 4]"],
         "tap-ids-plus-one"),
        (["--model.injection", "ExplicitTaps", "--model.injection.init_args.layer_ids", "[1, 2, 6]"],
         "config-invalid"),
        (["--model.mask", "test_tools.LeakyMask"], "non-strict-context-mask"),
        (["--model.mask", "CausalBlockMask"], "causal-block-on-full"),
    ],
)  # fmt: skip
def test_each_pitfall_is_flagged(overrides, code):
    assert code in codes(*overrides)


def test_the_tiny_config_and_the_seeds_v6_are_clean():
    assert codes() == set()
    assert lint_config(["--config", "configs/dflash_v6.yaml"]) == []


def test_lint_exits_non_zero_on_errors(capsys):
    main(["lint", *TINY])
    with pytest.raises(SystemExit) as e:
        main(["lint", *TINY, "--model.target.init_args.mask_token_id", "300"])
    assert e.value.code == 1 and "mask-token-outside-vocab" in capsys.readouterr().out


def test_inspect_reads_the_injected_layers_from_fc_even_when_the_config_lies(tmp_path):
    target = tiny_target()
    drafter = tiny_drafter(target, num_fc_inputs=3)
    folder = DrafterFolder(drafter.config, [1, 2, 3], 6, 259, drafter.state_dict(), {}, "memory", {})
    write_folder(folder, tmp_path, "zlab")
    config = json.loads((tmp_path / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [1, 3]  # the config says 2 layers
    (tmp_path / "config.json").write_text(json.dumps(config))
    report = inspect_drafter(tmp_path)
    assert report["from_weights"]["injected_layers"] == 3 and report["from_weights"]["fc_in_features"] == 96
    assert report["from_weights"]["drafter_layers"] == 2 and report["from_weights"]["num_kv_heads"] == 2
    assert any("takes 3" in w for w in report["warnings"])
    (tmp_path / "config.json").unlink()  # no config at all: the shapes still answer
    assert inspect_drafter(tmp_path)["from_weights"]["injected_layers"] == 3


def test_diff_names_every_choice_that_differs():
    rows = {k: (a, b) for k, a, b in diff("configs/dflash_v5.yaml", "configs/dflash_v6.yaml")}
    assert rows["fc_layer_ids"] == ([1, 16, 31, 46], [1, 16, 31, 46, 61])
    assert rows["component.target_source"] == ("layer_logits", "model_output")
    assert rows["config.target_source.layer_id"] == (61, "-")
    assert rows["config.loss.gamma"] == (7.0, 4.0)
    assert "drafter.block_size" not in rows  # equal choices are not listed
