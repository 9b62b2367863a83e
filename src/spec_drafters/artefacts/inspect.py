"""``inspect``: what a drafter is, read from its weights' shapes first and checked against its config.

The seeds learned that z-lab's reference used 5 target layers from ``fc.weight`` [5120, 25600], not
from its config (docs/method.md section 1): the shapes are the truth, the config a claim about them.

Plain functions over files (a drafter folder of any layout, a Lightning checkpoint) and over an
built :class:`~spec_drafters.artefacts.setup.DrafterSetup`; building one from a config file is the CLI's
job (``spec-drafters inspect``, cli/setup_args.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from spec_drafters.artefacts.checkpoints import read_checkpoint_file
from spec_drafters.artefacts.folders import read_config_json, read_weights
from spec_drafters.artefacts.setup import DrafterSetup
from spec_drafters.errors import InputError

# --- reading a drafter's weights -------------------------------------------------------------------


def setup_weights(setup: DrafterSetup) -> tuple[dict[str, torch.Tensor], dict]:
    """(drafter weights with z-lab keys, its description) of a built setup; aux heads as ``aux.*``."""
    weights = dict(setup.drafter.state_dict())
    weights |= {"aux." + k: v for k, v in setup.loss_fn.state_dict().items()}
    return weights, {"spec_drafters": setup.describe(), "source": "config (built, not trained)"}


def file_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """(drafter weights with z-lab keys, the config or description that came with them) of a drafter
    folder or a Lightning checkpoint."""
    if path.is_dir():
        if not (path / "model.safetensors").is_file():
            raise InputError(f"{path}: no model.safetensors")
        weights = read_weights(path / "model.safetensors")
        if not weights:
            raise InputError(f"{path / 'model.safetensors'}: holds no tensors")
        config = read_config_json(path / "config.json") if (path / "config.json").is_file() else {}
        return weights, config
    if not path.is_file():
        raise InputError(f"{path}: no such file or folder")
    ckpt = read_checkpoint_file(path)  # a Lightning checkpoint holding a drafter, or one line naming it
    sd = ckpt["state_dict"]
    weights = {k[len("drafter.") :]: v for k, v in sd.items() if k.startswith("drafter.")}
    weights |= {"aux." + k[len("loss_fn.") :]: v for k, v in sd.items() if k.startswith("loss_fn.")}
    return weights, {
        "spec_drafters": ckpt.get("spec_drafters", {}),
        "hyper_parameters": ckpt.get("hyper_parameters"),
    }


def from_shapes(weights: dict[str, torch.Tensor]) -> dict:
    """Everything the weights' shapes alone say about a DFlash drafter."""
    if "fc.weight" not in weights:
        raise InputError("no fc.weight: not a DFlash drafter")
    hidden, fc_in = weights["fc.weight"].shape
    layers = sorted({int(m.group(1)) for k in weights if (m := re.match(r"layers\.(\d+)\.", k))})
    out = {
        "hidden_size": hidden,
        "fc_in_features": fc_in,
        "injected_layers": fc_in / hidden if fc_in % hidden else fc_in // hidden,
        "drafter_layers": len(layers),
    }
    if layers:
        head_dim = weights["layers.0.self_attn.q_norm.weight"].shape[0]
        out["head_dim"] = head_dim
        out["num_heads"] = weights["layers.0.self_attn.q_proj.weight"].shape[0] // head_dim
        out["num_kv_heads"] = weights["layers.0.self_attn.k_proj.weight"].shape[0] // head_dim
        out["intermediate_size"] = weights["layers.0.mlp.gate_proj.weight"].shape[0]
    drafter = sum(v.numel() for k, v in weights.items() if not k.startswith("aux."))
    out["trainable_parameters"] = drafter + sum(v.numel() for k, v in weights.items() if k.startswith("aux."))
    out["aux_heads"] = sorted({k.split(".")[1] for k in weights if k.startswith("aux.")})
    return out


# --- what the config declares ----------------------------------------------------------------------


def declared(config: dict) -> dict:
    """What a config (any layout) or a checkpoint description declares, under this project's names."""
    if config.get("spec_drafters"):
        return _declared_here(config)
    if config.get("speculators_model_type") == "dflash":
        q = config.get("transformer_layer_config", {})
        return {
            "layout": "speculators",
            "vocab_size": config.get("draft_vocab_size"),
            "target_layer_ids": [i - 1 for i in config.get("aux_hidden_state_layer_ids") or []],
            "block_size": config.get("block_size"),
            "mask_token_id": config.get("mask_token_id"),
            "layer_types": q.get("layer_types"),
            "sliding_window": q.get("sliding_window"),
            **_heads(q, "num_attention_heads", "num_key_value_heads"),
        }
    if config:
        dflash = config.get("dflash_config", {})
        return {
            "layout": "zlab",
            "num_target_layers": config.get("num_target_layers"),
            "vocab_size": config.get("vocab_size"),
            "target_layer_ids": dflash.get("target_layer_ids"),
            "block_size": config.get("block_size") or dflash.get("block_size"),
            "mask_token_id": dflash.get("mask_token_id"),
            "layer_types": config.get("layer_types"),
            "sliding_window": config.get("sliding_window"),
            **_heads(config, "num_attention_heads", "num_key_value_heads"),
        }
    return {"layout": "none (weights only)"}


