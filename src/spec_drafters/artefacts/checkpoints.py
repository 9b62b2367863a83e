"""Lightning checkpoints as plain data: read without running code, upgraded from older class paths,
and checked to hold the drafter they describe, so every command that reads one (validate, generate,
calibrate, cost-model, export, inspect, diff) says the same one line about a bad file.
"""

from __future__ import annotations

import pickle
from dataclasses import fields
from pathlib import Path

import torch

from spec_drafters.errors import InputError
from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig


def read_checkpoint_file(path: str | Path, flag: str = "") -> dict:
    """A local Lightning checkpoint as plain data only (``weights_only``: loading never runs code from
    it); a missing, remote, empty, truncated or code-carrying file, or one without the drafter's
    tensors, is an InputError naming it."""
    where = f"{flag} {path}" if flag else str(path)
    if "://" in str(path):
        raise InputError(
            f"{where}: remote checkpoints are not loaded (a pickle can run code); download it and pass "
            "the local file"
        )
    if not Path(path).is_file():
        raise InputError(f"{where}: no such file")
    if Path(path).stat().st_size == 0:
        raise InputError(f"{where}: an empty file (0 bytes), not a checkpoint; interrupted while written?")
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        # torch says "Unsupported global: GLOBAL x" for code a pickle would call, and other
        # "Unsupported ..." reasons for bytes that are no checkpoint at all (truncated, foreign).
        reason = next((ln.strip() for ln in str(e).splitlines() if "Unsupported" in ln), type(e).__name__)
        reason = reason.split("WeightsUnpickler error:")[-1].strip()
        if "GLOBAL" in reason:
            raise InputError(
                f"{where}: refused, it holds more than plain data (tensors, numbers, strings, "
                f"containers) and unpickling it could run code ({reason.split(' was not')[0]})"
            ) from None
        raise InputError(f"{where}: not a readable checkpoint ({reason})") from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:  # truncated zip: OSError EINVAL
        raise InputError(f"{where}: not a readable checkpoint ({first_line(e)})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise InputError(f"{where}: not a Lightning checkpoint (no state_dict)")
    if isinstance(ckpt.get("hyper_parameters"), dict):
        ckpt["hyper_parameters"] = upgrade_class_paths(ckpt["hyper_parameters"])
    check_drafter_tensors(ckpt, where)
    return ckpt


def first_line(error: BaseException) -> str:
    """An exception's first line, or its class where it says nothing (EOFError on a 0-byte file)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def check_drafter_tensors(ckpt: dict, where: str) -> None:
    """Every tensor of the drafter the checkpoint describes (``drafter.*``, built on the meta device
    from its description) must be in its state_dict; without a description, at least one."""
    have = [k for k in ckpt["state_dict"] if k.startswith("drafter.")]
    expected = _drafter_keys(ckpt.get("spec_drafters"))
    if expected is None:
        if not have:
            raise InputError(f"{where}: holds no drafter tensors (no state_dict key starts with 'drafter.')")
        return
    missing = [k for k in expected if k not in set(have)]
    if missing:
        raise InputError(
            f"{where}: lacks drafter tensors {missing[:5]} ({len(missing)} of the {len(expected)} its "
            "description lists are missing)"
        )


def _drafter_keys(desc) -> list[str] | None:
    """The state_dict keys of the drafter a checkpoint's ``spec_drafters`` description describes (None
    when there is no usable description)."""
    try:
        names = {f.name for f in fields(DrafterConfig)}
        cfg = DrafterConfig(**{k: v for k, v in desc["drafter"].items() if k in names})
        with torch.device("meta"):
            return ["drafter." + k for k in _Shapes(cfg).state_dict()]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


class _Shapes(DFlashDrafter):
    """A drafter for its key names only: no initialisation (``normal_`` on the meta device would
    import torch's compiler, seconds, in a process that has not yet)."""

    def reset_parameters(self) -> None:
        pass


def with_stored_vocab(hparams: dict, ckpt: dict, ckpt_path: str | Path) -> dict:
    """A checkpoint's hyperparameters whose ``frequent_tokens`` draft vocabulary reads its ids from the
    checkpoint itself (``stored``) when the counts file it was chosen from is gone (model/vocab.py)."""
    vocab = hparams.get("draft_vocab")
    if not isinstance(vocab, dict) or str(vocab.get("class_path", "")).rsplit(".", 1)[-1] != "FrequentTokens":
        return hparams
    if "drafter.draft_ids" not in ckpt.get("state_dict", {}):
        return hparams
    init_args = {**(vocab.get("init_args") or {}), "stored": str(ckpt_path)}
    return {**hparams, "draft_vocab": {**vocab, "init_args": init_args}}


#: Where each module of the flat package (main before the split into layers, up to b8dab2d) went:
#: checkpoints written then name their components by those class paths.
MOVED_MODULES = {
    "drafter": "model.drafter",
    "attention": "model.attention",
    "masks": "model.masks",
    "kernels": "model.kernels",
    "vocab": "model.vocab",
    "target": "target.frozen",
    "targets": "target.loaders",
    "target_source": "target.labels",
    "injection": "target.injection",
    "anchors": "train.anchors",
    "noise": "train.noise",
    "losses": "train.losses",
    "verifiers": "decode.verifiers",
    "decoding": "decode.generate",
    "prompts": "data.prompts",
    "tracking": "lightning.tracking",
    "callbacks": "lightning.callbacks",
}


#: Classes that moved between modules since: their old class paths in checkpoints written before.
MOVED_CLASSES = {
    f"spec_drafters.train.losses.{name}": f"spec_drafters.train.acceptance_losses.{name}"
    for name in ("CAP", "DSparkConfidence", "TreeCoverage")
}


#: The injection aliases of the first release, merged into ``AllTaps`` (issue 34): the old class's name
#: -> the AllTaps argument its one argument was (ZLabTaps' num_taps defaulted to 5).
ALL_TAPS_ALIASES = {"ZLabTaps": ("num_taps", 5), "ExplicitTaps": ("layer_ids", None)}
ALL_TAPS = "spec_drafters.target.injection.AllTaps"


def upgrade_class_paths(value):
    """``spec_drafters.injection.AllTaps`` -> ``spec_drafters.target.injection.AllTaps`` (moved modules
    and classes), and a ZLabTaps or ExplicitTaps component -> the same AllTaps, anywhere in a
    checkpoint's hyperparameters (other packages' class paths are left alone)."""
    path = str(value.get("class_path", "")) if isinstance(value, dict) else ""
    if path.startswith("spec_drafters.") and path.rsplit(".", 1)[-1] in ALL_TAPS_ALIASES:
        field, default = ALL_TAPS_ALIASES[path.rsplit(".", 1)[-1]]
        given = (value.get("init_args") or {}).get(field, default)
        return {"class_path": ALL_TAPS, "init_args": {"layer_ids": None, "num_taps": None, field: given}}
    if isinstance(value, dict):
        return {k: upgrade_class_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [upgrade_class_paths(v) for v in value]
    if isinstance(value, str) and value in MOVED_CLASSES:
        return MOVED_CLASSES[value]
    if isinstance(value, str) and value.startswith("spec_drafters.") and value.count(".") == 2:
        _, module, name = value.split(".")
        if module in MOVED_MODULES:
            return f"spec_drafters.{MOVED_MODULES[module]}.{name}"
    return value
