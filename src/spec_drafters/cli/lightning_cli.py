"""``fit`` and ``validate``: LightningCLI with this project's defaults, checkpoint rules and
``--results``; and :func:`load_module`, which builds the module from the same arguments for the other
commands (generate, cache, draft-vocab, inspect, diff, lint).

    spec-drafters fit --config configs/quickstart.yaml
    spec-drafters validate --config configs/quickstart.yaml --ckpt_path runs/quickstart/checkpoints/last.ckpt
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from jsonargparse import lazy_instance
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from spec_drafters.cli.checks import check_argv_components, read_config, resolve_class, use_unique_key_loader
from spec_drafters.cli.flags import instantiation_error
from spec_drafters.errors import InputError, argument

# Imported for its subclasses, not only for the names used here: jsonargparse resolves a short
# `class_path: TrainingThroughput` only to a Callback subclass already imported, so any
# SpecDraftersCLI (a subclass in a downstream project, a test) must see our callbacks at parse time.
from spec_drafters.lightning.callbacks import RunProgressBar
from spec_drafters.lightning.tracking import RunAimLogger
from spec_drafters.registry import UnknownComponentError, load_components

# Every YAML that jsonargparse reads for this CLI (--config, --trainer FILE) refuses duplicate keys.
use_unique_key_loader()

#: Model arguments that belong to this run, not to the checkpoint: where the target is loaded from (a
#: path on this machine; its identity is still checked against the checkpoint) and how drafts are
#: evaluated. Everything else that shapes the drafter comes from the checkpoint.
RUN_TIME_ARGS = (
    "target",
    "verifier",
    "eval_verifiers",
    "val_anchors",
    "val_target_source",
    "init_from",
    "shard_target",
    "activation_checkpointing",
    "loss_chunk_rows",
)


#: ``--ckpt_path`` values that Lightning resolves itself (they name no file).
CKPT_KEYWORDS = ("best", "last", "hpc", "registry")


def read_checkpoint(path: str) -> dict:
    """``--ckpt_path``'s checkpoint as plain data only; anything else ends as one line naming it."""
    from spec_drafters.artefacts.folders import read_checkpoint_file

    try:
        return read_checkpoint_file(path, "--ckpt_path")
    except InputError as e:
        sys.exit(f"spec-drafters: error: {e}")


def _model_settings(argv: list[str]) -> dict[str, str]:
    """The model arguments the user set, as dotted keys (``drafter.block_size``), each with where it
    was set: its ``--model.*`` flag, or the ``--config`` file whose ``model:`` section holds it (the
    last one on the command line wins, as in LightningCLI)."""
    where: dict[str, str] = {}
    for i, arg in enumerate(argv):
        name = arg.split("=", 1)[0]
        if name.startswith("--model."):
            key = name.rstrip("+")[len("--model.") :]
            where[key] = f"--model.{key}"
        elif name in ("--config", "-c") and ("=" in arg or i + 1 < len(argv)):
            path = arg.split("=", 1)[1] if "=" in arg else argv[i + 1]
            model = read_config(path).get("model")
            where |= dict.fromkeys(_dotted_keys(model), path) if isinstance(model, dict) else {}
    return where


