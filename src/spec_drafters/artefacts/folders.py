"""Drafter folders: ``config.json`` + ``model.safetensors``, in this project's layout or a peer's.

Layouts (the weights' keys are the same in all three: ``layers.{i}.*``, ``fc.weight``,
``hidden_norm.weight``, ``norm.weight``; no embedding and no head, they are the target's):

- ``spec_drafters``: z-lab's config fields plus a ``spec_drafters`` block (component names, the
  target's identity, the drafter config) and any auxiliary heads (``aux.confidence_head.*``).
- ``zlab``: z-lab/dflash's ``DFlashDraftModel`` (a Qwen3 config with ``block_size``,
  ``num_target_layers``, ``dflash_config.{mask_token_id, target_layer_ids, block_size}``, ``layer_types``,
  ``sliding_window``). Its layer ids are this project's (0-based decoder-layer outputs).
- ``speculators``: vllm-project/speculators' ``DFlashSpeculatorConfig``; its
  ``aux_hidden_state_layer_ids`` are ours + 1 (docs/method.md section 1) and exclude the target's last layer,
  which speculators keeps for the verifier only; sliding-window layers are causal inside the block
  unless ``sliding_window_non_causal``. The ``speculators_config`` block (algorithm, proposal, verifier)
  is what vLLM recognises the format by; with a verifier folder and a draft vocabulary, the folder also
  holds ``lm_head.weight``, the target head's rows of the draft ids (artefacts/verifier.py).

Notation: L target layers, n layers into fc, H hidden size.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from spec_drafters.artefacts.checkpoints import read_checkpoint_file
from spec_drafters.artefacts.verifier import Verifier
from spec_drafters.errors import InputError, read_json
from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig

LAYOUTS = ("spec_drafters", "zlab", "speculators")
#: Weights a speculators checkpoint copies from its verifier (target); not the drafter's.
SPECULATORS_TARGET_KEYS = (
    "embed_tokens.weight",
    "lm_head.weight",
    "verifier_lm_head.weight",
    "verifier_norm.weight",
    "t2d",
    "d2t",
)
AUX_PREFIX = "aux."


@dataclass
class DrafterFolder:
    """A drafter read from (or about to be written to) a folder, whatever its layout."""

    config: DrafterConfig  # resolved: every field set
    fc_ids: list[int]  # target layer ids into fc, this project's convention
    num_target_layers: int
    vocab_size: int
    state: dict[str, torch.Tensor]  # drafter weights, z-lab keys
    aux: dict[str, torch.Tensor]  # auxiliary heads (e.g. CAP's confidence head), spec_drafters layout only
    layout: str
    meta: dict  # the spec_drafters block when present (components, target identity)


# --- writing ---------------------------------------------------------------------------------------
def _qwen3_fields(cfg: DrafterConfig, vocab_size: int) -> dict:
    """The Qwen3 config fields z-lab's and speculators' drafter classes read."""
    return {
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "vocab_size": vocab_size,
        "max_position_embeddings": 262144,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "layer_types": list(cfg.layer_types),
        "sliding_window": cfg.sliding_window,
        "use_sliding_window": cfg.sliding_window is not None,
        "max_window_layers": cfg.num_layers,
    }


def _zlab_fields(folder: DrafterFolder) -> dict:
    cfg = folder.config
    return {
        "architectures": ["DFlashDraftModel"],
        **_qwen3_fields(cfg, folder.vocab_size),
        "block_size": cfg.block_size,
        "num_target_layers": folder.num_target_layers,
        # block_size twice: older z-lab readers take the top-level one, newer configs and readers
        # dflash_config's (issue 33).
        "dflash_config": {
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(folder.fc_ids),
            "block_size": cfg.block_size,
        },
    }


def zlab_config(folder: DrafterFolder) -> dict:
    if folder.config.draft_vocab_size is not None:
        raise ValueError(
            f"the z-lab layout has no draft vocabulary (z-lab's drafter always drafts over the target's "
            f"whole vocabulary); this drafter drafts over {folder.config.draft_vocab_size} tokens: export "
            "it with --layout speculators (d2t/t2d) or spec_drafters"
        )
    if folder.config.causal_block_layers:
        raise ValueError(
            "the z-lab layout has no causal-block layers; this drafter's are "
            f"{folder.config.causal_block_layers}"
        )
    return _zlab_fields(folder)


def speculators_config(folder: DrafterFolder, verifier: Verifier | None = None) -> dict:
    """``verifier``: the target folder an engine will verify with (recorded in ``speculators_config``,
    which vLLM requires); without one the block names the target the drafter was trained for, with no
    architectures."""
    cfg = folder.config
    last = folder.num_target_layers - 1
    if last in folder.fc_ids:
        raise ValueError(
            f"the speculators layout keeps the target's last layer ({last}) out of fc (it feeds the verifier "
            f"only); this drafter's fc reads it: {folder.fc_ids}"
        )
    sliding = [i for i, t in enumerate(cfg.layer_types) if t == "sliding_attention"]
    causal = set(cfg.causal_block_layers)
    full_causal = [i for i in causal if i not in sliding]
    if full_causal or (sliding and causal and set(sliding) != causal):
        raise ValueError(
            "speculators makes either every sliding layer causal inside the block or none, and full layers "
            f"never: sliding {sliding}, causal {sorted(causal)}"
        )
    return {
        "speculators_model_type": "dflash",
        "architectures": ["DFlashSpeculator"],
        "transformer_layer_config": _qwen3_fields(cfg, folder.vocab_size),
        "draft_vocab_size": cfg.draft_vocab_size or folder.vocab_size,
        "block_size": cfg.block_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in folder.fc_ids],  # speculators count from 1
        "mask_token_id": cfg.mask_token_id,
        # True unless sliding layers are causal, also with no sliding layer at all: vLLM (0.32) turns
        # False into dflash_config.causal = True for EVERY layer, full ones included (vllm#56692), a
        # drafter trained non-causal then drafts with a causal mask, silently. speculators reads the
        # flag for sliding layers only, so True is what it means too.
        "sliding_window_non_causal": not causal,
        "sample_from_anchor": False,  # the anchor is the bonus token: block_size - 1 drafts a round
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.block_size - 1}],
            "default_proposal_method": "greedy",
            "verifier": verifier.block()
            if verifier is not None
            else {"name_or_path": (folder.meta.get("target") or {}).get("name"), "architectures": []},
        },
    }


#: The files a drafter folder is written as: ``write_folder`` writes the first two, ``calibrate`` the
#: third (per-slot temperatures of these weights). ``export --force`` replaces exactly these.
FOLDER_FILES = ("config.json", "model.safetensors", "calibration.json")


def layout_files(
    folder: DrafterFolder, layout: str, verifier: Verifier | None = None
) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json, the tensors of model.safetensors) of ``folder`` in ``layout``; a ValueError where
    the layout cannot express the drafter, before anything is written. ``verifier`` (speculators
    layout): the target folder, checked against the drafter, named in the config, and the source of a
    draft vocabulary's head rows (artefacts/verifier.py)."""
    if layout not in LAYOUTS:
        raise ValueError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if verifier is not None:
        verifier.check(folder.num_target_layers, folder.config.hidden_size, folder.vocab_size)
    if layout == "zlab":
        config = zlab_config(folder)
    elif layout == "speculators":
        config = speculators_config(folder, verifier)
    else:  # z-lab's fields (readable by z-lab tools when expressible) plus everything of ours
        config = _zlab_fields(folder)
        config["spec_drafters"] = {
            **folder.meta,
            "drafter": asdict(folder.config),
            "fc_ids": list(folder.fc_ids),
            "num_target_layers": folder.num_target_layers,
        }
    state = {k: v.detach().contiguous().cpu() for k, v in folder.state.items()}
    if layout == "speculators" and "draft_ids" in state:
        ids = state.pop("draft_ids")
        state.update(speculators_vocab(ids, folder.vocab_size))
        if verifier is not None:
            state["lm_head.weight"] = verifier.head_rows(ids).to(state["fc.weight"].dtype).contiguous()
    if layout == "spec_drafters":
        state.update({AUX_PREFIX + k: v.detach().contiguous().cpu() for k, v in folder.aux.items()})
    elif folder.aux:
        print(f"note: the {layout} layout has no place for auxiliary heads; left out: {sorted(folder.aux)}")
    return config, state


