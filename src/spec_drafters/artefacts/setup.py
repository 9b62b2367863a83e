"""A built drafter setup in plain torch: the target loaded and tapped, the components checked against
it and each other, the drafter resolved and its weights (docs/architecture.md, "A built setup").

:class:`DrafterSetup` is what a config describes once built. The LightningModule wraps one for
training and validation; lint, inspect, diff, export, generate, cost-model, calibrate and the data
commands take one, built from the same arguments without Lightning (cli/setup_args.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from spec_drafters.artefacts.folders import DrafterFolder, aux_name, describe_drafter
from spec_drafters.artefacts.init_from import load_folder_into
from spec_drafters.decode.generate import DecodeResult, greedy_generate, speculative_generate
from spec_drafters.decode.verifiers import Verifier
from spec_drafters.errors import ArgumentError, argument
from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
from spec_drafters.model.masks import DrafterMask
from spec_drafters.model.vocab import DraftVocab, draft_vocab_ids
from spec_drafters.registry import as_config, name_of
from spec_drafters.rng import derived_seed
from spec_drafters.target.cards import TargetCard
from spec_drafters.target.features import FeatureSpec, plan_taps
from spec_drafters.target.frozen import FrozenTarget
from spec_drafters.target.injection import Injection
from spec_drafters.target.labels import TargetSource
from spec_drafters.target.loaders import TargetLoader
from spec_drafters.target.tokenizers import ByteTokenizer, TextTokenizer
from spec_drafters.train.anchors import AnchorSampler, UniformAnchors
from spec_drafters.train.losses import DraftLoss
from spec_drafters.train.noise import FeatureNoise
from spec_drafters.train.objective import optimizer_problems
from spec_drafters.train.pipeline import StepBuilder, StepInputs

#: The components a setup holds: the name a checkpoint's description uses -> the setup's field, which
#: is also the LightningModule's attribute (so the prefix of its weights in a checkpoint: ``loss_fn.*``).
COMPONENTS = {k: k for k in ("injection", "target_source", "val_target_source", "noise", "mask")}
COMPONENTS |= {
    "loss": "loss_fn",
    "anchors": "anchor_sampler",
    "verifier": "verifier",
    "draft_vocab": "draft_vocab",
}

#: The arguments that only training reads (the optimizer and its schedule): not part of a built setup.
TRAINING_ONLY = ("lr", "weight_decay", "warmup_fraction", "min_lr_ratio", "optimizer", "lr_scheduler")

#: Offset of validation's step seeds from training's (the two never draw the same anchors).
VALIDATION_SEEDS = 10**9


def check_arguments(args: dict) -> None:
    """Refuses arguments that are wrong whatever the target (before it loads): one line naming the flag."""
    for name, problem in optimizer_problems(
        args["lr"], args["weight_decay"], args["warmup_fraction"], args["min_lr_ratio"]
    ):
        raise ArgumentError(name, problem)
    if args["val_anchors"] < 1:
        raise ArgumentError("val_anchors", f"must be >= 1, got {args['val_anchors']}")
    if args["loss_chunk_rows"] is not None and args["loss_chunk_rows"] < 1:
        raise ArgumentError("loss_chunk_rows", f"must be >= 1 or null, got {args['loss_chunk_rows']}")


def plain_settings(args: dict) -> dict:
    """The arguments as plain ``{class_path, init_args}`` data (checkpoints hold plain types only). A
    chosen optimizer or scheduler is a callable: it stays None here (the run's config.yaml keeps it)."""
    return {key: as_config(None if key in ("optimizer", "lr_scheduler") else v) for key, v in args.items()}


@dataclass(eq=False)
class DrafterSetup:
    """A config built: the frozen target and its tokenizer, the fc layers, the drafter, the components.

    ``settings``: every argument it was built from, as plain data (a checkpoint's hyperparameters);
    ``optimizer``: a chosen optimizer's factory, if any (lint builds it on a probe).
    """

    tokenizer: TextTokenizer | ByteTokenizer | None  # None: an HFPretrained folder without tokenizer files
    card: TargetCard
    target: FrozenTarget
    fc_ids: list[int]
    drafter: DFlashDrafter
    injection: Injection
    target_source: TargetSource
    val_target_source: TargetSource
    noise: FeatureNoise
    loss_fn: DraftLoss
    mask: DrafterMask
    anchor_sampler: AnchorSampler  # argument ``anchors``: the sampler (StepInputs.anchors: positions)
    verifier: Verifier
    draft_vocab: DraftVocab
    eval_verifiers: list[Verifier] | None = None
    settings: dict = field(default_factory=dict)
    optimizer: Callable | None = None

    # --- building -----------------------------------------------------------------------------------
    @classmethod
    def build(cls, args: dict, structure_only: bool = False) -> DrafterSetup:
        """The setup that the LightningModule's arguments ``args`` describe (checked first). With
        ``structure_only`` the target is built on the meta device, its weights to be received later
        (lightning/sharding.py: ``load_target_once``)."""
        check_arguments(args)
        parts = {attr: args[key] for key, attr in COMPONENTS.items()}  # argument names are checkpoint names
        with argument("target"):
            target: TargetLoader = args["target"]
            loaded = target.structure() if structure_only else target.load()
        vocab_size = loaded.model.get_output_embeddings().weight.shape[0]
        sources = {"target_source": parts["target_source"], "val_target_source": parts["val_target_source"]}
        fc_ids, taps = plan_taps(loaded.card, vocab_size, parts["injection"], sources, parts["loss_fn"])
        frozen = FrozenTarget(loaded.model, taps)
        drafter = _build_drafter(args, frozen, fc_ids, loaded.card, parts, structure_only)
        drafter.checkpoint_layers = args["activation_checkpointing"]
        return cls(
            loaded.tokenizer, loaded.card, frozen, fc_ids, drafter, **parts,
            eval_verifiers=args["eval_verifiers"], settings=plain_settings(args), optimizer=args["optimizer"],
        )  # fmt: skip

    # --- what it is ---------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    def components(self) -> dict:
        """Checkpoint name -> component (the ``components`` of a checkpoint's description)."""
        return {key: getattr(self, attr) for key, attr in COMPONENTS.items()}

    def trained_modules(self) -> dict[str, torch.nn.Module]:
        """The modules whose weights a checkpoint stores, by attribute name (the drafter, auxiliary heads
        of the loss, any component with weights); never the frozen target."""
        parts = {"drafter": self.drafter} | {attr: getattr(self, attr) for attr in COMPONENTS.values()}
        return {name: part for name, part in parts.items() if isinstance(part, torch.nn.Module)}

    def describe(self) -> dict:
        """What this drafter is, in plain types: stored in every checkpoint (artefacts/folders.py)."""
        names = {key: name_of(part) for key, part in self.components().items()}
        return describe_drafter(self.card.name, self.target, self.fc_ids, self.drafter.config, names)

    def folder(self) -> DrafterFolder:
        """The drafter as a folder to write (weights, config, fc ids, the target's identity)."""
        desc = self.describe()
        aux = {aux_name("loss_fn." + k): v for k, v in self.loss_fn.state_dict().items()}
        meta = {"target": desc["target"], "components": desc["components"]}
        cfg, depth, vocab = self.drafter.config, self.target.num_layers, self.target.vocab_size
        return DrafterFolder(
            cfg, list(self.fc_ids), depth, vocab, self.drafter.state_dict(), aux, "module", meta
        )

    def feature_spec(self) -> FeatureSpec:
        """The target side of this setup: what computes the fc input and labels, and what identifies them."""
        identity = {
            "target": self.card.name,
            "label_source": name_of(self.target_source),
            "label_layers": self.target_source.layer_ids(self.card),
            "tokenizer": self.tokenizer.identity(),
        }
        soft = self.loss_fn.needs_distribution
        return FeatureSpec(self.target, self.fc_ids, self.target_source, soft, self.tokenizer, identity)

    # --- checkpoints --------------------------------------------------------------------------------
    def check_checkpoint(self, checkpoint: dict, state: dict | None) -> None:
        """A checkpoint must hold every trained weight (``state``: its weights, None where a sharded
        loader has checked them) and have been trained for this target."""
        trained = [
            f"{name}.{key}" for name, part in self.trained_modules().items() for key in part.state_dict()
        ]
        missing = [k for k in trained if k not in state] if state is not None else []
        if missing:
            raise KeyError(f"checkpoint lacks drafter weights {missing[:5]} (of {len(missing)} missing)")
        saved = checkpoint.get("spec_drafters", {}).get("target", {}).get("name")
        if saved and saved != self.card.name:
            raise ValueError(
                f"checkpoint was trained for target {saved!r}, this config loads {self.card.name!r}"
            )

    def load_checkpoint(self, checkpoint: dict) -> None:
        """The checkpoint's trained weights into this setup (checked first)."""
        state = checkpoint["state_dict"]
        self.check_checkpoint(checkpoint, state)
        for name, part in self.trained_modules().items():
            prefix = f"{name}."
            part.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})

    # --- steps and decoding -------------------------------------------------------------------------
    def step_builder(self) -> StepBuilder:
        """Builds one teacher-forced step's inputs for this setup (train/pipeline.py)."""
        soft = self.loss_fn.needs_distribution
        return StepBuilder(self.target, self.drafter, self.fc_ids, self.noise, self.mask, soft)

    def held_out_inputs(self, batch: dict, batch_idx: int, rows: range | None = None) -> StepInputs:
        """Validation's inputs for a batch: full blocks only, ``val_anchors`` per sequence, clean
        features, the validation target source, seeds fixed by the batch's index."""
        sampler = UniformAnchors(max_anchors=self.settings["val_anchors"], require_full_block=True)
        seed = derived_seed(self.settings["seed"], VALIDATION_SEEDS + batch_idx)
        rows = rows if rows is not None else range(batch["input_ids"].shape[0])
        return self.step_builder()(batch, sampler, self.val_target_source, seed, rows, noisy=False)

    def scored_blocks(
        self, inp: StepInputs, hidden: torch.Tensor, slots=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(drafter logits (A, K-1, V) of the A valid anchors, their labels (A, K-1)) from a held-out
        step's hidden states (b, N, K, H). Labels outside a draft vocabulary (-1) count as misses: the
        drafter cannot propose them. ``slots``: the step's SlotBatch, whose logits are reused when
        every scored slot is supervised."""
        ok, k = inp.scored, hidden.shape[2]
        if slots is not None and torch.equal(ok, inp.supervised):
            logits = slots.logits
        else:
            logits = self.drafter.logits(hidden[ok], self.target.lm_head)  # (M, V)
        return logits.view(-1, k - 1, logits.shape[-1]), inp.labels[ok].view(-1, k - 1)

    def greedy(self, prompt: list[int], max_new_tokens: int) -> DecodeResult:
        """Plain greedy decoding with the target (the reference every speculative output must equal)."""
        return greedy_generate(self.target, prompt, max_new_tokens, self.card.eos_token_ids)

    def speculate(
        self, prompt: list[int], max_new_tokens: int, verifier: Verifier | None = None
    ) -> DecodeResult:
        """Speculative decoding with this drafter and ``verifier`` (default: the configured one)."""
        verifier, eos = verifier or self.verifier, self.card.eos_token_ids
        return speculative_generate(
            self.target, self.drafter, self.fc_ids, verifier, prompt, max_new_tokens, eos
        )


def _build_drafter(
    args: dict, target: FrozenTarget, fc_ids, card, parts: dict, deferred: bool
) -> DFlashDrafter:
    """The drafter for the target (on the meta device when the target is) with its starting weights."""
    with argument("mask"):
        rules = parts["mask"].per_layer(args["drafter"].num_layers)
    with argument("drafter"):
        cfg: DrafterConfig = args["drafter"].resolved(
            target.model.config, len(fc_ids), card.mask_token_id, rules
        )
    init_from = args["init_from"]
    with argument("draft_vocab"):  # a frequent_tokens without its counts file: the folder's ids
        draft_ids = draft_vocab_ids(parts["draft_vocab"], target.vocab_size, init_from)
    if draft_ids is not None:
        cfg = replace(cfg, draft_vocab_size=len(draft_ids))
    # a config check (no weights anywhere), not a rank waiting for the target's weights
    on_meta = target.embed_tokens.weight.is_meta and not deferred
    with torch.device("meta") if on_meta else contextlib.nullcontext():
        drafter = DFlashDrafter(cfg)
        parts["loss_fn"].bind(cfg.hidden_size)
    if draft_ids is not None and not on_meta:
        drafter.draft_ids.copy_(draft_ids)
    if init_from is not None:
        with argument("init_from"):
            head = getattr(parts["loss_fn"], "head", None)
            load_folder_into(init_from, drafter, fc_ids, card, head)
    return drafter