def _dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, value in tree.items():
        if isinstance(value, dict) and value:
            keys += _dotted_keys(value, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _target_identity(target) -> str | None:
    """The card name the configured target will load, when its loader knows it without loading."""
    from spec_drafters.target.loaders import TargetLoader

    if target is None or not hasattr(target, "class_path"):
        return None
    cls = resolve_class(target.class_path)
    if cls.identity is TargetLoader.identity:  # a loader that only knows once loaded: no early check
        return None
    init_args = target.get("init_args")
    with argument("target"):  # built before jsonargparse instantiates it: name the flag here
        return cls(**(init_args.as_dict() if init_args else {})).identity()


class SpecDraftersCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # No --weights_only flag: every checkpoint is loaded as plain data (_prepare_subcommand_kwargs).
        return {
            k: v | {"weights_only"}
            for k, v in LightningCLI.subcommands().items()
            if k in ("fit", "validate")  # no test split: held-out is validate's
        }

    def parse_arguments(self, parser, args) -> None:
        # Kept to tell which flags the user gave when a checkpoint overrides them (_parse_ckpt_path).
        if args is None:
            self.argv = sys.argv[1:]
        else:  # a dict or Namespace of arguments names no flags
            self.argv = list(args) if isinstance(args, (list, tuple)) else []
        super().parse_arguments(parser, args)

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict:
        # Lightning's own default unpickles remote checkpoints in full (weights_only=False for URLs);
        # ours hold plain types only (DFlashModule's hyperparameters are plain dicts).
        return {**super()._prepare_subcommand_kwargs(subcommand), "weights_only": True}

    def _parse_ckpt_path(self) -> None:
        """With ``--ckpt_path``, LightningCLI replaces the model arguments by the checkpoint's, which
        would silently ignore ``validate --model.verifier DDTree``. Keep this run's RUN_TIME_ARGS.

        Before anything is built: the file must exist and be plain data, and the checkpoint's target
        must be this run's (otherwise its drafter settings would fail against the wrong target first,
        e.g. as a bad ``num_taps``). A setting the checkpoint overrides is warned about, whether a
        command-line flag or a ``--config`` file set it.
        """
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if not ckpt_path or str(ckpt_path) in CKPT_KEYWORDS:
            return
        ckpt = read_checkpoint(ckpt_path)
        saved = ckpt.get("spec_drafters", {}).get("target", {}).get("name")
        mine = _target_identity(self.config[sub].get("model.target"))
        if saved and mine and saved != mine:
            raise InputError(
                f"--ckpt_path {ckpt_path}: the checkpoint was trained for target {saved!r}, "
                f"--model.target loads {mine!r}"
            )
        hparams = ckpt.get("hyper_parameters", {})
        hparams = {k: v for k, v in hparams.items() if k not in RUN_TIME_ARGS and not k.startswith("_")}
        from spec_drafters.artefacts.checkpoints import with_stored_vocab

        hparams = with_stored_vocab(hparams, ckpt, ckpt_path)  # its draft ids, not a counts file's
        if not hparams:
            return
        before = self.config[sub].clone()
        self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)
        for key, where in _model_settings(self.argv).items():
            given, used = before.get(f"model.{key}"), self.config[sub].get(f"model.{key}")
            if given != used:
                setting = f"{where} {_shown(given)}"
                if not where.startswith("--"):  # a config file
                    setting = f"model.{key} {_shown(given)} (set in {where})"
                rank_zero_warn(
                    f"{setting} is overridden by the checkpoint's {_shown(used)} "
                    f"(--ckpt_path {ckpt_path}): a checkpoint keeps the drafter it was trained as"
                )

    def add_arguments_to_parser(self, parser) -> None:
        # Aim by default, its repository in the run folder; --trainer.logger CSVLogger or
        # TensorBoardLogger (or a list) instead, --trainer.logger false for none.
        parser.set_defaults({"trainer.logger": lazy_instance(RunAimLogger)})
        parser.add_argument(
            "--results",
            type=str | None,
            default=None,
            help="Write the final metrics and the drafter's description to this JSON file.",
        )

    def _write_results(self) -> None:
        path = self.config[self.subcommand].get("results")
        if not path or not self.trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in sorted(self.trainer.callback_metrics.items())}
        payload = {
            "subcommand": self.subcommand,
            "ckpt_path": self.config[self.subcommand].get("ckpt_path"),
            "last_checkpoint": getattr(self.trainer.checkpoint_callback, "last_model_path", None) or None,
            "metrics": metrics,
            "calibration": getattr(self.model, "calibration", {}),
            "drafter": self.model.describe(),
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"results written to {path}")

    def _default_progress_bar(self) -> list | None:
        """The configured callbacks plus RunProgressBar where Lightning would add its default rich
        bar (progress bar enabled, none configured); None where it would add none."""
        trainer_args = self._get(self.config_init, "trainer", default={})
        callbacks = trainer_args.get("callbacks") or []
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        if not _RICH_AVAILABLE or trainer_args.get("enable_progress_bar") is False:
            return None
        if any(isinstance(c, ProgressBar) for c in callbacks):
            return None
        return [*callbacks, RunProgressBar()]

    def instantiate_trainer(self, **kwargs):
        if self.subcommand not in (None, "fit"):
            # fit's config.yaml stays the run's recipe when a validate or test run shares its folder.
            name = f"config_{self.subcommand}.yaml"
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": name}
        callbacks = self._default_progress_bar()
        if callbacks is not None and "callbacks" not in kwargs:
            kwargs["callbacks"] = callbacks
        trainer = super().instantiate_trainer(**kwargs)
        for logger in trainer.loggers:
            if isinstance(logger, RunAimLogger):
                logger.place_in(trainer.default_root_dir)
        return trainer

    def after_validate(self) -> None:
        self._write_results()

    def after_test(self) -> None:
        self._write_results()

    def after_fit(self) -> None:
        self._write_results()

    def instantiate_classes(self) -> None:
        # A component's constructor that refuses its arguments (--model.verifier.budget 0) raises a
        # plain error: name the flag jsonargparse was instantiating (cli/flags.py).
        try:
            super().instantiate_classes()
        except ValueError as e:
            named = instantiation_error(e)
            if named is None:
                raise
            raise named from named.__cause__