def _declared_here(config: dict) -> dict:
    """This project's own description (a spec_drafters folder, a checkpoint, a built setup)."""
    block = config["spec_drafters"]
    d = block.get("drafter", {})
    target = block.get("target", {})
    return {
        "layout": config.get("source", "spec_drafters"),
        "target": target.get("name"),
        "num_target_layers": block.get("num_target_layers") or target.get("num_layers"),
        "vocab_size": config.get("vocab_size") or target.get("vocab_size"),
        "target_layer_ids": block.get("fc_ids"),
        "tapped_layer_ids": target.get("tap_ids"),
        "block_size": d.get("block_size"),
        "mask_token_id": d.get("mask_token_id"),
        "layer_types": d.get("layer_types"),
        "sliding_window": d.get("sliding_window"),
        "causal_block_layers": d.get("causal_block_layers"),
        "components": block.get("components"),
        "tied_embeddings": target.get("tied_embeddings"),
        **_heads(d, "num_heads", "num_kv_heads"),
    }


def _heads(fields: dict, heads: str, kv_heads: str) -> dict:
    """The attention shape a config declares, under this project's names."""
    return {
        "num_heads": fields.get(heads),
        "num_kv_heads": fields.get(kv_heads),
        "head_dim": fields.get("head_dim"),
    }


# --- the report --------------------------------------------------------------------------------------

#: Declared fields that the weights' shapes also say: (HF config name, the weight that says it).
SHAPE_CHECKS = {
    "num_heads": ("num_attention_heads", "layers.0.self_attn.q_proj.weight"),
    "num_kv_heads": ("num_key_value_heads", "layers.0.self_attn.k_proj.weight"),
    "head_dim": ("head_dim", "layers.0.self_attn.q_norm.weight"),
}


def inspect_drafter(path: str | Path) -> dict:
    """The report of a drafter folder (any layout) or a Lightning checkpoint."""
    return report(str(path), *file_weights(Path(path)))


def inspect_setup(setup: DrafterSetup, label: str) -> dict:
    """The report of a built setup (a config's drafter, untrained), labelled ``label``."""
    return report(label, *setup_weights(setup))


def report(label: str, weights: dict[str, torch.Tensor], config: dict) -> dict:
    """The shapes, the declared fields and every disagreement between them."""
    if "fc.weight" not in weights:
        raise InputError(f"{label}: no fc.weight, not a DFlash drafter")
    shapes = from_shapes(weights)
    said = declared(config)
    out = {"path": label, "from_weights": shapes, "declared": said, "warnings": _disagreements(shapes, said)}
    vocab = said.get("vocab_size")
    if vocab:  # the target's embedding and head, frozen: one matrix when the target ties them
        matrices = 1 if said.get("tied_embeddings") else 2
        out["frozen_parameters_shared_from_target"] = matrices * vocab * shapes["hidden_size"]
        out["frozen_note"] = (
            "tied embedding/head" if matrices == 1 else "embedding + head (untied or unknown)"
        )
    return out


def _disagreements(shapes: dict, said: dict) -> list[str]:
    warnings = []
    ids = said.get("target_layer_ids")
    if ids is not None and len(ids) != shapes["injected_layers"]:
        warnings.append(
            f"the config lists {len(ids)} target layers {ids}, but fc.weight "
            f"{[shapes['hidden_size'], shapes['fc_in_features']]} takes {shapes['injected_layers']}"
        )
    # A head count that disagrees with the weights can still load (same total width), then attends wrongly.
    for key, (name, weight) in SHAPE_CHECKS.items():
        claim, got = said.get(key), shapes.get(key)
        if claim is not None and got is not None and claim != got:
            warnings.append(f"the config says {name} {claim}, but {weight} holds {got}")
    types = said.get("layer_types")
    if types and len(types) != shapes["drafter_layers"]:
        warnings.append(f"layer_types has {len(types)} entries for {shapes['drafter_layers']} layers")
    return warnings


def format_inspect(r: dict) -> str:
    s, d = r["from_weights"], r["declared"]
    lines = [f"{r['path']}  (layout: {d.get('layout')})"]
    fc = f"fc [{s['hidden_size']}, {s['fc_in_features']}] -> {s['injected_layers']} injected target layers"
    lines.append(f"  {fc}, target ids {d.get('target_layer_ids', '?')}")
    if d.get("tapped_layer_ids") and d["tapped_layer_ids"] != d.get("target_layer_ids"):
        lines.append(f"  tapped (incl. label-only layers): {d['tapped_layer_ids']}")
    lines.append(
        f"  {s['drafter_layers']} drafter layers, heads {s.get('num_heads')} / kv {s.get('num_kv_heads')} "
        f"x {s.get('head_dim')}, MLP {s.get('intermediate_size')}"
    )
    types = d.get("layer_types") or ["?"] * s["drafter_layers"]
    causal = set(d.get("causal_block_layers") or [])
    for i, t in enumerate(types):
        window = f", window {d.get('sliding_window')}" if t == "sliding_attention" else ""
        block = "causal" if i in causal else "bidirectional"
        lines.append(f"    layer {i}: {t}{window}, block {block}")
    lines.append(f"  block size {d.get('block_size', '?')}, mask token {d.get('mask_token_id', '?')}")
    target = d.get("target") or "?"
    lines.append(
        f"  target {target}: {d.get('num_target_layers', '?')} layers, vocabulary {d.get('vocab_size', '?')}"
    )
    frozen = r.get("frozen_parameters_shared_from_target")
    lines.append(
        f"  parameters: {s['trainable_parameters']:,} trainable (drafter"
        + (f" + {', '.join(s['aux_heads'])}" if s["aux_heads"] else "")
        + ")"
        + (f", {frozen:,} frozen from the target ({r['frozen_note']})" if frozen else "")
    )
    if d.get("components"):
        lines.append("  components: " + ", ".join(f"{k}={v}" for k, v in d["components"].items()))
    lines += [f"  WARNING: {w}" for w in r["warnings"]]
    return "\n".join(lines)
