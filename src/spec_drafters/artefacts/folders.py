"""Drafter folders: ``config.json`` + ``model.safetensors``, written and read in any of the three layouts
(artefacts/layouts.py: spec_drafters, zlab, speculators), a checkpoint's drafter as a folder, a drafter
built from a folder, and the description every checkpoint stores.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from spec_drafters.artefacts.checkpoints import read_checkpoint_file
from spec_drafters.artefacts.layouts import AUX_PREFIX, LAYOUTS, TABLE, DrafterFolder, detect_layout
from spec_drafters.artefacts.verifier import Verifier
from spec_drafters.errors import InputError, read_json
from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig

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
    if layout not in TABLE:
        raise ValueError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if verifier is not None:
        verifier.check(folder.num_target_layers, folder.config.hidden_size, folder.vocab_size)
    chosen = TABLE[layout]
    state = {k: v.detach().contiguous().cpu() for k, v in folder.state.items()}
    return chosen.config(folder, verifier), chosen.tensors(folder, state, verifier)


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


# --- reading ---------------------------------------------------------------------------------------
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
    cfg, fc_ids, layers, vocab, meta = TABLE[layout].parse(path, config, state, num_target_layers)
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
