"""inspect, diff and lint: each pitfall is flagged on a config that has it; v6 is clean; inspect reads
the number of injected layers from fc's shape even when the config lies."""

import json

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.artefacts.folders import DrafterFolder, write_folder
from spec_drafters.artefacts.inspect import inspect_drafter
from spec_drafters.cli.main import main
from spec_drafters.cli.tools import diff, lint_config
from spec_drafters.model.masks import DFlashBlockMask, context_before_anchor, training_mask

TINY = ["--config", "tests/configs/tiny.yaml"]

IDS = ["--model.injection.init_args.num_taps", "null", "--model.injection.init_args.layer_ids"]


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
        ([*IDS, "[2, 3, 4]"], "tap-ids-plus-one"),
        ([*IDS, "[1, 2, 6]"], "config-invalid"),
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


# --- lint --strict, allow markers, codes (issue 12) ------------------------------------------------------
def overlay(tmp_path, text: str) -> list[str]:
    path = tmp_path / "ablation.yaml"
    path.write_text(text)
    return [*TINY, "--config", str(path)]


FOUR_OF_FIVE = "model:\n  injection:\n    class_path: AllButLast{marker}\n    init_args: {{num_taps: 3}}\n"


def test_strict_fails_on_warnings_unless_the_config_allows_them(tmp_path, capsys):
    unmarked = overlay(tmp_path, FOUR_OF_FIVE.format(marker=""))
    main(["lint", *unmarked])  # a warning alone: exit code 0
    with pytest.raises(SystemExit) as e:
        main(["lint", "--strict", *unmarked])
    assert e.value.code == 1
    marked = overlay(
        tmp_path, FOUR_OF_FIVE.format(marker="  # lint: allow tap-kept-out-of-fc (the ablation)")
    )
    capsys.readouterr()
    main(["lint", "--strict", *marked])  # allowed: exit code 0, and still listed
    out = capsys.readouterr()
    assert out.out.startswith("allowed tap-kept-out-of-fc") and "ablation.yaml:3" in out.out
    assert "0 error(s), 0 warning(s), 1 allowed" in out.err


@pytest.mark.parametrize(
    ("marker", "problem"),
    [("# lint: allow tap-kept-out-of-fcc", "unknown lint code 'tap-kept-out-of-fcc'"),
     ("# lint: allow gamma-off, noise-reaches-labels", "noise-reaches-labels is an error")],
)  # fmt: skip
def test_allow_markers_name_known_warnings_only(tmp_path, marker, problem):
    findings = lint_config(overlay(tmp_path, f"{marker}\n" + FOUR_OF_FIVE.format(marker="")))
    bad = [f for f in findings if f.code == "lint-allow-invalid"]
    assert len(bad) == 1 and bad[0].severity == "error" and problem in bad[0].message
    assert "ablation.yaml:1" in bad[0].message
    assert {f.code: f.severity for f in findings}["tap-kept-out-of-fc"] == "warning"  # not allowed


def test_strict_lint_fails_the_seeds_v5_and_passes_v6(capsys):
    main(["lint", "--strict", "--config", "configs/dflash_v6.yaml"])  # no SystemExit: exit code 0
    with pytest.raises(SystemExit) as e:
        main(["lint", "--strict", "--config", "configs/dflash_v5.yaml"])
    out = capsys.readouterr().out
    assert e.value.code == 1 and "tap-kept-out-of-fc" in out and "labels-not-model-output" in out


@pytest.mark.parametrize(("gamma", "flagged"), [(0.5, True), (1.0, False), (4.0, False), (4.5, True)])
def test_the_gamma_rule_and_its_message_state_the_same_range(gamma, flagged):
    findings = lint_config([*TINY, "--model.loss.init_args.gamma", str(gamma)])
    assert [f.code for f in findings] == (["gamma-unusual"] if flagged else [])
    if flagged:  # K = 4 in the tiny config
        assert "outside K/4..K (1..4)" in findings[0].message


def test_a_mask_token_outside_the_vocabulary_has_its_own_code_from_the_card_check_too(tmp_path):
    from transformers import Qwen3Config

    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4)
    Qwen3Config(vocab_size=259, num_key_value_heads=2, head_dim=8, **shape).save_pretrained(tmp_path)
    target = [
        "--model.target", "HFPretrained", "--model.target.init_args.path", str(tmp_path),
        "--model.target.init_args.meta", "true", "--model.target.init_args.mask_token_id", "999",
    ]  # fmt: skip
    (finding,) = lint_config([*TINY, *target])
    assert finding.code == "mask-token-outside-vocab" and "999" in finding.message


@pytest.mark.parametrize("layout", ["zlab", "speculators"])
def test_inspect_warns_when_the_config_head_counts_disagree_with_the_weights(tmp_path, layout):
    target = tiny_target()  # 4 heads, 2 KV heads, head_dim 8
    drafter = tiny_drafter(target, num_fc_inputs=3)
    folder = DrafterFolder(drafter.config, [1, 2, 3], 6, 259, drafter.state_dict(), {}, "memory", {})
    write_folder(folder, tmp_path, layout)
    assert inspect_drafter(tmp_path)["warnings"] == []
    config = json.loads((tmp_path / "config.json").read_text())
    fields = config["transformer_layer_config"] if layout == "speculators" else config
    fields["num_attention_heads"], fields["num_key_value_heads"] = 8, 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    warnings = inspect_drafter(tmp_path)["warnings"]
    assert any("num_attention_heads 8" in w and "q_proj.weight holds 4" in w for w in warnings), warnings
    assert any("num_key_value_heads 1" in w and "k_proj.weight holds 2" in w for w in warnings), warnings
