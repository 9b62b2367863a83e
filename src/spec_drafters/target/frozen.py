"""The frozen target: any HuggingFace causal LM, tapped at chosen decoder-layer outputs.

Layer-id convention (docs/method.md section 1, z-lab's): id ``i`` is the 0-based index of the decoder layer
whose *output* is tapped, i.e. HuggingFace ``output_hidden_states[i + 1]`` for ``i < L - 1``.
vLLM/speculators number one higher. We read the layer outputs with forward hooks rather than through
``output_hidden_states`` because HuggingFace replaces the last entry with the *normed* final state,
which would silently change the meaning of id ``L - 1``.

Notation: b batch, T tokens in this call, H hidden size, V vocabulary, L decoder layers.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class TargetOutput:
    taps: dict[int, torch.Tensor]  # layer id -> (b, T, H) output of that decoder layer
    hidden: torch.Tensor  # (b, T, H) final decoder state after the final norm (what lm_head reads)
    cache: object | None = None  # the model's KV cache when ``use_cache`` was set


def validate_layer_ids(ids: Sequence[int], num_layers: int, field: str) -> list[int]:
    """Checks a list of target layer ids; ``field`` names them in the error, as the caller's argument
    (``layer_ids``), never as a command-line flag: the caller's caller knows the flag."""
    ids = list(ids)
    if not ids:
        raise ValueError(f"{field} must name at least one target layer")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f"{field} has layer ids {bad} outside the target's 0..{num_layers - 1} "
            f"(ids are 0-based decoder-layer outputs; speculators ids are one higher)"
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"{field} has duplicate layer ids: {ids}")
    if ids != sorted(ids):
        raise ValueError(f"{field} must be sorted ascending, got {ids}")
    return ids


class FrozenTarget(nn.Module):
    """Wraps a HF causal LM; never trained. ``tap_ids`` are captured on every forward."""

    def __init__(self, model: nn.Module, tap_ids: Sequence[int]):
        super().__init__()
        model.eval()
        model.requires_grad_(False)
        self.model = model
        self.base = model.base_model  # the decoder stack (LlamaModel, Qwen3Model, ...)
        self.num_layers = len(self.base.layers)
        self.tap_ids = validate_layer_ids(sorted(set(tap_ids)), self.num_layers, "tap ids")
        cfg = model.config
        self.hidden_size: int = cfg.hidden_size
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        # The positions the target was built for (None when its config does not say); decoding
        # refuses to run past them (decoding.check_fits).
        self.context_length: int | None = getattr(cfg, "max_position_embeddings", None)
        # transformers 5 renamed ``past_key_values`` to ``cache``; accept both generations.
        params = inspect.signature(self.base.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def train(self, mode: bool = True) -> FrozenTarget:
        # The target stays in eval mode whatever the LightningModule does (no dropout, frozen stats).
        return super().train(False)

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    @property
    def norm(self) -> nn.Module:
        return self.base.norm

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)  # (b, T) -> (b, T, H)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # (b, T, H) -> (b, T, V)

    def layer_logits(self, layer_output: torch.Tensor) -> torch.Tensor:
        """Logits of an intermediate layer through the same final norm and head ("layer k" labels)."""
        return self.head(self.norm(layer_output))  # (b, T, H) -> (b, T, V)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # (b, T)
        attention_mask: torch.Tensor | None = None,  # (b, T) 1 = real token, or a 4D mask
        position_ids: torch.Tensor | None = None,  # (b, T)
        cache: object | None = None,
        use_cache: bool = False,
    ) -> TargetOutput:
        if attention_mask is not None and attention_mask.dim() == 4:
            kernel = getattr(self.model.config, "_attn_implementation", None) or ""
            if kernel.startswith("flash"):  # it would read a tree's mask as causal, silently
                raise ValueError(
                    f"the target runs attn_implementation={kernel!r}, which takes no 4D mask: tree "
                    "verification (DDTree) needs 'sdpa' or 'eager' (docs/scale.md#gpu)"
                )
        taps: dict[int, torch.Tensor] = {}
        handles = [self.base.layers[i].register_forward_hook(_capture(taps, i)) for i in self.tap_ids]
        try:
            out = self.base(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=use_cache,
                **{self._cache_kw: cache},
            )
        finally:
            for h in handles:
                h.remove()
        return TargetOutput(taps=taps, hidden=out.last_hidden_state, cache=getattr(out, self._cache_kw, None))


def _capture(store: dict[int, torch.Tensor], layer_id: int):
    def hook(_module, _args, output):
        store[layer_id] = output[0] if isinstance(output, tuple) else output  # (b, T, H)

    return hook


def crop_cache(cache: object, length: int) -> None:
    """Shrinks a HF KV cache to its first ``length`` positions (after rejected drafts)."""
    excess = cache.get_seq_length() - length
    if excess < 0:
        raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} positions to {length}")
    if excess:
        cache.crop(-excess)  # negative = "remove this many"; valid in transformers 4.x and 5.x


def keep_layer(layer, start: int, path: list[int]) -> None:
    """One attention layer's KV: positions 0..start-1, then the path's entries (indices from ``start``).
    Only the path's |path| entries move (next to the committed ones); the rest is cut off, so a round
    copies what it keeps of the tree, never the whole context."""
    n = len(path)
    if path != list(range(n)):  # a chain prefix is already in place
        src = start + torch.tensor(path, device=layer.keys.device)
        layer.keys[..., start : start + n, :] = layer.keys.index_select(-2, src)
        layer.values[..., start : start + n, :] = layer.values.index_select(-2, src)
    layer.keys = layer.keys[..., : start + n, :]
    layer.values = layer.values[..., : start + n, :]