def write_folder(
    folder: DrafterFolder, path: str | Path, layout: str = "spec_drafters", verifier: Verifier | None = None
) -> Path:
    """Writes ``config.json`` and ``model.safetensors`` (no pickle) into ``path``."""
    return write_files(path, *layout_files(folder, layout, verifier), layout)


def write_files(path: str | Path, config: dict, state: dict[str, torch.Tensor], layout: str) -> Path:
    """``layout_files``' output into ``path``. The weights go through ``save`` + ``write_bytes``, so
    the file's mode follows the umask like any other file's (``save_file`` creates it 0600)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "model.safetensors").write_bytes(save(state, metadata={"format": "pt", "layout": layout}))
    return out


def speculators_vocab(draft_ids: torch.Tensor, vocab_size: int) -> dict[str, torch.Tensor]:
    """speculators' convention: ``d2t[i]`` = target id of draft token i minus i; ``t2d`` marks the
    target ids inside the draft vocabulary (its rows of the target head, in id order)."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return {"d2t": draft_ids - torch.arange(len(draft_ids)), "t2d": t2d}


# --- reading ---------------------------------------------------------------------------------------
def detect_layout(config: dict) -> str:
    if "spec_drafters" in config:
        return "spec_drafters"
    if config.get("speculators_model_type") == "dflash":
        return "speculators"
    if "dflash_config" in config or "block_size" in config:
        return "zlab"
    raise ValueError("neither a spec_drafters, z-lab nor speculators DFlash drafter config")


