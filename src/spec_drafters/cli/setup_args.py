"""Builds a :class:`~spec_drafters.artefacts.setup.DrafterSetup` from the arguments ``validate`` takes
(``--config``, ``--model.*``, ``--data.*``, ``--trainer.*``, ``--ckpt_path``), for the commands that
train nothing: generate, lint, inspect, diff, cost-model, calibrate, cache, draft-vocab, regenerate,
serve-eval.

The parser is jsonargparse's, with the model's arguments read from ``DFlashModule.__init__`` (public
``add_method_arguments``: the module itself is never built) and the trainer's checked but not built,
so a config that ``fit`` accepts is accepted here, and a GPU trainer preset does not stop a CPU
inspection. A checkpoint's settings replace the config's as in ``validate`` (cli/checkpoint_args.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from jsonargparse import ActionConfigFile, Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser

from spec_drafters.artefacts.setup import DrafterSetup
from spec_drafters.cli.checkpoint_args import read_checkpoint, with_checkpoint_settings
from spec_drafters.cli.checks import check_argv_components, read_config, use_unique_key_loader
from spec_drafters.cli.flags import instantiation_error
from spec_drafters.registry import UnknownComponentError

# Every YAML that jsonargparse reads here (--config, --trainer FILE) refuses duplicate keys.
use_unique_key_loader()


def lightning_classes() -> tuple[type, type]:
    """(the LightningModule, the DataModule), with every component and callback name registered."""
    from spec_drafters.lightning import callbacks  # noqa: F401 - lets YAML name our callbacks by class name
    from spec_drafters.lightning.datamodule import TextDataModule
    from spec_drafters.lightning.module import DFlashModule
    from spec_drafters.registry import load_components

    load_components()
    return DFlashModule, TextDataModule


def check_names(argv: list[str]) -> None:
    """Unknown component names (a typo in ``class_path``) end as one line listing the known ones."""
    try:
        check_argv_components(argv)
    except UnknownComponentError as e:
        sys.exit(f"spec-drafters: error: {e}")


def setup_parser(with_data: bool = False) -> LightningArgumentParser:
    """The parser of ``validate``'s arguments; only the data module (``with_data``) is instantiated."""
    module_class, data_class = lightning_classes()
    parser = LightningArgumentParser(prog="spec-drafters", default_env=False)
    parser.add_argument("-c", "--config", action=ActionConfigFile, help="A config file (YAML).")
    parser.add_argument("--seed_everything", type=bool | int, default=True)
    parser.add_class_arguments(Trainer, "trainer", instantiate=False, fail_untyped=False, sub_configs=True)
    parser.add_method_arguments(module_class, "__init__", "model", fail_untyped=False, sub_configs=True)
    parser.add_class_arguments(
        data_class, "data", instantiate=with_data, fail_untyped=False, sub_configs=True
    )
    parser.add_argument("--ckpt_path", type=str | None, default=None, help="A checkpoint to load.")
    return parser


def load_setup(argv: list[str], quiet: bool = False, with_data: bool = False):
    """The setup that ``validate``'s arguments build, with the checkpoint's drafter weights loaded
    (and the data module with it when ``with_data``), in eval mode, the drafter in the target's dtype."""
    check_names(argv)
    parser = setup_parser(with_data)
    config = parser.parse_args(argv)
    ckpt_path = config.get("ckpt_path")
    config = with_checkpoint_settings(parser, config, "", argv, ckpt_path)
    try:
        built = parser.instantiate(config)
    except ValueError as e:  # a component's constructor refusing its arguments: name the flag
        named = instantiation_error(e)
        if named is None:
            raise
        raise named from named.__cause__
    setup = DrafterSetup.build(model_arguments(built.model))
    if ckpt_path:
        setup.load_checkpoint(read_checkpoint(ckpt_path))
    elif not quiet and setup.settings.get("init_from") is None:
        print("spec-drafters: no --ckpt_path, the drafter is untrained", file=sys.stderr)
    setup.drafter.to(setup.target.embed_tokens.weight.dtype).eval()  # serve in the target's dtype
    setup.loss_fn.eval()
    return (setup, built.data) if with_data else setup


def model_arguments(model: Namespace) -> dict:
    """The model section, instantiated, as the keyword arguments of ``DFlashModule.__init__``."""
    return dict(vars(model))


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


def setup_from_config(path: str | Path) -> DrafterSetup:
    """The untrained setup a config file builds, its target on the meta device if it is HFPretrained."""
    return load_setup(["--config", str(path), *meta_target_args([str(path)], always=True)], quiet=True)
