"""A checkpoint's settings over a command line's: ``validate --ckpt_path`` and the commands that build a
setup (cli/setup_args.py) keep the drafter a checkpoint was trained as, but this run's RUN_TIME_ARGS,
and warn where a flag or a config file set something the checkpoint overrides."""

from __future__ import annotations

import json
import sys

from lightning.pytorch.utilities import rank_zero_warn

from spec_drafters.cli.checks import argv_flags, read_config, resolve_class
from spec_drafters.errors import InputError, argument

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
    from spec_drafters.artefacts.checkpoints import read_checkpoint_file

    try:
        return read_checkpoint_file(path, "--ckpt_path")
    except InputError as e:
        sys.exit(f"spec-drafters: error: {e}")


def _model_settings(argv: list[str]) -> dict[str, str]:
    """The model arguments the user set, as dotted keys (``drafter.block_size``), each with where it
    was set: its ``--model.*`` flag, or the ``--config`` file whose ``model:`` section holds it (the
    last one on the command line wins, as in LightningCLI)."""
    where: dict[str, str] = {}
    for flag, value in argv_flags(argv):
        if flag.startswith("--model."):
            key = flag.rstrip("+")[len("--model.") :]
            where[key] = f"--model.{key}"
        elif flag in ("--config", "-c") and value:
            model = read_config(value).get("model")
            where |= dict.fromkeys(_dotted_keys(model), value) if isinstance(model, dict) else {}
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


def with_checkpoint_settings(parser, config, section: str, argv: list[str], ckpt_path: str | None):
    """``config`` with the checkpoint's model settings in ``section`` (a subcommand, or "" for the
    whole config). Before anything is built: the file must exist and be plain data, and the
    checkpoint's target must be this run's (otherwise its drafter settings would fail against the
    wrong target first, e.g. as a bad ``num_taps``). A setting the checkpoint overrides is warned
    about, whether a command-line flag or a ``--config`` file set it."""
    if not ckpt_path or str(ckpt_path) in CKPT_KEYWORDS:
        return config
    ckpt = read_checkpoint(ckpt_path)
    at = config[section] if section else config
    saved = ckpt.get("spec_drafters", {}).get("target", {}).get("name")
    mine = _target_identity(at.get("model.target"))
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
        return config
    before = at.clone()
    config = parser.parse_object({section: {"model": hparams}} if section else {"model": hparams}, config)
    after = config[section] if section else config
    for key, where in _model_settings(argv).items():
        given, used = before.get(f"model.{key}"), after.get(f"model.{key}")
        if given != used:
            setting = f"{where} {_shown(given)}"
            if not where.startswith("--"):  # a config file
                setting = f"model.{key} {_shown(given)} (set in {where})"
            rank_zero_warn(
                f"{setting} is overridden by the checkpoint's {_shown(used)} "
                f"(--ckpt_path {ckpt_path}): a checkpoint keeps the drafter it was trained as"
            )
    return config


def _shown(value) -> str:
    """A config value as a flag would spell it (class choices by class path)."""
    if hasattr(value, "class_path"):
        value = value.as_dict()
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