def _drafter_config(qwen: dict, block_size: int, mask_token_id: int, n_fc: int, causal: list[int]):
    layers = qwen["num_hidden_layers"]
    rope = qwen.get("rope_theta") or (qwen.get("rope_parameters") or {}).get("rope_theta") or 10_000.0
    types = qwen.get("layer_types") or ["full_attention"] * layers
    cfg = DrafterConfig(
        num_layers=layers,
        block_size=block_size,
        num_heads=qwen["num_attention_heads"],
        num_kv_heads=qwen["num_key_value_heads"],
        head_dim=qwen.get("head_dim") or qwen["hidden_size"] // qwen["num_attention_heads"],
        intermediate_size=qwen["intermediate_size"],
        rms_norm_eps=qwen.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope),
        hidden_size=qwen["hidden_size"],
        num_fc_inputs=n_fc,
        mask_token_id=mask_token_id,
        layer_types=list(types),
        sliding_window=qwen.get("sliding_window") if "sliding_attention" in types else None,
        causal_block_layers=causal,
    )
    cfg.validate()
    return cfg


def read_config_json(file: Path) -> dict:
    """A drafter folder's config.json; malformed JSON names the file and line."""
    config = read_json(file)
    if not isinstance(config, dict):
        raise InputError(f"{file}: the top level must be an object, got a {type(config).__name__}")
    return config


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """A model.safetensors; a truncated or foreign file names the file (not the library's words only)."""
    try:
        return load_file(str(file))
    except SafetensorError as e:
        raise InputError(
            f"{file}: not a readable safetensors file ({e}); truncated or not fully copied?"
        ) from None


def read_folder(path: str | Path, num_target_layers: int | None = None) -> DrafterFolder:
    """Reads any of the three layouts. ``num_target_layers`` is needed only for speculators folders."""
    path = Path(path)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise InputError(f"{path}: a drafter folder holds config.json and model.safetensors")
    config = read_config_json(path / "config.json")
    try:
        layout = detect_layout(config)
    except ValueError as e:
        raise InputError(f"{path / 'config.json'}: {e}") from None
    weights = read_weights(path / "model.safetensors")
    try:
        return _parse_folder(path, config, layout, weights, num_target_layers)
    except KeyError as e:  # a field its layout needs is absent
        target = (config.get("spec_drafters") or {}).get("target") or {}
        made_for = (
            f"; made for target {target['name']!r}" if isinstance(target, dict) and "name" in target else ""
        )
        raise InputError(
            f"{path / 'config.json'}: no field {e} (needed by the {layout} layout{made_for})"
        ) from None