def _shown(value) -> str:
    """A config value as a flag would spell it (class choices by class path)."""
    if hasattr(value, "class_path"):
        value = value.as_dict()
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)


def _lightning_classes() -> tuple[type, type]:
    """(the LightningModule, the DataModule), with every component and callback name registered."""
    from spec_drafters.lightning import callbacks  # noqa: F401 - lets YAML name our callbacks by class name
    from spec_drafters.lightning.datamodule import TextDataModule
    from spec_drafters.lightning.module import DFlashModule

    load_components()
    return DFlashModule, TextDataModule


def _check_names(argv: list[str]) -> None:
    try:
        check_argv_components(argv)
    except UnknownComponentError as e:
        sys.exit(f"spec-drafters: error: {e}")


def run_lightning(argv: list[str]) -> None:
    """``fit`` or ``validate`` (``argv[0]``) with LightningCLI."""
    module_class, data_class = _lightning_classes()
    _check_names(argv)
    SpecDraftersCLI(
        module_class,
        data_class,
        args=None if argv == sys.argv[1:] else argv,  # LightningCLI warns when both are given
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"default_env": False, "prog": "spec-drafters"},
    )


def run_fit(argv: list[str]) -> None:
    run_lightning(["fit", *argv])


class _LoadOnly(SpecDraftersCLI):
    """Parses a validate command line (config, overrides, --ckpt_path) and builds the module; runs nothing."""

    def _run_subcommand(self, subcommand: str) -> None:
        pass

    def instantiate_trainer(self, **kwargs):
        return None  # the module alone is needed; a GPU trainer preset must not stop a CPU inspection


def load_module(argv: list[str], quiet: bool = False, with_data: bool = False):
    """A DFlashModule from LightningCLI arguments, with the checkpoint's drafter weights loaded
    (and the data module with it when ``with_data``)."""
    module_class, data_class = _lightning_classes()
    _check_names(argv)
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # args given on purpose
    cli = _LoadOnly(
        module_class,
        data_class,
        args=["validate", *argv, "--trainer.logger=false", "--trainer.enable_progress_bar=false"],
        parser_kwargs={"default_env": False, "prog": "spec-drafters"},
    )
    module = cli.model
    ckpt_path = cli.config["validate"].get("ckpt_path")
    if ckpt_path:
        ckpt = read_checkpoint(ckpt_path)
        module.on_load_checkpoint(ckpt)  # checks the drafter keys and the target's identity
        module.load_state_dict(ckpt["state_dict"], strict=False)
    elif not quiet and module.hparams.get("init_from") is None:
        print("spec-drafters: no --ckpt_path, the drafter is untrained", file=sys.stderr)
    module.drafter.to(module.target.embed_tokens.weight.dtype)  # serve in the target's dtype
    return (module.eval(), cli.datamodule) if with_data else module.eval()


def is_config(path: str | Path) -> bool:
    """A config file (built into a module) rather than a drafter folder or checkpoint."""
    return Path(path).suffix in (".yaml", ".yml")


def meta_target_args(paths: list[str], always: bool = False) -> list[str]:
    """The override that builds an ``HFPretrained`` target on the meta device (its config is enough to
    check or describe a drafter setup): ``always``, or when its weights are not on this machine."""
    for path in paths:
        model = read_config(path).get("model")
        target = model.get("target") if isinstance(model, dict) else None
        if not isinstance(target, dict) or not str(target.get("class_path", "")).endswith("HFPretrained"):
            continue
        weights = Path(str((target.get("init_args") or {}).get("path", "")))
        if always or not weights.is_dir():
            return ["--model.target.init_args.meta=true"]
    return []


def module_from_config(path: str | Path):
    """The untrained module a config file builds, its target on the meta device if it is HFPretrained."""
    return load_module(["--config", str(path), *meta_target_args([str(path)], always=True)], quiet=True)
