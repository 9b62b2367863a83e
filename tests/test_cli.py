"""The CLI end to end on a tiny target: fit lowers the loss, checkpoints hold the drafter only,
validate reads them back, and component names resolve (or fail with the valid ones)."""

import csv
import json
from pathlib import Path

import pytest
import torch

from spec_drafters.cli.main import main

TINY = "tests/configs/tiny.yaml"


def _fit(tmp_path: Path, *extra: str) -> Path:
    main(
        [
            "fit",
            "--config",
            TINY,
            "--trainer.logger",
            "CSVLogger",
            "--trainer.logger.save_dir",
            str(tmp_path),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--results",
            str(tmp_path / "fit.json"),
            *extra,
        ]
    )
    return tmp_path


def _losses(run: Path) -> list[float]:
    (metrics,) = run.rglob("metrics.csv")
    return [float(r["train/loss"]) for r in csv.DictReader(metrics.open()) if r.get("train/loss")]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("fit"), "--trainer.max_steps", "40")


def test_fit_lowers_the_loss(fitted):
    losses = _losses(fitted)
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, (first, last)


def test_checkpoint_holds_the_drafter_and_its_description_not_the_target(fitted):
    (ckpt,) = fitted.rglob("*.ckpt")
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    keys = state["state_dict"].keys()
    assert keys and all(k.startswith("drafter.") for k in keys)
    assert "drafter.fc.weight" in keys and "drafter.layers.0.self_attn.q_proj.weight" in keys
    desc = state["spec_drafters"]
    assert desc["fc_ids"] == [1, 2, 3] and desc["components"]["injection"] == "all_taps"
    assert desc["components"]["loss"] == "hard_ce" and desc["drafter"]["block_size"] == 4


def test_validate_reads_the_checkpoint_and_beats_the_untrained_drafter(fitted, tmp_path):
    (ckpt,) = fitted.rglob("*.ckpt")
    common = [
        "validate",
        "--config",
        TINY,
        "--trainer.logger",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path),
    ]
    main([*common, "--results", str(tmp_path / "untrained.json")])
    main([*common, "--ckpt_path", str(ckpt), "--results", str(tmp_path / "trained.json")])
    untrained = json.loads((tmp_path / "untrained.json").read_text())["metrics"]
    trained = json.loads((tmp_path / "trained.json").read_text())["metrics"]
    assert trained["val/loss"] < untrained["val/loss"]
    assert trained["val/acc_slot1"] > untrained["val/acc_slot1"]
    assert trained["val/tau"] >= 1.0 and untrained["val/tau"] >= 1.0


def test_validate_reports_the_chain_and_the_configured_tree_verifier(fitted, tmp_path):
    (ckpt,) = fitted.rglob("*.ckpt")
    main(
        ["validate", "--config", TINY, "--ckpt_path", str(ckpt), "--trainer.logger", "false",
         "--trainer.default_root_dir", str(tmp_path), "--results", str(tmp_path / "tree.json"),
         "--model.verifier", "DDTree", "--model.verifier.init_args.budget", "16"]
    )  # fmt: skip
    metrics = json.loads((tmp_path / "tree.json").read_text())["metrics"]
    assert metrics["val/tau"] >= 1.0  # the chain, always
    # one naming rule for the configured verifier and the extra ones: its label (docs/verifiers.md)
    assert 1.0 <= metrics["val/tau_ddtree_b16"] <= 4.0 and "val/tau_pooled_ddtree_b16" in metrics
    assert "val/tau_ddtree" not in metrics


def test_a_checkpoint_without_drafter_weights_is_refused(fitted, tmp_path):
    (ckpt,) = fitted.rglob("*.ckpt")
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    del state["state_dict"]["drafter.fc.weight"]
    broken = tmp_path / "broken.ckpt"
    torch.save(state, broken)
    # one line naming the file and the missing tensor, before the module is built (no KeyError)
    with pytest.raises(SystemExit, match=r"broken\.ckpt.*lacks drafter tensors.*drafter\.fc\.weight"):
        main(
            [
                "validate",
                "--config",
                TINY,
                "--trainer.default_root_dir",
                str(tmp_path),
                "--ckpt_path",
                str(broken),
            ]
        )


def test_unknown_component_name_lists_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", TINY, "--model.injection", "FourLayers"])
    assert "unknown injection 'FourLayers'" in str(e.value)
    assert "all_taps (AllTaps)" in str(e.value) and "all_but_last (AllButLast)" in str(e.value)
    assert "zlab_taps" not in str(e.value)  # the first release's aliases of all_taps are gone


