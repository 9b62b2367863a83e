"""The LightningModule: wires the frozen target, the drafter and the chosen components together.

The step itself is plain torch (train/pipeline.py: target features, noise, anchors, blocks, labels,
masks; docs/method.md); this class keeps the wiring, logging, sharding, optimisation and checkpoint
hooks.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import replace
from pathlib import Path

import lightning.pytorch as pl
import torch
from jsonargparse import lazy_instance
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from spec_drafters.artefacts.folders import describe_drafter
from spec_drafters.artefacts.init_from import load_folder_into
from spec_drafters.decode.generate import DecodeResult, greedy_generate, speculative_generate
from spec_drafters.decode.verifiers import GreedyChain, Verifier
from spec_drafters.errors import ArgumentError, argument
from spec_drafters.lightning.metrics import OfflineAcceptance
from spec_drafters.lightning.schedule import WarmupCosine, default_optimizer
from spec_drafters.lightning.sharding import receive_target, shard_fsdp2, target_tensors
from spec_drafters.lightning.tracking import log_validation
from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
from spec_drafters.model.masks import DFlashBlockMask, DrafterMask
from spec_drafters.model.vocab import DraftVocab, FullVocab, draft_vocab_ids
from spec_drafters.registry import as_config, name_of
from spec_drafters.target.features import FeatureSpec, plan_taps
from spec_drafters.target.frozen import FrozenTarget
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
    optimizer_problems,
)
from spec_drafters.train.pipeline import StepBuilder, StepInputs

#: The components a checkpoint names: its key -> the module's attribute.
COMPONENTS = {k: k for k in ("injection", "target_source", "val_target_source", "noise", "mask")}
COMPONENTS |= {"loss": "loss_fn", "anchors": "anchors", "verifier": "verifier", "draft_vocab": "draft_vocab"}

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
        # Defaults hold no choices a switched class_path could inherit (jsonargparse issue #460; a
        # ZLabTaps(num_taps=5) default once leaked into every YAML AllTaps): docs/components.md, Plugins.
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
        for name, problem in optimizer_problems(lr, weight_decay, warmup_fraction, min_lr_ratio):
            raise ArgumentError(name, problem)  # before the target loads: one line naming the flag
        # Hyperparameters as plain {class_path, init_args} dicts (weights_only checkpoints hold plain
        # types only). A chosen optimizer or scheduler is a callable: the run's config.yaml keeps it.
        args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        args["optimizer"] = args["lr_scheduler"] = None
        self.save_hyperparameters({key: as_config(value) for key, value in args.items()})
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.injection, self.verifier, self.draft_vocab = injection, verifier, draft_vocab
        self.target_source, self.val_target_source = target_source, val_target_source
        self.noise, self.loss_fn, self.mask, self.anchors = noise, loss, mask, anchors
        # A process Lightning (or torchrun) started for another device of this node: LOCAL_RANK > 0.
        self._target_deferred = load_target_once and int(os.environ.get("LOCAL_RANK", "0")) > 0
        self._wire_target(target)
        self._wire_drafter(drafter, init_from)
        if val_anchors < 1:
            raise ArgumentError("val_anchors", f"must be >= 1, got {val_anchors}")
        if loss_chunk_rows is not None and loss_chunk_rows < 1:
            raise ArgumentError("loss_chunk_rows", f"must be >= 1 or null, got {loss_chunk_rows}")
        self.loss_chunk_rows = loss_chunk_rows
        self.drafter.checkpoint_layers = activation_checkpointing
        self.steps = StepBuilder(self.target, self.drafter, self.fc_ids, noise, mask, loss.needs_distribution)
        self.val_sampler = UniformAnchors(max_anchors=val_anchors, require_full_block=True)
        k = self.drafter.config.block_size
        with argument("eval_verifiers"):
            self.offline = OfflineAcceptance.for_verifiers(k, verifier, eval_verifiers)
        if self.offline.needs_distribution and not self.val_target_source.has_distribution:
            raise ArgumentError(
                "val_target_source",
                f"a sampling chain's offline tau needs the target's distribution, which "
                f"{name_of(self.val_target_source)} does not have (use a logit-based label source)",
            )
        self.calibration: dict = {}  # the last validation's table, for --results and calibration.json
        # The frozen target is not in checkpoints; on_load_checkpoint checks the drafter.
        self.strict_loading = False
        self._step_parts: list[dict] = []  # the loss terms of the micro-batches of the coming step

    def _wire_target(self, target: TargetLoader) -> None:
        """Loads the target and checks that the chosen components fit it and each other."""
        with argument("target"):
            loaded = target.structure() if self._target_deferred else target.load()
        self.tokenizer, self.card = loaded.tokenizer, loaded.card
        self.vocab_size = loaded.model.get_output_embeddings().weight.shape[0]
        sources = {"target_source": self.target_source, "val_target_source": self.val_target_source}
        self.fc_ids, taps = plan_taps(self.card, self.vocab_size, self.injection, sources, self.loss_fn)
        self.target = FrozenTarget(loaded.model, taps)

    def _wire_drafter(self, drafter: DrafterConfig, init_from: str | None) -> None:
        """Builds the drafter for the target (on the meta device when the target is) and its weights."""
        with argument("mask"):
            rules = self.mask.per_layer(drafter.num_layers)
        with argument("drafter"):
            cfg = drafter.resolved(self.target.model.config, len(self.fc_ids), self.card.mask_token_id, rules)
        with argument("draft_vocab"):  # a frequent_tokens without its counts file: the folder's ids
            draft_ids = draft_vocab_ids(self.draft_vocab, self.vocab_size, init_from)
        if draft_ids is not None:
            cfg = replace(cfg, draft_vocab_size=len(draft_ids))
        # a config check (no weights anywhere), not a rank waiting for the target's weights
        on_meta = self.target.embed_tokens.weight.is_meta and not self._target_deferred
        with torch.device("meta") if on_meta else contextlib.nullcontext():
            self.drafter = DFlashDrafter(cfg)
            self.loss_fn.bind(cfg.hidden_size)
        if draft_ids is not None and not on_meta:
            self.drafter.draft_ids.copy_(draft_ids)
        if init_from is not None:
            with argument("init_from"):
                head = getattr(self.loss_fn, "head", None)
                load_folder_into(init_from, self.drafter, self.fc_ids, self.card, head)

    def _step_seed(self, offset: int) -> int:
        return self.hparams.seed * 1_000_003 + offset

    def _rows(self, batch) -> range:
        """This rank's rows of the global batch (the per-sequence seeds of the step's draws)."""
        b = batch["input_ids"].shape[0]
        return range(self.global_rank * b, (self.global_rank + 1) * b)

    def _slot_batch(self, hidden, inp: StepInputs) -> SlotBatch:
        data_parallel = self._trainer is not None and self._trainer.world_size > 1
        return self.steps.slot_batch(
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
        inp = self.steps(batch, self.anchors, self.target_source, seed, rows, noisy=True)
        sb = self._slot_batch(self.steps.draft_hidden(inp), inp)
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
        samples, else None). Full blocks only; labels outside a draft vocabulary (-1) count as misses:
        the drafter cannot propose them."""
        seed = self._step_seed(10**9 + batch_idx)
        inp = self.steps(
            batch, self.val_sampler, self.val_target_source, seed, self._rows(batch), noisy=False
        )
        hidden = self.steps.draft_hidden(inp)
        k = hidden.shape[2]
        sb = self._slot_batch(hidden, inp)
        parts = self.loss_fn(sb)
        ok = inp.scored
        logits = (
            sb.logits if torch.equal(ok, inp.supervised) else self.steps.draft_logits(hidden[ok])
        )  # (M, V)
        per_block = logits.view(-1, k - 1, logits.shape[-1])  # the valid anchors in order
        target_logits = None
        if self.offline.needs_distribution:  # a sampling chain's tau reads the target's distribution
            target_logits = self.steps.block_target_logits(inp, self.val_target_source)
        return parts, per_block, inp.labels[ok].view(-1, k - 1), inp.anchor_ok, target_logits

    def on_validation_epoch_end(self) -> None:
        metrics, curves, self.calibration = self.offline.compute()
        for key, value in metrics.items():
            self.log(f"val/{key}", value, prog_bar=key in ("tau", "acc"))
        if self._trainer is not None and not self._trainer.sanity_checking:
            slots = [v for key, v in metrics.items() if key.startswith("acc_slot")]
            log_validation(self._trainer, slots, curves, self.calibration)

    def feature_spec(self) -> FeatureSpec:
        """The target side of this run: what computes the fc input and labels, and what identifies them."""
        identity = {
            "target": self.card.name,
            "label_source": name_of(self.target_source),
            "label_layers": self.target_source.layer_ids(self.card),
            "tokenizer": self.tokenizer.identity(),
        }
        soft = self.loss_fn.needs_distribution
        return FeatureSpec(self.target, self.fc_ids, self.target_source, soft, self.tokenizer, identity)

    # --- real decoding ----------------------------------------------------------------------------
    def greedy(self, prompt: list[int], max_new_tokens: int) -> DecodeResult:
        return greedy_generate(self.target, prompt, max_new_tokens, self.card.eos_token_ids)

    def speculate(
        self, prompt: list[int], max_new_tokens: int, verifier: Verifier | None = None
    ) -> DecodeResult:
        """Speculative decoding with this drafter and ``verifier`` (default: the configured one)."""
        verifier, eos = verifier or self.verifier, self.card.eos_token_ids
        return speculative_generate(
            self.target, self.drafter, self.fc_ids, verifier, prompt, max_new_tokens, eos
        )

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
        """What this drafter is, in plain types: stored in every checkpoint (artefacts/folders.py)."""
        names = {key: name_of(getattr(self, attr)) for key, attr in COMPONENTS.items()}
        return describe_drafter(self.card.name, self.target, self.fc_ids, self.drafter.config, names)

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
        state = checkpoint.get("state_dict")
        trained = [k for k in self.state_dict() if not k.startswith("target.")]  # drafter + aux heads
        missing = [k for k in trained if k not in state] if state is not None else []
        if missing:
            raise KeyError(f"checkpoint lacks drafter weights {missing[:5]} (of {len(missing)} missing)")
        saved = checkpoint.get("spec_drafters", {}).get("target", {}).get("name")
        if saved and saved != self.card.name:
            raise ValueError(
                f"checkpoint was trained for target {saved!r}, this config loads {self.card.name!r}"
            )
