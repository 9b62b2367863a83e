"""``fit`` and ``validate``: LightningCLI with this project's defaults, checkpoint rules and
``--results``. The other commands build a setup from the same arguments without Lightning's CLI
(cli/setup_args.py).

    spec-drafters fit --config configs/quickstart.yaml
    spec-drafters validate --config configs/quickstart.yaml --ckpt_path runs/quickstart/checkpoints/last.ckpt

Two private LightningCLI hooks are overridden, with lightning pinned below 2.7 in pyproject.toml:
``_prepare_subcommand_kwargs`` (every checkpoint loads as plain data) and ``_parse_ckpt_path`` (a
checkpoint keeps this run's RUN_TIME_ARGS); tests/test_trust_b.py fails if either stops being called.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from jsonargparse import lazy_instance
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from spec_drafters.cli.checkpoint_args import with_checkpoint_settings
from spec_drafters.cli.checks import use_unique_key_loader
from spec_drafters.cli.flags import instantiation_error
from spec_drafters.cli.setup_args import check_names, lightning_classes

# Imported for its subclasses, not only for the names used here: jsonargparse resolves a short
# `class_path: TrainingThroughput` only to a Callback subclass already imported, so any
# SpecDraftersCLI (a subclass in a downstream project, a test) must see our callbacks at parse time.
from spec_drafters.lightning.callbacks import RunProgressBar
from spec_drafters.lightning.tracking import RunAimLogger

# Every YAML that jsonargparse reads for this CLI (--config, --trainer FILE) refuses duplicate keys.
use_unique_key_loader()


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
        would silently ignore ``validate --model.verifier DDTree``: keep this run's RUN_TIME_ARGS
        (cli/checkpoint_args.py)."""
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        self.config = with_checkpoint_settings(self.parser, self.config, sub, self.argv, ckpt_path)

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


def run_lightning(argv: list[str]) -> None:
    """``fit`` or ``validate`` (``argv[0]``) with LightningCLI."""
    module_class, data_class = lightning_classes()
    check_names(argv)
    SpecDraftersCLI(
        module_class,
        data_class,
        args=None if argv == sys.argv[1:] else argv,  # LightningCLI warns when both are given
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"default_env": False, "prog": "spec-drafters"},
    )


def run_fit(argv: list[str]) -> None:
    run_lightning(["fit", *argv])
