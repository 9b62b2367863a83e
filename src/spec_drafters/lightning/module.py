"""The LightningModule: wires the frozen target, the drafter and the chosen components together.

One training step (docs/method.md section 2): run the target over the batch (teacher forcing), take the
tapped features and the labels from the target source, sample anchors, build blocks and the mask,
run the drafter, and apply the loss to the supervised slots only.

Notation: b batch, S sequence length, N anchors, K block size, Q = N*K, H hidden, V vocabulary,
M supervised (anchor, slot) pairs.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import lightning.pytorch as pl
import torch
from jsonargparse import lazy_instance
from torch import nn

from spec_drafters.decode.generate import DecodeResult, greedy_generate, speculative_generate
from spec_drafters.decode.verifiers import GreedyChain, Verifier
from spec_drafters.lightning.metrics import AcceptanceCurve, AcceptanceLength, Calibration, SlotAccuracy
from spec_drafters.lightning.tracking import log_acceptance_figure
from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
from spec_drafters.model.masks import DFlashBlockMask, DrafterMask
from spec_drafters.model.vocab import DraftVocab, FullVocab
from spec_drafters.registry import as_config, name_of
from spec_drafters.target.frozen import FrozenTarget
from spec_drafters.target.injection import AllTaps, Injection
from spec_drafters.target.labels import ModelOutput, TargetSource
from spec_drafters.target.loaders import EmbeddedSmolLM2, MaskTokenError, TargetLoader
from spec_drafters.train.anchors import AnchorSampler, UniformAnchors, block_labels, build_blocks
from spec_drafters.train.losses import DraftLoss, HardCE, SlotBatch
from spec_drafters.train.noise import FeatureNoise, NoNoise

# The frozen target stays in eval mode on purpose (FrozenTarget.train); Lightning warns about it.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")


def _row_seed(seed: int, row: int) -> int:
    """The seed of one sequence's draws: its step seed and its row in the global batch."""
    return seed * 1_000_003 + row


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
        draft_vocab: the target tokens the drafter may propose (default: all; vocab.py).
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
        # A config that switches a component's class_path keeps the default's init_args that the new
        # class also accepts (jsonargparse issue #460): a default of ZLabTaps(num_taps=5) turned every
        # YAML AllTaps/AllButLast into z-lab's 5-tap formula, never the card's taps. So each default
        # holds nothing a switched class could read as a choice: no init_args, init_args that are all
        # None ("unset" in every tap-list strategy), or values equal to every built-in class's default
        # of the same name (tests/test_component_defaults.py parses every class of every kind from
        # YAML). A plugin that reuses such a name (gamma, dtype, max_anchors) must keep that default.
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
        lr: float = 6e-4,
        weight_decay: float = 0.0,
        warmup_fraction: float = 0.04,
        min_lr_ratio: float = 0.1,
        seed: int = 0,
    ):
        super().__init__()
        # Hyperparameters are stored as plain {class_path, init_args} dicts: components built in Python
        # are objects (some of them jsonargparse lazy instances, which cannot be deep-copied), and
        # checkpoints loaded with weights_only=True can hold only plain types.
        args = dict(locals())
        del args["self"], args["__class__"]
        self.save_hyperparameters({key: as_config(value) for key, value in args.items()})
        loaded = target.load()
        self.tokenizer, self.card = loaded.tokenizer, loaded.card
        vocab = loaded.model.get_output_embeddings().weight.shape[0]
        if not 0 <= self.card.mask_token_id < vocab:
            raise MaskTokenError(
                f"--model.target: mask token id {self.card.mask_token_id} is outside the target's "
                f"vocabulary 0..{vocab - 1}"
            )
        self.fc_ids = injection.fc_ids(self.card)
        taps = set(injection.tap_ids(self.card)) | set(target_source.layer_ids(self.card))
        taps |= set(val_target_source.layer_ids(self.card))
        if not set(self.fc_ids) <= taps:
            raise ValueError(f"--model.injection: fc ids {self.fc_ids} are not all tapped ({sorted(taps)})")
        for flag, source in (("target_source", target_source), ("val_target_source", val_target_source)):
            if loss.needs_distribution and not source.has_distribution:
                raise ValueError(
                    f"--model.loss {name_of(loss)} needs the target's distribution, which "
                    f"--model.{flag} {name_of(source)} does not have"
                )
        self.target = FrozenTarget(loaded.model, sorted(taps))
        cfg = drafter.resolved(
            loaded.model.config, len(self.fc_ids), self.card.mask_token_id, mask.per_layer(drafter.num_layers)
        )
        draft_ids = draft_vocab.token_ids(vocab)
        if draft_ids is not None:
            cfg = replace(cfg, draft_vocab_size=len(draft_ids))
        # A target built on the meta device (a config check, no weights) gets a meta drafter too.
        on_meta = next(loaded.model.parameters()).is_meta
        with torch.device("meta") if on_meta else contextlib.nullcontext():
            self.drafter = DFlashDrafter(cfg)
            loss.bind(cfg.hidden_size)
        if draft_ids is not None and not on_meta:
            self.drafter.draft_ids.copy_(draft_ids)
        self.draft_vocab = draft_vocab
        self.injection, self.target_source, self.noise, self.loss_fn = injection, target_source, noise, loss
        if init_from is not None:
            self._load_folder(init_from)
        self.val_target_source = val_target_source
        self.mask, self.anchors, self.verifier = mask, anchors, verifier
        if val_anchors < 1:
            raise ValueError(f"--model.val_anchors must be >= 1, got {val_anchors}")
        if loss_chunk_rows is not None and loss_chunk_rows < 1:
            raise ValueError(f"--model.loss_chunk_rows must be >= 1 or null, got {loss_chunk_rows}")
        self.loss_chunk_rows = loss_chunk_rows
        self.drafter.checkpoint_layers = activation_checkpointing
        self.val_sampler = UniformAnchors(max_anchors=val_anchors, require_full_block=True)
        self.val_acc = SlotAccuracy(cfg.block_size)
        # Offline acceptance per verifier: the greedy chain always (val/tau), the configured verifier
        # (val/tau_<name>) and the extra ones (val/tau_<name>_b<budget>).
        self.offline_verifiers: dict[str, Verifier] = {"chain": GreedyChain()}
        if not isinstance(verifier, GreedyChain):
            self.offline_verifiers[name_of(verifier)] = verifier
        for v in eval_verifiers or []:
            label = name_of(v) + (f"_b{v.budget}" if hasattr(v, "budget") else "")
            if label in self.offline_verifiers:
                label = f"{label}_{len(self.offline_verifiers)}"
            self.offline_verifiers[label] = v
        depth = cfg.block_size - 1
        self.val_tau = nn.ModuleDict({k: AcceptanceLength() for k in self.offline_verifiers})
        self.val_curve = nn.ModuleDict({k: AcceptanceCurve(depth) for k in self.offline_verifiers})
        self.val_calibration = Calibration(depth, ranks=4)
        self.calibration: dict = {}  # the last validation's table, for --results and calibration.json
        self.strict_loading = (
            False  # the frozen target is not in checkpoints; on_load_checkpoint checks the drafter
        )

    def _load_folder(self, path: str) -> None:
        from spec_drafters.artefacts.folders import read_folder
        from spec_drafters.errors import InputError

        try:
            folder = read_folder(path, num_target_layers=self.target.num_layers)
        except InputError as e:  # the file and line or field are in e; say which flag gave the folder
            raise InputError(f"--model.init_from: {e}") from None
        if folder.fc_ids != self.fc_ids:
            raise ValueError(
                f"--model.init_from {path}: its fc reads target layers {folder.fc_ids}, this config's "
                f"injection gives {self.fc_ids}"
            )
        mine, theirs = asdict(self.drafter.config), asdict(folder.config)
        differ = [k for k in mine if k != "attention" and mine[k] != theirs.get(k)]
        if differ:
            raise ValueError(
                f"--model.init_from {path}: the folder's drafter differs from this config's: "
                + ", ".join(f"{k} {theirs.get(k)} vs {mine[k]}" for k in differ)
            )
        mine_ids, theirs_ids = self.drafter.draft_ids, folder.state.get("draft_ids")
        if mine_ids is not None and not torch.equal(mine_ids, theirs_ids):
            raise ValueError(
                f"--model.init_from {path}: the folder's draft vocabulary ({len(theirs_ids)} tokens) is "
                f"not the one --model.draft_vocab gives ({len(mine_ids)} tokens)"
            )
        self.drafter.load_state_dict(folder.state, strict=True)
        head = getattr(self.loss_fn, "head", None)
        if head is not None and "confidence_head.weight" in folder.aux:
            aux = folder.aux
            head.load_state_dict(
                {"weight": aux["confidence_head.weight"], "bias": aux["confidence_head.bias"]}
            )

    # --- the shared forward ------------------------------------------------------------------------
    def prepare(
        self,
        batch: dict[str, torch.Tensor],
        sampler: AnchorSampler,
        seed: int,
        noisy: bool,
        source: TargetSource | None = None,
    ) -> StepInputs:
        """Target forward, labels (from ``source``, default the training one), anchors, blocks and masks."""
        source = self.target_source if source is None else source
        ids, loss_mask = batch["input_ids"], batch["loss_mask"]  # (b, S)
        s = ids.shape[1]
        k = self.drafter.config.block_size
        if "features" in batch:  # offline: an offline cache holds what the target would give
            clean = batch["features"].to(self.target.embed_tokens.weight.dtype)  # (b, S, n*H)
            hidden = batch.get("label_hidden")  # (b, S, H) or None
        else:
            out = self.target(ids, attention_mask=batch["attention_mask"])
            clean = torch.cat([out.taps[i] for i in self.fc_ids], dim=-1)  # (b, S, n*H)
            hidden = source.predictor_hidden(self.target, out) if source.has_distribution else None
        # Random draws are per sequence, seeded by (step seed, the sequence's row in the global batch):
        # a batch split over data-parallel ranks draws exactly what one process would on all of it.
        rows = range(self.global_rank * ids.shape[0], (self.global_rank + 1) * ids.shape[0])
        features = clean
        if noisy:  # a new tensor: the target's outputs, which the labels read, stay untouched
            features = torch.cat(
                [
                    self.noise(
                        clean[i : i + 1],
                        torch.Generator(clean.device).manual_seed(_row_seed(seed + 10**12, r)),
                    )
                    for i, r in enumerate(rows)
                ]
            )  # (b, S, n*H)
        if "labels" in batch:  # offline: hard labels computed once when the cache was built
            labels, label_ok = batch["labels"].clamp(min=0), batch["labels"] >= 0  # (b, S)
        else:
            labels, label_ok = source.hard_labels_from(self.target, hidden, ids)  # (b, S)
        drawn = [
            sampler(loss_mask[i : i + 1], k, torch.Generator().manual_seed(_row_seed(seed, r)))
            for i, r in enumerate(rows)
        ]
        anchors = torch.cat([a for a, _ in drawn])  # (b, N)
        anchor_ok = torch.cat([ok for _, ok in drawn])  # (b, N)
        block_ids, block_pos = build_blocks(ids, anchors, k, self.drafter.config.mask_token_id)  # (b, Q)
        slot_labels, scored = block_labels(labels, label_ok, loss_mask, anchors, anchor_ok, k)  # (b, N, K)
        # With a draft vocabulary, labels become its indices; a slot whose label lies outside it is not
        # trained (the drafter can never propose it) but validation still counts it as a miss.
        slot_labels = self.drafter.to_draft(slot_labels, self.target.vocab_size)  # (b, N, K)
        slot_ok = scored & (slot_labels >= 0)
        teacher = None
        if self.loss_fn.needs_distribution:
            b_idx, anchor_idx, slot = slot_ok.nonzero(as_tuple=True)  # (M,) each, in (b, N, K) order
            positions = anchors[b_idx, anchor_idx] + slot

            @torch.no_grad()
            def teacher(sel: slice) -> torch.Tensor:  # (C, V or V_d), per chunk when the loss asks
                logits = source.logits_from(self.target, hidden, b_idx[sel], positions[sel])  # (C, V)
                ids = self.drafter.draft_ids
                # Over a draft vocabulary: the target's distribution restricted to it, renormalised.
                return logits if ids is None else logits.index_select(-1, ids.to(logits.device))

        # A mask component that overrides the dense training_mask (an older plugin) is used as is.
        dense_only = type(self.mask).training_mask is not DrafterMask.training_mask
        build = self.mask.training_mask if dense_only else self.mask.training_layout
        built: dict = {}
        masks = []
        for rule in self.drafter.layer_rules():  # one mask per distinct rule
            if rule not in built:
                built[rule] = build(anchors, anchor_ok, s, k, rule)
            masks.append(built[rule])
        return StepInputs(
            features,
            clean,
            anchors,
            anchor_ok,
            block_ids,
            block_pos,
            slot_labels,
            slot_ok,
            scored,
            teacher,
            masks,
        )

    def draft_hidden(self, inp: StepInputs) -> torch.Tensor:
        """The drafter's final hidden state for every block slot: (b, N, K, H)."""
        b = inp.features.shape[0]
        hidden = self.drafter(
            self.target.embed(inp.block_ids), inp.block_pos, masks=inp.masks, taps=inp.features
        )
        return hidden.view(b, inp.anchors.shape[1], self.drafter.config.block_size, -1)  # (b, N, K, H)

    def slot_batch(self, hidden: torch.Tensor, inp: StepInputs) -> SlotBatch:
        ok = inp.supervised
        slots = torch.arange(hidden.shape[2], device=hidden.device).expand(ok.shape)  # (b, N, K)
        return SlotBatch(
            hidden=hidden[ok],  # (M, H): only supervised slots ever reach the head
            labels=inp.labels[ok],
            slots=slots[ok],
            supervised=ok,
            head=self.draft_logits,
            teacher=inp.teacher,
            chunk_rows=self.loss_chunk_rows if self.training else None,
            denominator=self._global_mean if self._world_size() > 1 else None,
        )

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(.., H) -> (.., V) or (.., V_d): the target's frozen head, over the draft vocabulary if any."""
        return self.drafter.logits(hidden, self.target.lm_head)

    def _world_size(self) -> int:
        return self._trainer.world_size if self._trainer is not None else 1

    def _global_mean(self, local: torch.Tensor) -> torch.Tensor:
        """The mean over data-parallel ranks of a per-rank normaliser (no gradient flows through it)."""
        total = local.detach().clone()
        torch.distributed.all_reduce(total)
        return total / torch.distributed.get_world_size()

    def _seed(self, offset: int) -> int:
        return self.hparams.seed * 1_000_003 + offset

    # --- training ---------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        inp = self.prepare(batch, self.anchors, self._seed(self.global_step), noisy=True)
        sb = self.slot_batch(self.draft_hidden(inp), inp)
        parts = self.loss_fn(sb)
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
        inp = self.prepare(
            batch, self.val_sampler, self._seed(10**9 + batch_idx), noisy=False, source=self.val_target_source
        )
        hidden = self.draft_hidden(inp)
        b, n, k, _ = hidden.shape
        sb = self.slot_batch(hidden, inp)
        parts = self.loss_fn(sb)
        # Full blocks only: every valid anchor has all K-1 slots labelled, so reshape per block. Labels
        # outside a draft vocabulary (-1) are scored as misses: the drafter cannot propose them.
        ok, labels = inp.scored, inp.labels
        logits = sb.logits if torch.equal(ok, inp.supervised) else self.draft_logits(hidden[ok])  # (M, V)
        draft = torch.zeros((b, n, k), dtype=torch.long, device=hidden.device)
        draft[ok] = logits.argmax(-1)
        hit = (draft == labels) & ok  # (b, N, K)
        self.val_acc.update(hit[:, :, 1:].reshape(-1, k - 1), ok[:, :, 1:].reshape(-1, k - 1))
        # Full blocks: the M rows are the valid anchors' K-1 slots, in order.
        per_block = logits.view(-1, k - 1, logits.shape[-1])  # (A, K-1, V)
        per_block_labels = labels[ok].view(-1, k - 1)  # (A, K-1)
        everywhere = torch.ones_like(per_block_labels, dtype=torch.bool)
        for label, verifier in self.offline_verifiers.items():
            if label == "chain":
                acc = hit[:, :, 1:].long().cumprod(dim=2).sum(dim=2)[inp.anchor_ok]  # (A,)
            else:
                acc = verifier.offline_accepted(per_block, per_block_labels, everywhere)  # (A,)
            accepted = torch.zeros((b, n), dtype=torch.long, device=hidden.device)
            accepted[inp.anchor_ok] = acc
            self.val_tau[label].update(accepted, inp.anchor_ok)
            self.val_curve[label].update(acc)
        self.val_calibration.update(per_block, per_block_labels)
        self.log("val/loss", parts["loss"], prog_bar=True, batch_size=b)
        for key, value in parts.items():
            if key != "loss":
                self.log(f"val/{key}", value, batch_size=b)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        for i, a in enumerate(acc.tolist(), start=1):
            self.log(f"val/acc_slot{i}", a)
        self.log("val/acc", acc.mean().item(), prog_bar=True)
        self.val_acc.reset()
        curves = {}
        for label in self.offline_verifiers:
            suffix = "" if label == "chain" else f"_{label}"
            for key, value in self.val_tau[label].compute().items():
                self.log(f"val/{key}{suffix}", value.item(), prog_bar=key == "tau" and label == "chain")
            curves[label] = self.val_curve[label].compute().tolist()
            for d, frac in enumerate(curves[label], start=1):
                self.log(f"val/accept_ge{d}{suffix}", frac)
            self.val_tau[label].reset()
            self.val_curve[label].reset()
        cal = self.val_calibration.compute()
        self.val_calibration.reset()
        self.log("val/calibration_ece", cal["ece"].item())
        self.calibration = {
            "rows": "block slot (depth) 1..K-1",
            "columns": "drafter rank 1..4",
            "stated": cal["stated"].tolist(),
            "empirical": cal["empirical"].tolist(),
            "ece": cal["ece"].item(),
        }
        trainer = self._trainer
        if trainer is not None and not trainer.sanity_checking:
            log_acceptance_figure(trainer, acc.tolist(), curves)
            log_dir = trainer.log_dir  # a broadcast under data parallelism: every rank asks, once
            if log_dir and trainer.is_global_zero:
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                (Path(log_dir) / "calibration.json").write_text(json.dumps(self.calibration, indent=1) + "\n")

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

    # --- sharding ---------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """FSDP2 under Lightning's ``ModelParallelStrategy``: ``fully_shard`` per drafter layer, then the
        drafter's root (fc, norms) and any trained auxiliary head. The frozen target is replicated by
        default (no gradients or optimizer state to shard; every rank runs it on its own batch), or
        sharded per decoder layer with ``shard_target`` when its weights do not fit one device.
        Without a device mesh (single process, DDP) this does nothing.
        """
        mesh = self._device_mesh
        if mesh is None or getattr(self, "_sharded", False):
            return
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dp = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
        policy = MixedPrecisionPolicy()  # parameters and gradient reduction in the stored dtype
        for layer in self.drafter.layers:
            fully_shard(layer, mesh=dp, mp_policy=policy)
        fully_shard(self.drafter, mesh=dp, mp_policy=policy)
        if any(p.requires_grad for p in self.loss_fn.parameters()):
            fully_shard(self.loss_fn, mesh=dp, mp_policy=policy)
        if self.hparams.shard_target:
            for layer in self.target.base.layers:  # gathered around each layer's forward, then freed
                fully_shard(layer, mesh=dp, mp_policy=policy)
        self._sharded = True

    # --- optimisation -----------------------------------------------------------------------------
    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.parameters() if p.requires_grad]  # drafter + auxiliary heads
        opt = torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay, betas=(0.9, 0.95))
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
                "hidden_size": self.target.hidden_size,
                "vocab_size": self.target.vocab_size,
                "tied_embeddings": self.target.lm_head.weight is self.target.embed_tokens.weight,
                "tap_ids": self.target.tap_ids,
            },
            "fc_ids": self.fc_ids,
            "drafter": asdict(self.drafter.config),
            "components": {
                "injection": name_of(self.injection),
                "target_source": name_of(self.target_source),
                "val_target_source": name_of(self.val_target_source),
                "noise": name_of(self.noise),
                "loss": name_of(self.loss_fn),
                "mask": name_of(self.mask),
                "anchors": name_of(self.anchors),
                "verifier": name_of(self.verifier),
                "draft_vocab": name_of(self.draft_vocab),
                "attention": self.drafter.config.attention,
            },
        }

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["state_dict"]
        for key in [k for k in state if k.startswith("target.")]:
            del state[key]  # the frozen target is loaded from its source, never copied into checkpoints
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
