"""The three drafter-folder layouts as one table: each layout's config.json, its tensors and its
parser side by side (the weights' keys are the same in all three: ``layers.{i}.*``, ``fc.weight``,
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

Reading and writing files is artefacts/folders.py's. Notation: L target layers, n layers into fc, H
hidden size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from spec_drafters.artefacts.verifier import Verifier
from spec_drafters.errors import InputError
from spec_drafters.model.drafter import DrafterConfig

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


#: What a layout's parser reads from a folder: (drafter config, fc ids, target depth, vocabulary, meta).
Parsed = tuple[DrafterConfig, list[int], int, int, dict]


class Layout:
    """One layout: how a folder says it is this layout, its config.json and tensors, and its parser."""

    name = ""

    def detects(self, config: dict) -> bool:
        raise NotImplementedError

    def config(self, folder: DrafterFolder, verifier: Verifier | None) -> dict:
        raise NotImplementedError

    def tensors(self, folder: DrafterFolder, state: dict, verifier: Verifier | None) -> dict:
        """The weights to write (the drafter's, keys as read); auxiliary heads only where the layout
        has a place for them."""
        if folder.aux:
            left_out = sorted(folder.aux)
            print(f"note: the {self.name} layout has no place for auxiliary heads; left out: {left_out}")
        return state

    def parse(self, path: Path, config: dict, state: dict, num_target_layers: int | None) -> Parsed:
        raise NotImplementedError


class SpecDraftersLayout(Layout):
    name = "spec_drafters"

    def detects(self, config: dict) -> bool:
        return "spec_drafters" in config

    def config(self, folder, verifier):
        # z-lab's fields (readable by z-lab tools when expressible) plus everything of ours
        config = _zlab_fields(folder)
        config["spec_drafters"] = {
            **folder.meta,
            "drafter": asdict(folder.config),
            "fc_ids": list(folder.fc_ids),
            "num_target_layers": folder.num_target_layers,
        }
        return config

    def tensors(self, folder, state, verifier):
        return state | {AUX_PREFIX + k: v.detach().contiguous().cpu() for k, v in folder.aux.items()}

    def parse(self, path, config, state, num_target_layers):
        block = config["spec_drafters"]
        names = {f.name for f in fields(DrafterConfig)}
        cfg = DrafterConfig(**{k: v for k, v in block["drafter"].items() if k in names})
        cfg.validate()
        meta = {k: v for k, v in block.items() if k not in ("drafter", "fc_ids", "num_target_layers")}
        return (
            cfg,
            list(block["fc_ids"]),
            int(block["num_target_layers"]),
            int(config.get("vocab_size") or 0),
            meta,
        )


class ZLabLayout(Layout):
    name = "zlab"

    def detects(self, config: dict) -> bool:
        return "dflash_config" in config or "block_size" in config

    def config(self, folder, verifier):
        return zlab_config(folder)

    def parse(self, path, config, state, num_target_layers):
        dflash = config.get("dflash_config", {})
        fc_ids = list(dflash["target_layer_ids"])
        block_size = config.get("block_size") or dflash.get("block_size")
        if dflash.get("block_size") not in (None, block_size):
            raise ValueError(
                f"{path}: block_size {config.get('block_size')} and dflash_config.block_size "
                f"{dflash['block_size']} disagree"
            )
        cfg = _drafter_config(config, int(block_size), int(dflash["mask_token_id"]), len(fc_ids), [])
        return cfg, fc_ids, int(config["num_target_layers"]), int(config["vocab_size"]), {}


class SpeculatorsLayout(Layout):
    name = "speculators"

    def detects(self, config: dict) -> bool:
        return config.get("speculators_model_type") == "dflash"

    def config(self, folder, verifier):
        return speculators_config(folder, verifier)

    def tensors(self, folder, state, verifier):
        if "draft_ids" in state:
            ids = state.pop("draft_ids")
            state.update(speculators_vocab(ids, folder.vocab_size))
            if verifier is not None:
                state["lm_head.weight"] = verifier.head_rows(ids).to(state["fc.weight"].dtype).contiguous()
        return super().tensors(folder, state, verifier)

    def parse(self, path, config, state, num_target_layers):
        qwen = config["transformer_layer_config"]
        fc_ids = [i - 1 for i in config["aux_hidden_state_layer_ids"]]
        types = qwen.get("layer_types") or []
        non_causal = config.get("sliding_window_non_causal")
        causal = [] if non_causal else [i for i, t in enumerate(types) if t == "sliding_attention"]
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
        return cfg, fc_ids, layers, vocab, {}


#: Every layout by name, in the order a folder's config is recognised (ours first: it also holds
#: z-lab's fields).
TABLE: dict[str, Layout] = {x.name: x for x in (SpecDraftersLayout(), SpeculatorsLayout(), ZLabLayout())}
LAYOUTS = ("spec_drafters", "zlab", "speculators")  # as the CLI lists them


def detect_layout(config: dict) -> str:
    for layout in TABLE.values():
        if layout.detects(config):
            return layout.name
    raise ValueError("neither a spec_drafters, z-lab nor speculators DFlash drafter config")


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


def speculators_vocab(draft_ids: torch.Tensor, vocab_size: int) -> dict[str, torch.Tensor]:
    """speculators' convention: ``d2t[i]`` = target id of draft token i minus i; ``t2d`` marks the
    target ids inside the draft vocabulary (its rows of the target head, in id order)."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return {"d2t": draft_ids - torch.arange(len(draft_ids)), "t2d": t2d}


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
