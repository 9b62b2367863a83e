"""The DFlash drafter, top to bottom in one file (arXiv:2602.06036; reference code z-lab/dflash).

A stack of Qwen3-style pre-norm decoder layers that proposes K-1 tokens in one forward pass, given the
anchor token, K-1 mask tokens and features of the frozen target:

    taps (b, S, n*H) --fc--> hidden_norm --> ctx (b, S, H)          the same ctx for every layer
    block ids [anchor, MASK x (K-1)] --target embed_tokens--> x (b, Q, H)
    every layer: queries from x only; keys/values = [k_proj(ctx) | k_proj(x)]   ("KV injection")
    final norm --> target lm_head (outside this module) --> logits for slots 1..K-1

Target features never enter the residual stream; they are only keys and values. The embedding and the
head are the target's, frozen, so this module owns neither (its weights match z-lab's layout:
``layers.{i}.*``, ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``).

Notation: b batch, S context positions, N anchors, K block size, Q = N*K block tokens, H hidden size,
n tapped layers in fc, h / hk query / key-value heads, d head dim.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, get_args

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from spec_drafters.model import kernels
from spec_drafters.model.attention import get_attention
from spec_drafters.model.masks import LayerAttention, inference_mask

LayerType = Literal["full_attention", "sliding_attention"]
"""A drafter layer's attention, as HF checkpoints' ``layer_types`` name it."""


@dataclass
class DrafterConfig:
    """Shape of a DFlash drafter. Fields left ``None`` are taken from the target."""

    num_layers: int = 1
    """Drafter decoder layers (the released Qwen3-8B drafter has 5)."""
    block_size: int = 16
    """K: tokens per block, the anchor plus K-1 drafted slots."""
    num_heads: int | None = None
    """Query heads; default: the target's."""
    num_kv_heads: int | None = None
    """Key/value heads; default: the target's."""
    head_dim: int | None = None
    """Per-head width; default: the target's."""
    intermediate_size: int | None = None
    """SwiGLU width; default: the target's."""
    rms_norm_eps: float = 1e-6
    rope_theta: float | None = None
    """RoPE base; default: the target's."""
    attention: str = "split"
    """Attention kernel by registry name (``spec-drafters registry`` lists them); ``split`` is the
    fastest measured on CPU (benchmarks/training_step.py) and exact; serving always runs ``sdpa``-like."""
    init_std: float = 0.02
    # Filled from the target, the injection and the mask choice; not user settings.
    hidden_size: int | None = None
    num_fc_inputs: int | None = None
    mask_token_id: int | None = None
    layer_types: list[LayerType] = field(default_factory=list)
    """Per layer: "full_attention" or "sliding_attention" (HF checkpoints' convention)."""
    sliding_window: int | None = None
    causal_block_layers: list[int] = field(default_factory=list)
    """Layers causal inside the block (the others are bidirectional there)."""
    draft_vocab_size: int | None = None
    """V_d when the drafter drafts over a subset of the target's vocabulary (``--model.draft_vocab``;
    the subset's token ids are the ``draft_ids`` buffer); None: the whole vocabulary."""

    def resolved(
        self,
        target_config,
        num_fc_inputs: int,
        mask_token_id: int,
        layers: list[LayerAttention] | None = None,
    ) -> DrafterConfig:
        """A copy with every ``None`` filled from the target's HF config and the mask's per-layer rule."""
        layers = layers or [LayerAttention()] * self.num_layers
        windows = {a.window for a in layers if a.window is not None}
        if len(windows) > 1:
            raise ValueError(f"one sliding window size per drafter, got {sorted(windows)}")
        t = target_config
        rope = getattr(t, "rope_theta", None) or (getattr(t, "rope_parameters", None) or {}).get("rope_theta")
        cfg = replace(
            self,
            hidden_size=t.hidden_size,
            num_fc_inputs=num_fc_inputs,
            mask_token_id=mask_token_id,
            num_heads=self.num_heads or t.num_attention_heads,
            num_kv_heads=self.num_kv_heads or t.num_key_value_heads,
            head_dim=self.head_dim or getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
            intermediate_size=self.intermediate_size or t.intermediate_size,
            rope_theta=self.rope_theta or rope or 10_000.0,
            layer_types=[a.layer_type for a in layers],
            sliding_window=windows.pop() if windows else None,
            causal_block_layers=[i for i, a in enumerate(layers) if a.causal_block],
        )
        cfg.validate()
        return cfg

    def layer_attention(self, i: int) -> LayerAttention:
        """The attention rule of layer ``i`` as recorded in this config."""
        sliding = self.layer_types[i] == "sliding_attention"
        return LayerAttention(self.sliding_window if sliding else None, i in self.causal_block_layers)

    def validate(self) -> None:
        optional = ("sliding_window", "draft_vocab_size")
        missing = [k for k, v in self.__dict__.items() if v is None and k not in optional]
        if missing:
            raise ValueError(f"unresolved fields {missing} (call resolved() with the target)")
        if self.block_size < 2:
            raise ValueError(
                f"block_size must be >= 2 (an anchor and one drafted slot), got {self.block_size}"
            )
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        get_attention(self.attention)  # raises with the valid names
        self._validate_layers()

    def _validate_layers(self) -> None:
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        unknown = set(self.layer_types) - set(get_args(LayerType))
        if unknown:  # jsonargparse checks the Literal; a config read from a file does not pass through it
            raise ValueError(
                f"unknown layer_types {sorted(unknown)}; valid: {', '.join(get_args(LayerType))}"
            )
        sliding = "sliding_attention" in self.layer_types
        if sliding and (self.sliding_window is None or self.sliding_window < self.block_size):
            raise ValueError(
                f"the sliding window must be >= block_size ({self.block_size}) so a block fits its own "
                f"window, got {self.sliding_window}"
            )
        bad = [i for i in self.causal_block_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"causal_block_layers {bad} outside 0..{self.num_layers - 1}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))  # at least fp32 for the statistics
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin for absolute positions (b, T) -> two (b, 1, T, d) tensors (HF's half-rotation layout)."""
    wide = torch.promote_types(dtype, torch.float32)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=wide) / head_dim)
    freqs = positions.to(wide)[..., None] * inv_freq  # (b, T, d/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (b, 1, T, d)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin  # (b, h, T, d)