def _parse_folder(
    path: Path, config: dict, layout: str, weights: dict, num_target_layers: int | None
) -> DrafterFolder:
    aux = {k[len(AUX_PREFIX) :]: v for k, v in weights.items() if k.startswith(AUX_PREFIX)}
    state = {k: v for k, v in weights.items() if not k.startswith(AUX_PREFIX)}
    meta: dict = {}
    if layout == "spec_drafters":
        block = config["spec_drafters"]
        names = {f.name for f in fields(DrafterConfig)}
        cfg = DrafterConfig(**{k: v for k, v in block["drafter"].items() if k in names})
        cfg.validate()
        fc_ids, layers = list(block["fc_ids"]), int(block["num_target_layers"])
        meta = {k: v for k, v in block.items() if k not in ("drafter", "fc_ids", "num_target_layers")}
        vocab = int(config.get("vocab_size") or 0)
    elif layout == "zlab":
        dflash = config.get("dflash_config", {})
        fc_ids = list(dflash["target_layer_ids"])
        block_size = config.get("block_size") or dflash.get("block_size")
        if dflash.get("block_size") not in (None, block_size):
            raise ValueError(
                f"{path}: block_size {config.get('block_size')} and dflash_config.block_size "
                f"{dflash['block_size']} disagree"
            )
        cfg = _drafter_config(config, int(block_size), int(dflash["mask_token_id"]), len(fc_ids), [])
        layers, vocab = int(config["num_target_layers"]), int(config["vocab_size"])
    else:
        qwen = config["transformer_layer_config"]
        fc_ids = [i - 1 for i in config["aux_hidden_state_layer_ids"]]
        types = qwen.get("layer_types") or []
        causal = (
            []
            if config.get("sliding_window_non_causal")
            else [i for i, t in enumerate(types) if t == "sliding_attention"]
        )
        cfg = _drafter_config(
            qwen, int(config["block_size"]), int(config["mask_token_id"]), len(fc_ids), causal
        )
        layers = num_target_layers or int(config.get("num_target_layers") or 0)
        if not layers and num_target_layers != 0:  # 0: the caller accepts an unknown depth
            raise InputError(
                f"{path}: a speculators config does not say the target's depth; pass num_target_layers "
                "(export: --num_target_layers)"
            )
        vocab = int(qwen["vocab_size"])
        d2t = state.get("d2t")
        if d2t is not None and int(config.get("draft_vocab_size") or vocab) < vocab:
            cfg.draft_vocab_size = len(d2t)
            state["draft_ids"] = d2t.long() + torch.arange(len(d2t))
        for key in SPECULATORS_TARGET_KEYS:
            state.pop(key, None)  # the target's own, filled in by speculators' converter
    return DrafterFolder(cfg, fc_ids, layers, vocab, state, aux, layout, meta)


def build_drafter(folder: DrafterFolder) -> DFlashDrafter:
    """A DFlashDrafter holding the folder's weights; every key must match (strict)."""
    drafter = DFlashDrafter(folder.config)
    floats = [t.dtype for t in folder.state.values() if t.is_floating_point()]  # not draft_ids (int64)
    if floats:  # keep the stored precision
        drafter.to(floats[0])
    missing, unexpected = drafter.load_state_dict(folder.state, strict=False)
    if missing or unexpected:
        raise KeyError(f"drafter weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return drafter


# --- from training artefacts -----------------------------------------------------------------------
def folder_from_checkpoint(path: str | Path) -> DrafterFolder:
    """The drafter of a Lightning checkpoint, without loading the target (the checkpoint says enough)."""
    ckpt = read_checkpoint_file(path)
    desc = ckpt.get("spec_drafters")
    if not isinstance(desc, dict):
        raise InputError(f"{path}: not a spec-drafters checkpoint (no 'spec_drafters' description)")
    try:
        return _checkpoint_folder(ckpt, desc)
    except KeyError as e:
        raise InputError(f"{path}: its 'spec_drafters' description has no field {e}") from None


def _checkpoint_folder(ckpt: dict, desc: dict) -> DrafterFolder:
    names = {f.name for f in fields(DrafterConfig)}
    cfg = DrafterConfig(**{k: v for k, v in desc["drafter"].items() if k in names})
    cfg.validate()
    sd = ckpt["state_dict"]
    state = {k[len("drafter.") :]: v for k, v in sd.items() if k.startswith("drafter.")}
    aux = {
        aux_name(k): v for k, v in sd.items() if k.startswith("loss_fn.") and k.endswith(("weight", "bias"))
    }
    target = desc["target"]
    vocab = int(target.get("vocab_size") or 0)
    if not vocab:
        from spec_drafters.target.cards import TargetCard

        vocab = TargetCard.load(target["name"]).vocab_size
    meta = {"target": target, "components": desc.get("components", {})}
    return DrafterFolder(
        cfg, list(desc["fc_ids"]), int(target["num_layers"]), vocab, state, aux, "checkpoint", meta
    )


def aux_name(key: str) -> str:
    # loss_fn.head.weight (CAP) -> confidence_head.weight; other heads keep their path under loss_fn.
    rest = key[len("loss_fn.") :]
    return "confidence_head." + rest.split(".")[-1] if rest.startswith("head.") else rest


def describe_drafter(
    card_name: str, target, fc_ids: list[int], config: DrafterConfig, components: dict
) -> dict:
    """The ``spec_drafters`` block of a checkpoint: what the drafter is, in plain types (its target's
    identity and shape, fc ids, drafter config, component names), read back by folder_from_checkpoint."""
    return {
        "target": {
            "name": card_name,
            "num_layers": target.num_layers,
            "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size,
            "tied_embeddings": target.lm_head.weight is target.embed_tokens.weight,
            "tap_ids": target.tap_ids,
        },
        "fc_ids": fc_ids,
        "drafter": asdict(config),
        "components": {**components, "attention": config.attention},
    }
