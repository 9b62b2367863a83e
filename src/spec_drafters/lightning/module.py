"""The LightningModule: wires the frozen target, the drafter and the chosen components together.

The step itself is plain torch (train/pipeline.py: target features, noise, anchors, blocks, labels,
masks; docs/method.md); this class keeps the wiring, logging, sharding, optimisation and checkpoint
hooks.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from jsonargparse import lazy_instance
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from spec_drafters.artefacts.setup import COMPONENTS, DrafterSetup
from spec_drafters.decode.generate import DecodeResult
from spec_drafters.decode.verifiers import GreedyChain, Verifier
from spec_drafters.errors import ArgumentError, argument
from spec_drafters.lightning.metrics import OfflineAcceptance
from spec_drafters.lightning.schedule import WarmupCosine, default_optimizer
from spec_drafters.lightning.sharding import receive_target, shard_fsdp2, target_tensors
from spec_drafters.lightning.tracking import log_validation
from spec_drafters.model.drafter import DrafterConfig
from spec_drafters.model.masks import DFlashBlockMask, DrafterMask
from spec_drafters.model.vocab import DraftVocab, FullVocab
from spec_drafters.registry import name_of
from spec_drafters.rng import derived_seed
from spec_drafters.target.features import FeatureSpec
from spec_drafters.target.injection import AllTaps, Injection
from spec_drafters.target.labels import ModelOutput, TargetSource
from spec_drafters.target.loaders import EmbeddedSmolLM2, TargetLoader
from spec_drafters.train.anchors import AnchorSampler, UniformAnchors
from spec_drafters.train.losses import DraftLoss, HardCE, SlotBatch
from spec_drafters.train.noise import FeatureNoise, NoNoise
from spec_drafters.train.objective import (
    Diverged,
    all_finite,
    divergence_message,
    first_nonfinite,
    learning_rates_problem,
    named_tensors,
)
from spec_drafters.train.pipeline import StepInputs

# The frozen target stays in eval mode on purpose (FrozenTarget.train); Lightning warns about it.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")


class DFlashModule(pl.LightningModule):
    """Trains a DFlash drafter for a frozen target.

    Args:
        target: where the frozen target comes from.
        drafter: the drafter's shape; unset fields follow the target.
        injection: which target layers are tapped and fed to fc (default: the target card's default
            taps, all into fc).
        target_source: where training labels come from.
        val_target_source: where validation labels come from: by default the target's real output,
            which is what a verifier accepts, whatever the training labels were (a drafter trained on
            layer-61 labels and validated on them looks better than it serves).
        noise: perturbation of the fc input during training (never of the labels).
        loss: the training objective.
        mask: the training attention mask.
        anchors: anchor sampling for training.
        verifier: acceptance rule for the offline and real-decoding metrics.
        draft_vocab: the target tokens the drafter may propose (default: all; model/vocab.py).
        eval_verifiers: more verifiers measured offline in validation (e.g. DDTree at several budgets).
        init_from: a drafter folder (any layout: ours, z-lab's, speculators') whose weights start this
            drafter; its fc layers and shape must be this config's (e.g. to validate a reference drafter).
        val_anchors: anchors per validation sequence (full blocks only, fixed seed).
        loss_chunk_rows: apply the frozen head and the loss to this many supervised slots at a time,
            recomputed in backward, so the (M, V) logits never exist at once (null: all at once).
        activation_checkpointing: recompute each drafter layer in backward instead of keeping its
            activations (less memory, about one more forward of time).
        shard_target: under FSDP2 (``ModelParallelStrategy``), also shard the frozen target's decoder
            layers over the ranks (its embedding, final norm and head stay whole on every rank, since
            the drafter reads them outside the target's forward). Default: replicate the target.
        load_target_once: only the first process of each node loads the target's weights; the others
            build it on the meta device and receive each tensor from global rank 0 after sharding
            (their share of it with ``shard_target``), so a node's host memory holds one copy at
            start-up, not one per GPU (lightning/sharding.py). Under FSDP2 only.
        lr: peak learning rate of the default optimizer (the released drafters used 6e-4); > 0.
        weight_decay: weight decay of the default optimizer; >= 0.
        warmup_fraction: the default schedule's linear warmup, as a fraction of all steps (0..1).
        min_lr_ratio: the default schedule's cosine decays to lr * min_lr_ratio (0..1).
        seed: seeds the anchor draws (step-indexed, so a resumed run draws the same anchors).
        optimizer: any optimizer, chosen in YAML (``class_path: torch.optim.SGD`` with its
            ``init_args``; ``MuonWithAdamW`` for Muon); default AdamW(lr, weight_decay,
            betas (0.9, 0.95)) over the trained parameters.
        lr_scheduler: any scheduler, chosen in YAML and stepped every optimizer step; default
            :class:`~spec_drafters.lightning.schedule.WarmupCosine` over the run's steps.
    """

    def __init__(
        self,
        target: TargetLoader = lazy_instance(EmbeddedSmolLM2),
        drafter: DrafterConfig = DrafterConfig(),  # noqa: B008 - a dataclass value, copied by resolved()
        # Defaults hold no choices a switched class_path could inherit (jsonargparse issue #460; a z-lab
        # 5-tap default, ZLabTaps(num_taps=5), once leaked into every YAML AllTaps): docs/components.md.
        injection: Injection = lazy_instance(AllTaps),
        target_source: TargetSource = lazy_instance(ModelOutput),
        val_target_source: TargetSource = lazy_instance(ModelOutput),
        noise: FeatureNoise = lazy_instance(NoNoise),
        loss: DraftLoss = lazy_instance(HardCE),
        mask: DrafterMask = lazy_instance(DFlashBlockMask),
        anchors: AnchorSampler = lazy_instance(UniformAnchors),
        verifier: Verifier = lazy_instance(GreedyChain),
        eval_verifiers: list[Verifier] | None = None,
        draft_vocab: DraftVocab = lazy_instance(FullVocab),
        init_from: str | None = None,
        val_anchors: int = 64,
        loss_chunk_rows: int | None = None,
        activation_checkpointing: bool = False,
        shard_target: bool = False,
        load_target_once: bool = False,
        lr: float = 6e-4,
        weight_decay: float = 0.0,
        warmup_fraction: float = 0.04,
        min_lr_ratio: float = 0.1,
        seed: int = 0,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
    ):
        super().__init__()
        args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        # A process Lightning (or torchrun) started for another device of this node: LOCAL_RANK > 0.
        deferred = load_target_once and int(os.environ.get("LOCAL_RANK", "0")) > 0
        self.built = DrafterSetup.build(args, structure_only=deferred)  # checks the arguments first
        self.save_hyperparameters(self.built.settings)
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        # The parts under the names Lightning, the checkpoints (their weights' prefixes) and callbacks use.
        self.target, self.drafter = self.built.target, self.built.drafter
        for attr in COMPONENTS.values():
            setattr(self, attr, getattr(self.built, attr))
        self.loss_chunk_rows = loss_chunk_rows
        self.step_builder = self.built.step_builder()
        k = self.drafter.config.block_size
        with argument("eval_verifiers"):
            self.offline = OfflineAcceptance.for_verifiers(k, verifier, eval_verifiers)
        if self.offline.needs_distribution and not val_target_source.has_distribution:
            raise ArgumentError(
                "val_target_source",
                f"a sampling chain's offline tau needs the target's distribution, which "
                f"{name_of(val_target_source)} does not have (use a logit-based target source)",
            )
        self.calibration: dict = {}  # the last validation's table, for --results and calibration.json
        # The frozen target is not in checkpoints; on_load_checkpoint checks the drafter.
        self.strict_loading = False
        self._step_parts: list[dict] = []  # the loss terms of the micro-batches of the coming step

    # The setup's parts that are not modules, read where the module is at hand (callbacks, tests).
    card = property(lambda self: self.built.card)
    tokenizer = property(lambda self: self.built.tokenizer)
    fc_ids = property(lambda self: self.built.fc_ids)
    vocab_size = property(lambda self: self.built.vocab_size)

    def _step_seed(self, offset: int) -> int:
        return derived_seed(self.hparams.seed, offset)

    def _rows(self, batch) -> range:
        """This rank's rows of the global batch (the per-sequence seeds of the step's draws)."""
        b = batch["input_ids"].shape[0]
        return range(self.global_rank * b, (self.global_rank + 1) * b)

    def _slot_batch(self, hidden, inp: StepInputs) -> SlotBatch:
        data_parallel = self._trainer is not None and self._trainer.world_size > 1
        return self.step_builder.slot_batch(
            hidden,
            inp,
            chunk_rows=self.loss_chunk_rows if self.training else None,
            denominator=self._mean_over_ranks if data_parallel else None,
        )

    def _mean_over_ranks(self, local: torch.Tensor) -> torch.Tensor:
        """The mean over data-parallel ranks of a per-rank normaliser (no gradient flows through it)."""
        return self.trainer.strategy.reduce(local.detach().clone(), reduce_op="mean")

    # --- training ---------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        seed, rows = self._step_seed(self.global_step), self._rows(batch)
        inp = self.step_builder(batch, self.anchor_sampler, self.target_source, seed, rows, noisy=True)
        sb = self._slot_batch(self.step_builder.draft_hidden(inp), inp)
        parts = self.loss_fn(sb)
        self._step_parts.append({k: v.detach() for k, v in parts.items()})  # checked before the step
        acc = (sb.argmax() == sb.labels).float().mean() if not sb.empty else torch.zeros(())
        bsz = batch["input_ids"].shape[0]
        # sync_dist: with data parallelism each rank's loss is its share of the global-batch loss
        # (see SlotBatch.denominator), so the mean over ranks is the loss of the whole batch.
        self.log("train/loss", parts["loss"], prog_bar=True, batch_size=bsz, sync_dist=True)
        for key, value in parts.items():
            if key != "loss":
                self.log(f"train/{key}", value, batch_size=bsz)
        self.log("train/acc", acc, prog_bar=True, batch_size=bsz)
        self.log("train/supervised_slots", float(inp.supervised.sum()), batch_size=bsz)
        return parts["loss"]

    # --- validation (teacher-forced) --------------------------------------------------------------
    def validation_step(self, batch, batch_idx):
        parts, per_block, labels, anchor_ok, target_logits = self.held_out_blocks(batch, batch_idx)
        self.offline.update(per_block, labels, anchor_ok, target_logits, self.drafter.draft_ids)
        b = batch["input_ids"].shape[0]
        self.log("val/loss", parts["loss"], prog_bar=True, batch_size=b)
        for key, value in parts.items():
            if key != "loss":
                self.log(f"val/{key}", value, batch_size=b)

    def held_out_blocks(self, batch, batch_idx: int):
        """Validation's blocks of a batch: (loss parts, drafter logits (A, K-1, V) of the A valid
        anchors, their labels (A, K-1), anchor_ok (b, N), the target's logits by block when a verifier
        samples, else None); artefacts/setup.py, DrafterSetup.held_out_inputs and scored_blocks."""
        inp = self.built.held_out_inputs(batch, batch_idx, self._rows(batch))
        hidden = self.step_builder.draft_hidden(inp)
        sb = self._slot_batch(hidden, inp)
        parts = self.loss_fn(sb)
        per_block, labels = self.built.scored_blocks(inp, hidden, sb)
        target_logits = None
        if self.offline.needs_distribution:  # a sampling chain's tau reads the target's distribution
            target_logits = self.step_builder.block_target_logits(inp, self.val_target_source)
        return parts, per_block, labels, inp.anchor_ok, target_logits

    def on_validation_epoch_end(self) -> None:
        metrics, curves, self.calibration = self.offline.compute()
        for key, value in metrics.items():
            self.log(f"val/{key}", value, prog_bar=key in ("tau", "acc"))
        if self._trainer is not None and not self._trainer.sanity_checking:
            slots = [v for key, v in metrics.items() if key.startswith("acc_slot")]
            log_validation(self._trainer, slots, curves, self.calibration)

    def feature_spec(self) -> FeatureSpec:
        return self.built.feature_spec()

    # --- real decoding ----------------------------------------------------------------------------
    def greedy(self, prompt: list[int], max_new_tokens: int) -> DecodeResult:
        return self.built.greedy(prompt, max_new_tokens)

    def speculate(
        self, prompt: list[int], max_new_tokens: int, verifier: Verifier | None = None
    ) -> DecodeResult:
        return self.built.speculate(prompt, max_new_tokens, verifier)

    # --- sharding ---------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """FSDP2 under Lightning's ``ModelParallelStrategy`` (sharding.py); nothing without a mesh."""
        if self.device_mesh is not None and not getattr(self, "_sharded", False):
            once = self.hparams.get("load_target_once", False)
            source = target_tensors(self.target.model) if once else None
            shard_fsdp2(self.drafter, self.loss_fn, self.target, self.device_mesh, self.hparams.shard_target)
            if source is not None:
                receive_target(self.target.model, source, self.trainer.strategy.root_device)
            self._sharded = True

    # --- optimisation -----------------------------------------------------------------------------
    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]  # drafter + auxiliary heads
        with argument("optimizer"):  # a chosen optimizer's own refusal (torch: "Invalid learning rate")
            if self.optimizer is not None:
                opt = self.optimizer(params)
            else:
                opt = default_optimizer(params, hp.lr, hp.weight_decay)
            problem = learning_rates_problem([float(g["lr"]) for g in opt.param_groups])
            if problem:
                raise ValueError(problem)
        if self.lr_scheduler is not None:
            sched = self.lr_scheduler(opt)
        else:
            total = max(1, int(self.trainer.estimated_stepping_batches))
            sched = WarmupCosine(opt, total, hp.warmup_fraction, hp.min_lr_ratio)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # --- the finite guard ---------------------------------------------------------------------------
    # A run that diverges stops at once, saying where, and never writes a non-finite checkpoint. In
    # the module rather than a callback, so that it is on for every run (a config's trainer.callbacks
    # list replaces the defaults; Trainer.fit from Python gets it too), and because its two hooks run
    # where nothing can have saved the weights yet: on_before_optimizer_step after backward and
    # before the step (a NaN loss or gradient is never applied, so the weights in memory stay
    # finite), and on_save_checkpoint before any file is written (ModelCheckpoint's last.ckpt
    # included), for a step that overflowed the weights from finite gradients. One flag reduced over
    # the ranks per check, so that under DDP or FSDP2 every rank stops at the same step.

    def on_before_optimizer_step(self, optimizer) -> None:
        parts, self._step_parts = self._step_parts, []  # every micro-batch since the last step
        named = [(f"train/{key}", value) for terms in parts for key, value in terms.items()]
        if getattr(self.trainer.precision_plugin, "scaler", None) is None:
            # fp16's GradScaler skips a step on inf gradients by design (and lowers its scale).
            named += [(f"gradient of {n}", p.grad) for n, p in self.named_parameters() if p.grad is not None]
        self._last_terms = parts[-1] if parts else {}
        self._stop_unless_finite(named, "the step was not taken")

    def _stop_unless_finite(self, named: list[tuple[str, torch.Tensor]], outcome: str) -> None:
        ok = all_finite([t for _, t in named])
        failed = (~ok).float()
        if self._trainer is not None:  # summed over the ranks: every rank stops at the same step
            strategy = self.trainer.strategy
            failed = strategy.reduce(failed.to(strategy.root_device), reduce_op="sum")
        if float(failed) == 0:
            return
        bad = first_nonfinite(named)  # empty on a rank whose own values are finite
        where = f"step {self.global_step}"
        if self._trainer is not None and self.trainer.world_size > 1:
            where += f" (rank {self.global_rank})" if bad else " (on another rank)"
        terms = {f"train/{k}": float(v) for k, v in getattr(self, "_last_terms", {}).items()}
        raise Diverged(divergence_message(f"{where}, {outcome}", bad, terms, self._last_checkpoint()))

    def _last_checkpoint(self) -> str | None:
        """The newest checkpoint file this run's checkpoint callbacks wrote (all finite: see above)."""
        if self._trainer is None:
            return None
        paths = {
            getattr(cb, attr, "")
            for cb in self.trainer.checkpoint_callbacks
            for attr in ("last_model_path", "best_model_path")
        }
        files = [Path(p) for p in paths if p and Path(p).exists()]
        return str(max(files, key=lambda f: f.stat().st_mtime)) if files else None

    # --- checkpoints --------------------------------------------------------------------------------
    def describe(self) -> dict:
        return self.built.describe()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["state_dict"]
        for key in [k for k in state if k.startswith("target.")]:
            del state[key]  # the frozen target is loaded from its source, never copied into checkpoints
        named = [*state.items(), *named_tensors("optimizer", checkpoint.get("optimizer_states", []))]
        self._stop_unless_finite(named, "no checkpoint written")
        checkpoint["spec_drafters"] = self.describe()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # ModelParallelStrategy (FSDP2) loads the weights into the sharded module itself and hands
        # this hook the rest of the checkpoint; then its loader has already checked the keys.
        self.built.check_checkpoint(checkpoint, checkpoint.get("state_dict"))
