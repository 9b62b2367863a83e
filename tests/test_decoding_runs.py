"""A decoding-run folder (spec_drafters/studies/decoding_runs.py, run by benchmarks/humaneval_decoding.py)
keeps its pieces under one name only for one drafter and one set of settings: pieces of two drafters must
never be merged into one table."""

import argparse
from pathlib import Path

import pytest

from spec_drafters.studies import decoding_runs as bench


def args(folder: Path, **kw) -> argparse.Namespace:
    base = {
        "config": ["configs/reference_smollm2.yaml"],
        "extra": ["--model.init_from", str(folder)],
        "ckpt_path": None,
        "init_from": None,
        "num_prompts": 164,
        "parts": 8,
        "cost_model": None,
        "chain_depth": None,
        "lookup": False,
        "budgets": None,
    }
    return argparse.Namespace(**(base | kw))


def test_pieces_of_another_drafter_or_setting_are_refused(tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "model.safetensors").write_bytes(b"weights one")
    out = tmp_path / "pieces"
    out.mkdir()
    bench.open_folder(args(drafter), out)
    first = (out / "identity.json").read_text()
    bench.open_folder(args(drafter), out)  # the same drafter and settings continue
    assert (out / "identity.json").read_text() == first
    with pytest.raises(SystemExit, match="differs in num_prompts"):
        bench.open_folder(args(drafter, num_prompts=4), out)
    (drafter / "model.safetensors").write_bytes(b"weights two")  # retrained in place
    with pytest.raises(SystemExit, match="differs in sha256"):
        bench.open_folder(args(drafter), out)


def test_an_edited_overlay_is_another_setting_but_older_folders_continue(tmp_path):
    import json

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  eval_verifiers: []\n")
    out = tmp_path / "pieces"
    out.mkdir()
    setting = args(tmp_path, config=[str(overlay)], extra=[])
    bench.open_folder(setting, out)
    overlay.write_text("model:\n  eval_verifiers: [ddtree]\n")  # edited between sessions
    with pytest.raises(SystemExit, match="differs in config_content"):
        bench.open_folder(setting, out)
    overlay.write_text(  # the decoding callbacks are the benchmark's own: not part of the identity
        "model:\n  eval_verifiers: []\ntrainer:\n  callbacks: [{class_path: SpeculativeDecodingEval}]\n"
    )
    bench.open_folder(setting, out)
    overlay.write_text("model:\n  eval_verifiers: [ddtree]\n")
    older = json.loads((out / "identity.json").read_text())
    del older["config_content"]  # a folder written before the contents were hashed
    (out / "identity.json").write_text(json.dumps(older))
    bench.open_folder(setting, out)


def test_every_decoder_of_the_overlay_has_a_row_in_the_table(tmp_path):
    """The summary table names decoders by label: a verifier the overlay adds but the table does not
    know would be dropped from it silently."""
    import yaml

    from spec_drafters.decode import verifiers

    def make(v: dict):
        args = dict(v.get("init_args") or {})
        if "verifier" in args:
            args["verifier"] = make(args["verifier"])
        return getattr(verifiers, v["class_path"])(**args)

    cost = tmp_path / "cost.json"
    cost.write_text('{"tokens": [1, 2], "verify": [1.0, 1.5], "draft": 0.1}')
    path = bench.overlay(tmp_path, str(cost), [2], lookup=True, budgets=[8, 32])
    callback = yaml.safe_load(path.read_text())["trainer"]["callbacks"][0]["init_args"]
    labels = ["_" + make(v).label() for v in callback["verifiers"]]
    assert labels == [
        "_ddtree_b8",
        "_ddtree_b32",
        "_adaptive_ddtree_b64",
        "_greedy_chain_d2",
        "_lookup_hybrid_greedy_chain",
        "_lookup_hybrid_ddtree_b8",
        "_lookup_hybrid_adaptive_ddtree_b64",
    ]
    assert all(label in bench.DECODERS for label in labels if "_d2" not in label)  # depths: own rows
    with pytest.raises(SystemExit, match="budgets are"):
        bench.overlay(tmp_path, None, budgets=[12])


def test_the_drafter_is_found_where_validate_would_take_it(tmp_path):
    config = tmp_path / "overlay.yaml"
    config.write_text("model:\n  init_from: registry/drafters/x\n")
    found = bench.drafter_identity(args(tmp_path, config=[str(config)], extra=[]))
    assert found["weights"] == "registry/drafters/x/model.safetensors" and found["sha256"] is None
    later = bench.drafter_identity(args(tmp_path, config=[str(config)], extra=["--model.init_from=a/b"]))
    assert later["weights"] == "a/b/model.safetensors"  # the command line beats the config
