"""One teacher-forced step as plain torch: target features -> noise -> anchors -> blocks, labels and
masks -> the drafter's hidden state per block slot.

Training and validation (the LightningModule) call :class:`StepBuilder`; the offline feature cache and
decoding share its first stage (target/features.py). Notation: b batch, S sequence length, N anchors,
K block size, Q = N*K, H hidden, V vocabulary (V_d over a draft vocabulary), M supervised slots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from spec_drafters.model.blocks import build_blocks
from spec_drafters.model.drafter import DFlashDrafter
from spec_drafters.model.masks import DrafterMask
from spec_drafters.rng import derived_seed
from spec_drafters.target.features import TargetFeatures, cached_features, target_features
from spec_drafters.target.frozen import FrozenTarget
from spec_drafters.target.labels import TargetSource
from spec_drafters.train.anchors import AnchorSampler, block_labels
from spec_drafters.train.losses import SlotBatch
from spec_drafters.train.noise import FeatureNoise


@dataclass
class StepInputs:
    """Everything one teacher-forced step feeds the drafter and the loss."""

    features: torch.Tensor  # (b, S, n*H) the fc input, noised in training
    clean_features: torch.Tensor  # (b, S, n*H) the same before noise
    anchors: torch.Tensor  # (b, N)
    anchor_ok: torch.Tensor  # (b, N) bool
    block_ids: torch.Tensor  # (b, Q) [anchor, MASK...] per block
    block_pos: torch.Tensor  # (b, Q) absolute positions
    labels: torch.Tensor  # (b, N, K) slot labels (draft-vocabulary indices, -1 outside it)
    supervised: torch.Tensor  # (b, N, K) bool: labelled slots whose label the drafter can draft
    scored: torch.Tensor  # (b, N, K) bool: labelled slots, drafted or not (validation counts misses)
    teacher: Callable[[slice], torch.Tensor] | None  # rows of the M -> (C, V) target logits (soft losses)
    masks: list  # per drafter layer: a BlockLayout, or a dense (b, 1, Q, S + Q) from a plugin mask
    label_hidden: torch.Tensor | None = None  # (b, S, H) the target source's predictor hidden state


class StepBuilder:
    """Builds :class:`StepInputs` from a batch of token ids (online) or of cached features (offline).

    Random draws (anchors, noise) are per sequence, seeded by (step seed, the sequence's row in the
    global batch): a batch split over data-parallel ranks draws exactly what one process would on all
    of it, and a resumed run draws what the uninterrupted one did.
    """

    def __init__(
        self,
        target: FrozenTarget,
        drafter: DFlashDrafter,
        fc_ids: list[int],
        noise: FeatureNoise,
        mask: DrafterMask,
        soft_labels: bool,
    ):
        self.target, self.drafter, self.fc_ids = target, drafter, fc_ids
        self.noise, self.mask, self.soft_labels = noise, mask, soft_labels

    def __call__(
        self,
        batch: dict[str, torch.Tensor],
        sampler: AnchorSampler,
        source: TargetSource,
        seed: int,
        rows: range,
        noisy: bool,
    ) -> StepInputs:
        ids, loss_mask = batch["input_ids"], batch["loss_mask"]  # (b, S)
        k = self.drafter.config.block_size
        feats = self.features(batch, source)
        features = self.noised(feats.clean, seed, rows) if noisy else feats.clean
        anchors, anchor_ok = self.draw_anchors(loss_mask, sampler, seed, rows)  # (b, N) each
        block_ids, block_pos = build_blocks(ids, anchors, k, self.drafter.config.mask_token_id)  # (b, Q)
        slot_labels, scored = block_labels(feats.labels, feats.label_ok, loss_mask, anchors, anchor_ok, k)
        # With a draft vocabulary, labels become its indices; a slot whose label lies outside it is not
        # trained (the drafter can never propose it) but validation still counts it as a miss.
        slot_labels = self.drafter.to_draft(slot_labels, self.target.vocab_size)  # (b, N, K)
        supervised = scored & (slot_labels >= 0)
        teacher = self.teacher(source, feats.hidden, anchors, supervised) if self.soft_labels else None
        masks = self.masks(anchors, anchor_ok, ids.shape[1])
        return StepInputs(
            features, feats.clean, anchors, anchor_ok, block_ids, block_pos, slot_labels, supervised,
            scored, teacher, masks, feats.hidden,
        )  # fmt: skip

    def features(self, batch: dict[str, torch.Tensor], source: TargetSource) -> TargetFeatures:
        """The target's side of the step: from the offline cache when the batch carries it."""
        if "features" in batch:  # the cache holds what the target would give (labels of its source)
            return cached_features(batch, self.target.embed_tokens.weight.dtype)
        return target_features(self.target, self.fc_ids, source, batch["input_ids"], batch["attention_mask"])

    def noised(self, clean: torch.Tensor, seed: int, rows: range) -> torch.Tensor:
        """A noised copy of the fc input (b, S, n*H): labels keep reading the clean tensors."""
        draws = [
            self.noise(
                clean[i : i + 1], torch.Generator(clean.device).manual_seed(derived_seed(seed + 10**12, r))
            )
            for i, r in enumerate(rows)
        ]
        return torch.cat(draws)

    def draw_anchors(self, loss_mask: torch.Tensor, sampler: AnchorSampler, seed: int, rows: range):
        """-> anchors (b, N), valid (b, N)."""
        k = self.drafter.config.block_size
        drawn = [
            sampler(loss_mask[i : i + 1], k, torch.Generator().manual_seed(derived_seed(seed, r)))
            for i, r in enumerate(rows)
        ]
        return torch.cat([a for a, _ in drawn]), torch.cat([ok for _, ok in drawn])

    def teacher(self, source, hidden, anchors, supervised) -> Callable[[slice], torch.Tensor]:
        """The target's logits for rows of the M supervised slots, per chunk when the loss asks."""
        b_idx, anchor_idx, slot = supervised.nonzero(as_tuple=True)  # (M,) each, in (b, N, K) order
        positions = anchors[b_idx, anchor_idx] + slot
        target, draft_ids = self.target, self.drafter.draft_ids

        @torch.no_grad()
        def logits(sel: slice) -> torch.Tensor:  # (C, V or V_d)
            out = source.logits_from(target, hidden, b_idx[sel], positions[sel])  # (C, V)
            # Over a draft vocabulary: the target's distribution restricted to it (the loss renormalises).
            return out if draft_ids is None else out.index_select(-1, draft_ids.to(out.device))

        return logits

    def block_target_logits(self, inp: StepInputs, source: TargetSource) -> Callable[[slice], torch.Tensor]:
        """The target's logits over its whole vocabulary at the scored slots, by block: a slice of the
        valid anchors (in ``anchor_ok`` order) -> (a, K-1, V). Validation's sampled tau reads them."""
        if inp.label_hidden is None:
            raise ValueError(f"target source {type(source).__name__} gives no target distribution")
        b_idx, anchor_idx, slot = inp.scored.nonzero(as_tuple=True)  # (A*(K-1),) each, block by block
        positions = inp.anchors[b_idx, anchor_idx] + slot
        per_block = self.drafter.config.block_size - 1
        target, hidden = self.target, inp.label_hidden

        @torch.no_grad()
        def logits(sel: slice) -> torch.Tensor:
            rows = slice(sel.start * per_block, sel.stop * per_block)
            out = source.logits_from(target, hidden, b_idx[rows], positions[rows])  # (a*(K-1), V)
            return out.view(-1, per_block, out.shape[-1])

        return logits

    def masks(self, anchors: torch.Tensor, anchor_ok: torch.Tensor, seq_len: int) -> list:
        """One mask per drafter layer (built once per distinct layer rule)."""
        # A mask component that overrides the dense training_mask (an older plugin) is used as is.
        dense_only = type(self.mask).training_mask is not DrafterMask.training_mask
        build = self.mask.training_mask if dense_only else self.mask.training_layout
        k = self.drafter.config.block_size
        built: dict = {}
        for rule in self.drafter.layer_rules():
            if rule not in built:
                built[rule] = build(anchors, anchor_ok, seq_len, k, rule)
        return [built[rule] for rule in self.drafter.layer_rules()]

    def draft_hidden(self, inp: StepInputs) -> torch.Tensor:
        """The drafter's final hidden state for every block slot: (b, N, K, H)."""
        b, n = inp.anchors.shape
        hidden = self.drafter(
            self.target.embed(inp.block_ids), inp.block_pos, masks=inp.masks, taps=inp.features
        )
        return hidden.view(b, n, self.drafter.config.block_size, -1)

    def slot_batch(self, hidden: torch.Tensor, inp: StepInputs, **loss_options) -> SlotBatch:
        """The supervised slots of (b, N, K, H) hidden states, ready for a loss (only they reach the head)."""
        ok = inp.supervised
        slots = torch.arange(hidden.shape[2], device=hidden.device).expand(ok.shape)  # (b, N, K)
        return SlotBatch(
            hidden=hidden[ok],  # (M, H)
            labels=inp.labels[ok],
            slots=slots[ok],
            supervised=ok,
            head=self.draft_logits,
            teacher=inp.teacher,
            **loss_options,
        )

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(.., H) -> (.., V) or (.., V_d): the target's frozen head, over the draft vocabulary if any."""
        return self.drafter.logits(hidden, self.target.lm_head)
