"""Exports an engine loads as-is (issue 33): the speculators layout's ``speculators_config`` block, the
draft vocabulary's head rows from the verifier folder, the causal flag vLLM reads, and the folder read
by vLLM's own config code where vLLM's environment exists (docs/serving.md)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_drafter, tiny_target
from spec_drafters.artefacts.folders import DrafterFolder, read_folder, write_folder
from spec_drafters.artefacts.verifier import read_verifier
from spec_drafters.cli.main import main
from spec_drafters.cli.serve_eval import parse_counters, run_probe, serve_eval, vllm_python
from spec_drafters.errors import InputError
from spec_drafters.model.masks import SlidingWindowMask
from spec_drafters.target.loaders import TinyRandom

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "registry" / "drafters" / "smollm2-reference"


def vocab_folder(drafter, ids: torch.Tensor) -> DrafterFolder:
    """A tiny drafter drafting over ``ids`` of the tiny target's 259 tokens."""
    drafter.config.draft_vocab_size = len(ids)
    state = {**drafter.state_dict(), "draft_ids": ids}
    return DrafterFolder(drafter.config, [1, 2, 3], 6, 259, state, {}, "memory", {"target": {"name": "tiny"}})


@pytest.fixture
def target_folder(tmp_path):
    """The tiny target saved as a model folder (untied head), as a verifier is given to export."""
    loaded = TinyRandom(num_layers=6).load()
    loaded.model.save_pretrained(tmp_path / "target")
    return tmp_path / "target", loaded.model