class Attention(nn.Module):
    """Qwen3 attention (per-head q/k RMSNorm before RoPE) whose keys/values also cover the context."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.h, self.hk, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.hk * self.d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.hk * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.kernel = get_attention(cfg.attention)
        self.scale = self.d**-0.5

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Keys and values of x (b, T, H), RoPE'd at their positions -> two (b, hk, T, d)."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.hk, self.d)).transpose(1, 2)  # (b, hk, T, d)
        v = self.v_proj(x).view(b, t, self.hk, self.d).transpose(1, 2)  # (b, hk, T, d)
        return apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.h, self.d)).transpose(1, 2)  # (b, h, Q, d)
        q = apply_rope(q, cos, sin)
        k_blk, v_blk = self.project_kv(x, cos, sin)  # (b, hk, Q, d)
        k = torch.cat([ctx_k, k_blk], dim=2)  # (b, hk, S + Q, d)
        v = torch.cat([ctx_v, v_blk], dim=2)  # (b, hk, S + Q, d)
        out = self.kernel(q, k, v, mask, self.scale)  # (b, h, Q, d)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, self.h * self.d))  # (b, Q, H)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        # The context goes through this layer's own k/v projections and k-norm, but not through
        # input_layernorm: ctx is already RMS-normalised by hidden_norm (as in z-lab's model).
        return self.self_attn.project_kv(ctx, cos, sin)

    def forward(self, x, cos, sin, context, mask):
        """``context``: this layer's cached (keys, values), or (ctx (b, S, H), cos, sin) to project here.

        Projecting the context inside this forward (training) keeps every use of the layer's weights
        within one call, which FSDP2 needs: ``fully_shard`` gathers a layer's weights around its
        forward only.
        """
        ctx_k, ctx_v = self.context_kv(*context) if len(context) == 3 else context  # (b, hk, S, d)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)  # (b, Q, H)
        return x + self.mlp(self.post_attention_layernorm(x))  # (b, Q, H)


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.fc = nn.Linear(cfg.num_fc_inputs * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.checkpoint_layers = False  # activation checkpointing per layer (set by the module)
        # Draft vocabulary (vocab.py): sorted target ids of the V_d draftable tokens, saved with the
        # weights; the head is the target's frozen lm_head rows at these ids (no new parameters).
        self.draft_ids: torch.Tensor | None
        if cfg.draft_vocab_size is None:
            self.draft_ids = None
        else:
            self.register_buffer("draft_ids", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self._head_rows: tuple | None = None  # (key, the head's V_d rows, their packed copy), lazily
        self._to_draft: tuple | None = None  # (key, (V,) target id -> draft index or -1), lazily
        self.reset_parameters()

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """(.., H) -> (.., V) through the target's head, or (.., V_d) over the draft vocabulary.

        The (V_d, H) slice of the frozen head is taken once and reused (decoding calls this every
        round); it is rebuilt when the ids, the device or the dtype change. Without gradients
        (decoding, validation) it runs on a prepacked oneDNN copy where one helps (kernels.py: about
        a quarter of the stock product's time for 7 x 8192 rows on this project's CPU).
        """
        if self.draft_ids is None:
            return lm_head(hidden)
        w = lm_head.weight
        key = (self.draft_ids.data_ptr(), self.draft_ids._version, w.data_ptr(), w.dtype, w.device)
        if self._head_rows is None or self._head_rows[0] != key:
            # Built as normal tensors even under inference_mode (validation): a cached inference
            # tensor could not be used by the training steps that follow (autograd refuses it).
            with torch.inference_mode(False):
                rows = nn.Linear(w.shape[1], len(self.draft_ids), bias=False, device="meta")
                rows.weight = nn.Parameter(w.detach().index_select(0, self.draft_ids.to(w.device)), False)
                packable = kernels.available() and kernels.packable(rows)
                packed = kernels.PackedLinear(rows) if packable else None
            self._head_rows = (key, rows, packed)
        _, rows, packed = self._head_rows
        return rows(hidden) if packed is None or torch.is_grad_enabled() else packed(hidden)

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices -> target token ids (the identity without a draft vocabulary)."""
        return ids if self.draft_ids is None else self.draft_ids[ids]

    def to_draft(self, tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Target token ids -> draft-vocabulary indices, -1 for tokens outside it."""
        if self.draft_ids is None:
            return tokens
        key = (self.draft_ids.data_ptr(), self.draft_ids._version, vocab_size, tokens.device)
        if self._to_draft is None or self._to_draft[0] != key:  # built once, not every training step
            index = torch.full((vocab_size,), -1, dtype=torch.long, device=self.draft_ids.device)
            index[self.draft_ids] = torch.arange(len(self.draft_ids), device=self.draft_ids.device)
            self._to_draft = (key, index.to(tokens.device))
        return self._to_draft[1][tokens]

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=self.config.init_std)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def encode_context(
        self, taps: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer context keys/values from tapped target features.

        taps (b, S, n*H) at absolute ``positions`` (b, S) -> per layer ((b, hk, S, d), (b, hk, S, d)).
        Each position's entry depends on that position alone, so a cache of these only ever grows.
        """
        ctx = self.hidden_norm(self.fc(taps))  # (b, S, H)
        cos, sin = self._rope(positions, ctx.dtype)
        return [layer.context_kv(ctx, cos, sin) for layer in self.layers]

    def forward(
        self,
        block_embeds: torch.Tensor,  # (b, Q, H) target embeddings of [anchor, MASK...] per block
        block_positions: torch.Tensor,  # (b, Q) absolute positions p_j + k
        context_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,  # from a ContextCache
        masks: list | None = None,  # per layer: (b, 1, Q, S + Q) bool or a BlockLayout; None at inference
        *,
        taps: torch.Tensor | None = None,  # (b, S, n*H) training: the context's tapped features
        context_positions: torch.Tensor | None = None,  # (b, S) their absolute positions
    ) -> torch.Tensor:
        """Final hidden state (b, Q, H) of every block token; logits = target lm_head(this).

        The context comes either as per-layer keys/values (serving, from :class:`ContextCache`) or
        as tapped features (training), which are encoded here so that all weights are used inside
        this call and the layers' own (FSDP2 gathers weights per forward).
        """
        if (context_kv is None) == (taps is None):
            raise ValueError("DFlashDrafter.forward: give exactly one of context_kv and taps")
        x = block_embeds
        cos, sin = self._rope(block_positions, x.dtype)
        if taps is not None:
            if context_positions is None:
                b, s, _ = taps.shape
                context_positions = torch.arange(s, device=taps.device).expand(b, s)  # (b, S)
            ctx = self.hidden_norm(self.fc(taps))  # (b, S, H)
            contexts = [(ctx, *self._rope(context_positions, ctx.dtype))] * len(self.layers)
        else:
            contexts = context_kv
        if masks is None:  # serving: one block right after the S committed context positions
            ctx_len = contexts[0][0].shape[-2]
            masks = [inference_mask(ctx_len, block_positions, a) for a in self.layer_rules()]
        for layer, context, mask in zip(self.layers, contexts, masks, strict=True):
            if self.checkpoint_layers and torch.is_grad_enabled():  # recompute in backward, keep less
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, context, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, context, mask)  # (b, Q, H)
        return self.norm(x)  # (b, Q, H)

    def layer_rules(self) -> list[LayerAttention]:
        return [self.config.layer_attention(i) for i in range(self.config.num_layers)]


class ContextCache:
    """The drafter's inference cache: context keys/values only, grown by the committed positions.

    Block tokens are never cached: every draft pass recomputes its K tokens against the context, which
    is what the training mask reproduces (docs/method.md section 3: the cache is cropped back after drafting).
    """

    def __init__(self, drafter: DFlashDrafter):
        self.drafter = drafter
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.length = 0

    def append(self, taps: torch.Tensor) -> None:
        """Adds tapped features (b, T, n*H) of the next T committed positions."""
        b, t, _ = taps.shape
        pos = torch.arange(self.length, self.length + t, device=taps.device).expand(b, t)  # (b, T)
        new = self.drafter.encode_context(taps, pos)
        if self.kv is None:
            self.kv = new
        else:
            self.kv = [
                (torch.cat([k, nk], 2), torch.cat([v, nv], 2))
                for (k, v), (nk, nv) in zip(self.kv, new, strict=True)
            ]
        self.length += t