def test_unknown_name_inside_a_yaml_file_is_caught_too(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model:\n  loss:\n    class_path: SoftestKL\n")
    with pytest.raises(SystemExit, match=r"unknown loss 'SoftestKL'.*hard_ce"):
        main(["fit", "--config", TINY, "--config", str(cfg)])


def test_unknown_names_inside_component_lists_are_caught_too(tmp_path):
    """A list of components (eval_verifiers, a loss mix's terms) is checked item by item, with the
    item's place in the flag; jsonargparse alone only says "expected a dot import path"."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model:\n  eval_verifiers:\n    - class_path: GreedyChain\n    - class_path: DDTre\n")
    with pytest.raises(SystemExit, match=r"--model\.eval_verifiers\[1\]: unknown verifier 'DDTre'.*ddtree"):
        main(["fit", "--config", TINY, "--config", str(cfg)])
    cfg.write_text(
        "model:\n  loss:\n    class_path: LossMix\n    init_args:\n      coefficients: [0.1, 0.9]\n"
        "      losses:\n        - class_path: HardCE\n        - class_path: TotalVariance\n"
    )
    with pytest.raises(SystemExit, match=r"loss\.init_args\.losses\[1\]: unknown loss 'TotalVariance'"):
        main(["fit", "--config", TINY, "--config", str(cfg)])


def test_class_path_and_registry_name_both_select_components(tmp_path):
    run = _fit(
        tmp_path,
        "--trainer.max_steps",
        "2",
        "--model.injection.class_path",
        "spec_drafters.target.injection.AllTaps",
        "--model.injection.init_args.num_taps",
        "null",
        "--model.injection.init_args.layer_ids",
        "[0, 4, 5]",
    )
    desc = json.loads((run / "fit.json").read_text())["drafter"]
    assert desc["fc_ids"] == [0, 4, 5] and desc["components"]["injection"] == "all_taps"


def test_registry_lists_every_kind_with_names_paths_and_parameters(capsys):
    main(["registry", "--json"])
    listing = json.loads(capsys.readouterr().out)
    for kind in ("target", "injection", "target_source", "loss", "mask", "attention", "anchors", "verifier"):
        assert listing[kind], kind
    names = {kind: {e["name"]: e for e in items} for kind, items in listing.items()}
    assert names["injection"]["all_taps"]["class_path"] == "spec_drafters.target.injection.AllTaps"
    assert "num_taps: int | None = None" in names["injection"]["all_taps"]["parameters"]
    assert {"eager", "sdpa"} <= names["attention"].keys()
    main(["registry"])
    text = capsys.readouterr().out
    assert "target_source:" in text and "model_output" in text


def test_validate_runs_real_speculative_decoding_on_humaneval_prompts(fitted, tmp_path):
    (ckpt,) = fitted.rglob("*.ckpt")
    main(
        ["validate", "--config", TINY, "--ckpt_path", str(ckpt), "--trainer.precision", "64-true",
         "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path),
         "--trainer.default_root_dir", str(tmp_path), "--results", str(tmp_path / "r.json"),
         "--trainer.callbacks+=SpeculativeDecodingEval", "--trainer.callbacks.max_new_tokens", "16",
         "--trainer.callbacks.prompts", "HumanEvalPrompts", "--trainer.callbacks.prompts.num_prompts", "3",
         "--trainer.callbacks.verifiers", "[{class_path: DDTree, init_args: {budget: 8}}]",
         "--trainer.callbacks.prompt_lookup_tokens", "3"]
    )  # fmt: skip
    metrics = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert metrics["decode/prompts"] == 3
    for suffix in ("", "_ddtree_b8", "_prompt_lookup"):
        assert metrics[f"decode/lossless{suffix}"] == 1.0, suffix
        assert metrics[f"decode/tau{suffix}"] >= 1.0 and metrics[f"decode/speedup{suffix}"] > 0
    (rows,) = tmp_path.rglob("decode.jsonl")
    per_prompt = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(per_prompt) == 3 and all(0 < r["new_tokens"] <= 16 for r in per_prompt)
    assert all(sum(r["accept_lengths"]) + 1 >= r["new_tokens"] for r in per_prompt)
    assert all(r["rounds_prompt_lookup"] >= 1 for r in per_prompt)
    # Without a logger, an absolute output path still gets the rows; part 1 of 2 is prompts 1 and 2.
    main(
        ["validate", "--config", TINY, "--ckpt_path", str(ckpt), "--trainer.precision", "64-true",
         "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path),
         "--results", str(tmp_path / "part.json"), "--trainer.callbacks+=SpeculativeDecodingEval",
         "--trainer.callbacks.max_new_tokens", "16",
         "--trainer.callbacks.prompts", "HumanEvalPrompts", "--trainer.callbacks.prompts.num_prompts", "3",
         "--trainer.callbacks.prompts.part", "1", "--trainer.callbacks.prompts.parts", "2",
         "--trainer.callbacks.output", str(tmp_path / "part.jsonl")]
    )  # fmt: skip
    part = [json.loads(line) for line in (tmp_path / "part.jsonl").read_text().splitlines()]
    assert [r["prompt_tokens"] for r in part] == [r["prompt_tokens"] for r in per_prompt[1:]]
    assert [r["greedy_tokens"] for r in part] == [r["greedy_tokens"] for r in per_prompt[1:]]


def test_generate_decodes_prompts_with_the_chosen_verifier(fitted, tmp_path, capsys):
    (ckpt,) = fitted.rglob("*.ckpt")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"text": "for i in range(3):"}\n')
    out = tmp_path / "gen.jsonl"
    main(
        ["generate", "--config", TINY, "--ckpt_path", str(ckpt), "--prompts", str(prompts),
         "--max_new_tokens", "12", "--out", str(out), "--model.target.init_args.dtype", "float64",
         "--model.verifier", "DDTree", "--model.verifier.init_args.budget", "8"]
    )  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["lossless"] and r["verifier"] == "ddtree" for r in rows)
    assert all(0 < r["new_tokens"] <= 12 and r["tau"] >= 1 for r in rows)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["prompts"] == 2 and summary["lossless"] == 1.0 and summary["verifier"] == "ddtree"


def test_draft_vocab_reports_coverage_only_for_sizes_below_the_vocabulary(tmp_path, capsys):
    # The tiny target has 259 tokens: the default sizes (2048 and up) all reach past it.
    out = tmp_path / "counts.json"
    main(["draft-vocab", "--config", TINY, "--model.draft_vocab", "FullVocab", "--out", str(out),
          "--sizes", "64", "259", "2048"])  # fmt: skip
    assert json.loads(out.read_text())["tokens"] > 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("V_d     64: held-out coverage") for line in lines), lines
    for size in (259, 2048):
        assert f"V_d {size:>6}: skipped, not below the target's vocabulary of 259" in lines, lines