def test_speculators_export_names_the_verifier_and_holds_its_head_rows(tmp_path, target_folder):
    folder_path, model = target_folder
    drafter = tiny_drafter(tiny_target())
    ids = torch.tensor([3, 7, 8, 40, 120, 258])
    verifier = read_verifier(folder_path, name="org/tiny-target")
    write_folder(vocab_folder(drafter, ids), tmp_path / "s", "speculators", verifier)
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    block = config["speculators_config"]
    assert block["algorithm"] == "dflash" and block["default_proposal_method"] == "greedy"
    assert block["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 3}]  # block 4
    assert block["verifier"] == {"name_or_path": "org/tiny-target", "architectures": ["Qwen3ForCausalLM"]}
    assert config["sample_from_anchor"] is False
    weights = load_file(tmp_path / "s" / "model.safetensors")
    head = model.get_output_embeddings().weight.detach()
    assert torch.equal(weights["lm_head.weight"], head[ids])  # row i: draft id i's target token
    assert torch.equal(weights["d2t"] + torch.arange(len(ids)), ids)
    back = read_folder(tmp_path / "s", num_target_layers=6)  # the head is the target's: not read back
    assert "lm_head.weight" not in back.state and torch.equal(back.state["draft_ids"], ids)


def test_a_verifier_of_another_shape_is_refused(tmp_path, target_folder):
    folder_path, _ = target_folder
    drafter = tiny_drafter(tiny_target())
    folder = vocab_folder(drafter, torch.tensor([1, 2]))
    folder.num_target_layers = 8
    wrong = r"not this drafter's target: num_hidden_layers 6 \(the drafter's 8\)"
    with pytest.raises(InputError, match=wrong):
        write_folder(folder, tmp_path / "s", "speculators", read_verifier(folder_path))
    with pytest.raises(InputError, match="not a model folder"):
        read_verifier(tmp_path / "nowhere")


def test_the_causal_flag_is_written_as_vllm_reads_it(tmp_path):
    """vLLM (0.32) reads sliding_window_non_causal=false as causal for every layer (vllm#56692), so a
    drafter without causal layers writes true; one with causal sliding layers writes false."""
    target = tiny_target()
    plain = tiny_drafter(target)
    causal = tiny_drafter(target, mask=SlidingWindowMask(window=6, layers=[0], causal_block=True))
    flags = {}
    for name, drafter in (("plain", plain), ("causal", causal)):
        folder = DrafterFolder(drafter.config, [1, 2, 3], 6, 259, drafter.state_dict(), {}, "memory", {})
        write_folder(folder, tmp_path / name, "speculators")
        flags[name] = json.loads((tmp_path / name / "config.json").read_text())["sliding_window_non_causal"]
        back = read_folder(tmp_path / name, 6)
        assert back.config.causal_block_layers == drafter.config.causal_block_layers
    assert flags == {"plain": True, "causal": False}


@pytest.mark.slow
def test_the_shipped_drafter_exports_with_the_embedded_targets_head(tmp_path):
    """No --verifier: a drafter trained on the embedded target gets its folder and tied head rows."""
    main(["export", str(SHIPPED), "--out", str(tmp_path / "s"), "--layout", "speculators"])
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    verifier = config["speculators_config"]["verifier"]
    assert verifier["architectures"] == ["LlamaForCausalLM"] and Path(verifier["name_or_path"]).is_dir()
    weights = load_file(tmp_path / "s" / "model.safetensors")
    embed = load_file(Path(verifier["name_or_path"]) / "model.safetensors")["model.embed_tokens.weight"]
    ids = weights["d2t"] + torch.arange(len(weights["d2t"]))
    assert weights["lm_head.weight"].dtype == weights["fc.weight"].dtype == torch.bfloat16
    assert torch.equal(weights["lm_head.weight"], embed[ids].to(torch.bfloat16))


@pytest.mark.slow
def test_vllms_own_config_code_reads_the_export_as_trained(tmp_path):
    """The export read by vLLM's config code, in vLLM's environment (make vllm), as a server would."""
    python = vllm_python()
    if python is None:
        pytest.skip(
            "vLLM's environment not found (make vllm builds .vllm-venv; or set SPEC_DRAFTERS_VLLM_PYTHON): "
            "the export is not checked against vLLM's config parser in this run"
        )
    main(["export", str(SHIPPED), "--out", str(tmp_path / "s"), "--layout", "speculators"])
    seen = run_probe(python, tmp_path / "s", tmp_path)  # vLLM's refusal would raise, with its stderr
    folder = read_folder(SHIPPED)
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    assert seen["verifier"] == config["speculators_config"]["verifier"]["name_or_path"]
    assert seen["speculative_config"]["method"] == "dflash"
    assert seen["speculative_config"]["num_speculative_tokens"] == folder.config.block_size - 1
    assert seen["architectures"] == ["DFlashDraftModel"]
    assert seen["draft_vocab_size"] == folder.config.draft_vocab_size == 8192
    assert seen["vocab_size"] == folder.vocab_size and seen["hidden_size"] == folder.config.hidden_size
    assert seen["dflash_config"]["target_layer_ids"] == folder.fc_ids
    assert seen["dflash_config"]["mask_token_id"] == folder.config.mask_token_id
    assert seen["dflash_config"]["causal"] is False  # trained non-causal in the block: served so


def test_the_engines_counters_are_read_from_prometheus_text():
    """vLLM's /metrics lines (vllm/v1/spec_decode/metrics.py), summed over engines; other lines ignored."""
    PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    text = "\n".join(
        [
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 16.0',
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="target"} 4.0',
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 140.0',
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 14.0',
            f'{PER_POS}{{engine="0",model_name="target",position="0"}} 8.0',
            f'{PER_POS}{{engine="1",model_name="target",position="0"}} 2.0',
            f'{PER_POS}{{engine="0",model_name="target",position="1"}} 4.0',
            'vllm:num_requests_running{engine="0",model_name="target"} 0.0',
        ]
    )
    seen = parse_counters(text)
    assert seen == {
        "num_drafts": 20.0,
        "num_draft_tokens": 140.0,
        "num_accepted_tokens": 14.0,
        "accepted_at_0": 10.0,
        "accepted_at_1": 4.0,
    }


def test_serve_eval_without_vllm_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_DRAFTERS_VLLM_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(InputError, match="make vllm"):
        serve_eval(["--humaneval", "2", "--out", str(tmp_path / "o"), "--config", "configs/quickstart.yaml"])
