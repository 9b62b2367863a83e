"""The LightningModule: wires the frozen target, the drafter and the chosen components together.

One training step (dflash.md section 2): run the target over the batch (teacher forcing), take the
tapped features and the labels from the target source, sample anchors, build blocks and the mask,
run the drafter, and apply the loss to the supervised slots only.

Notation: b batch, S sequence length, N anchors, K block size, Q = N*K, H hidden, V vocabulary,
M supervised (anchor, slot) pairs.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict

import lightning.pytorch as pl
import torch
from jsonargparse import lazy_instance

from spec_drafters.anchors import AnchorSampler, UniformAnchors, block_labels, build_blocks
from spec_drafters.decoding import DecodeResult, greedy_generate, speculative_generate
from spec_drafters.drafter import DFlashDrafter, DrafterConfig
from spec_drafters.injection import Injection, ZLabTaps
from spec_drafters.losses import DraftLoss, HardCE
from spec_drafters.masks import DFlashBlockMask, DrafterMask
from spec_drafters.metrics import AcceptanceLength, SlotAccuracy
from spec_drafters.registry import as_config, name_of
from spec_drafters.target import FrozenTarget
from spec_drafters.target_source import ModelOutput, TargetSource
from spec_drafters.targets import EmbeddedSmolLM2, TargetLoader
from spec_drafters.verifiers import GreedyChain, Verifier

# The frozen target stays in eval mode on purpose (FrozenTarget.train); Lightning warns about it.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")


class DFlashModule(pl.LightningModule):
    """Trains a DFlash drafter for a frozen target.

    Args:
        target: where the frozen target comes from.
        drafter: the drafter's shape; unset fields follow the target.
        injection: which target layers are tapped and fed to fc.
        target_source: where labels come from.
        loss: the training objective.
        mask: the training attention mask.
        anchors: anchor sampling for training.
        verifier: acceptance rule for the offline and real-decoding metrics.
        val_anchors: anchors per validation sequence (full blocks only, fixed seed).
        lr: peak AdamW learning rate (the released drafters used 6e-4).
        weight_decay: AdamW weight decay.
        warmup_fraction: linear warmup as a fraction of all steps, then cosine decay.
        min_lr_ratio: the cosine decays to lr * min_lr_ratio.
        seed: seeds the anchor draws (step-indexed, so a resumed run draws the same anchors).
    """

    def __init__(
        self,
        target: TargetLoader = lazy_instance(EmbeddedSmolLM2),
        drafter: DrafterConfig = DrafterConfig(),  # noqa: B008 - a dataclass value, copied by resolved()
        injection: Injection = lazy_instance(ZLabTaps),
        target_source: TargetSource = lazy_instance(ModelOutput),
        loss: DraftLoss = lazy_instance(HardCE),
        mask: DrafterMask = lazy_instance(DFlashBlockMask),
        anchors: AnchorSampler = lazy_instance(UniformAnchors),
        verifier: Verifier = lazy_instance(GreedyChain),
        val_anchors: int = 64,
        lr: float = 6e-4,
        weight_decay: float = 0.0,
        warmup_fraction: float = 0.04,
        min_lr_ratio: float = 0.1,
        seed: int = 0,
    ):
        super().__init__()
        with warnings.catch_warnings():
            # The loss may own parameters (CAP); it is saved as part of the state dict *and* as config.
            warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`")
            self.save_hyperparameters()
        # Through LightningCLI the hyperparameters are the parsed config already; built in Python they
        # are objects, which checkpoints loaded with weights_only=True cannot hold. Keep them plain.
        for key, value in list(self.hparams.items()):
            self.hparams[key] = as_config(value)
        loaded = target.load()
        self.tokenizer, self.card = loaded.tokenizer, loaded.card
        num_layers = len(loaded.model.base_model.layers)
        self.fc_ids = injection.fc_ids(num_layers)
        taps = set(injection.tap_ids(num_layers)) | set(target_source.layer_ids(num_layers))
        if not set(self.fc_ids) <= taps:
            raise ValueError(f"--model.injection: fc ids {self.fc_ids} are not all tapped ({sorted(taps)})")
        self.target = FrozenTarget(loaded.model, sorted(taps))
        cfg = drafter.resolved(loaded.model.config, len(self.fc_ids), self.card.mask_token_id)
        self.drafter = DFlashDrafter(cfg)
        self.injection, self.target_source, self.loss_fn = injection, target_source, loss
        self.mask, self.anchors, self.verifier = mask, anchors, verifier
        if val_anchors < 1:
            raise ValueError(f"--model.val_anchors must be >= 1, got {val_anchors}")
        self.val_sampler = UniformAnchors(max_anchors=val_anchors, require_full_block=True)
        self.val_acc = SlotAccuracy(cfg.block_size)
        self.val_tau = AcceptanceLength()
        self.strict_loading = (
            False  # the frozen target is not in checkpoints; on_load_checkpoint checks the drafter
        )

    # --- the shared forward ------------------------------------------------------------------------
    def _step(self, batch: dict[str, torch.Tensor], sampler: AnchorSampler, generator: torch.Generator):
        ids, loss_mask = batch["input_ids"], batch["loss_mask"]  # (b, S)
        b, s = ids.shape
        k = self.drafter.config.block_size
        out = self.target(ids, attention_mask=batch["attention_mask"])
        taps = torch.cat([out.taps[i] for i in self.fc_ids], dim=-1)  # (b, S, n*H)
        labels, label_ok = self.target_source.hard_labels(self.target, out, ids)  # (b, S)
        anchors, anchor_ok = sampler(loss_mask, k, generator)  # (b, N)
        block_ids, block_pos = build_blocks(ids, anchors, k, self.drafter.config.mask_token_id)  # (b, Q)
        slot_labels, slot_ok = block_labels(labels, label_ok, loss_mask, anchors, anchor_ok, k)  # (b, N, K)
        ctx_pos = torch.arange(s, device=ids.device).expand(b, s)  # (b, S)
        mask = self.mask.dense(anchors, anchor_ok, s, k)  # (b, 1, Q, S + Q)
        hidden = self.drafter(
            self.target.embed(block_ids), block_pos, self.drafter.encode_context(taps, ctx_pos), mask
        )
        hidden = hidden.view(b, anchors.shape[1], k, -1)  # (b, N, K, H)
        return hidden, slot_labels, slot_ok, anchor_ok

    def _generator(self, offset: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.hparams.seed * 1_000_003 + offset)

    # --- training ---------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        hidden, labels, ok, _ = self._step(batch, self.anchors, self._generator(self.global_step))
        slots = torch.arange(hidden.shape[2], device=hidden.device).expand(ok.shape)  # (b, N, K)
        logits = self.target.head(hidden[ok])  # (M, V): only supervised slots reach the head
        loss = self.loss_fn(logits, labels[ok], slots[ok])
        acc = (logits.argmax(-1) == labels[ok]).float().mean() if ok.any() else torch.zeros(())
        bsz = batch["input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bsz)
        self.log("train/acc", acc, prog_bar=True, batch_size=bsz)
        self.log("train/supervised_slots", float(ok.sum()), batch_size=bsz)
        return loss

    # --- validation (teacher-forced) --------------------------------------------------------------
    def validation_step(self, batch, batch_idx):
        hidden, labels, ok, anchor_ok = self._step(
            batch, self.val_sampler, self._generator(10**9 + batch_idx)
        )
        b, n, k, _ = hidden.shape
        slots = torch.arange(k, device=hidden.device).expand(ok.shape)
        logits = self.target.head(hidden[ok])  # (M, V)
        loss = self.loss_fn(logits, labels[ok], slots[ok])
        # Full blocks only: every valid anchor has all K-1 slots supervised, so reshape per block.
        draft = torch.zeros((b, n, k), dtype=torch.long, device=hidden.device)
        draft[ok] = logits.argmax(-1)
        hit = (draft == labels) & ok  # (b, N, K)
        self.val_acc.update(hit[:, :, 1:].reshape(-1, k - 1), ok[:, :, 1:].reshape(-1, k - 1))
        accepted = hit[:, :, 1:].long().cumprod(dim=2).sum(dim=2)  # (b, N): the greedy chain
        self.val_tau.update(accepted, anchor_ok)
        self.log("val/loss", loss, prog_bar=True, batch_size=b)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        for i, a in enumerate(acc.tolist(), start=1):
            self.log(f"val/acc_slot{i}", a)
        self.log("val/acc", acc.mean().item(), prog_bar=True)
        for key, value in self.val_tau.compute().items():
            self.log(f"val/{key}", value.item(), prog_bar=key == "tau")
        self.val_acc.reset()
        self.val_tau.reset()

    # --- real decoding ----------------------------------------------------------------------------
    def greedy(self, prompt: list[int], max_new_tokens: int) -> DecodeResult:
        return greedy_generate(self.target, prompt, max_new_tokens, self.card.eos_token_ids)

    def speculate(self, prompt: list[int], max_new_tokens: int) -> DecodeResult:
        return speculative_generate(
            self.target,
            self.drafter,
            self.fc_ids,
            self.verifier,
            prompt,
            max_new_tokens,
            self.card.eos_token_ids,
        )

    # --- optimisation -----------------------------------------------------------------------------
    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(
            self.drafter.parameters(), lr=hp.lr, weight_decay=hp.weight_decay, betas=(0.9, 0.95)
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = max(1, int(total * hp.warmup_fraction))

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # --- checkpoints --------------------------------------------------------------------------------
    def describe(self) -> dict:
        """What this drafter is, in plain types: stored in every checkpoint."""
        return {
            "target": {
                "name": self.card.name,
                "num_layers": self.target.num_layers,
                "tap_ids": self.target.tap_ids,
            },
            "fc_ids": self.fc_ids,
            "drafter": asdict(self.drafter.config),
            "components": {
                "injection": name_of(self.injection),
                "target_source": name_of(self.target_source),
                "loss": name_of(self.loss_fn),
                "mask": name_of(self.mask),
                "anchors": name_of(self.anchors),
                "verifier": name_of(self.verifier),
                "attention": self.drafter.config.attention,
            },
        }

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["state_dict"]
        for key in [k for k in state if k.startswith("target.")]:
            del state[key]  # the frozen target is loaded from its source, never copied into checkpoints
        checkpoint["spec_drafters"] = self.describe()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["state_dict"]
        missing = [f"drafter.{k}" for k in self.drafter.state_dict() if f"drafter.{k}" not in state]
        if missing:
            raise KeyError(f"checkpoint lacks drafter weights {missing[:5]} (of {len(missing)} missing)")
        saved = checkpoint.get("spec_drafters", {}).get("target", {}).get("name")
        if saved and saved != self.card.name:
            raise ValueError(
                f"checkpoint was trained for target {saved!r}, this config loads {self.card.name!r}"
            )
