"""Naming the flag an error came through.

Components raise plain errors about their own arguments: the same class serves under several flags
(``LayerLogits`` as ``target_source`` and ``val_target_source``, ``DDTree`` as ``verifier`` and inside
``eval_verifiers``), so only the CLI, which parsed the flags, can name the flag. An error reaches the
CLI in one of two ways:

- the LightningModule called the component inside ``errors.argument(name)``: an ``ArgumentError``,
  which ``spec-drafters`` prints as ``--model.<name>: <message>``;
- jsonargparse called the component's constructor while instantiating the parsed config. It adds no
  flag, and under a union type (``list[Verifier] | None``) it wraps the error in "Does not validate
  against any of the Union subtypes". :func:`instantiation_error` recovers the component's own error
  and the key jsonargparse was instantiating, from the frames of the traceback: the parser action
  being instantiated (``ActionTypeHint.instantiate_classes``, its ``dest``), the list index being
  adapted (``adapt_typehints``, its ``n``), and nested components (an action of a component's own
  parser) joined by ``init_args``. Checked by tests/test_flags.py against the installed jsonargparse.
"""

from __future__ import annotations

import argparse
import traceback

from spec_drafters.errors import ArgumentError, InputError


def instantiation_error(error: BaseException) -> ValueError | None:
    """The component's own ValueError in ``error``, tagged with the flag it was given by (an
    ArgumentError for ``--model.*``, else an InputError naming the flag); None when ``error`` did not
    come from a component's constructor called by jsonargparse."""
    found = _component_error(error)
    if found is None:
        return None
    key, own = found
    if not isinstance(own, ValueError):
        return None
    named = (
        ArgumentError(key[len("model.") :], str(own))
        if key.startswith("model.")
        else InputError(f"--{key}: {own}")
    )
    named.__cause__ = own
    return named


def _component_error(error: BaseException) -> tuple[str, BaseException] | None:
    """(dotted key, the error the component raised), walking the cause chain outward-in: every
    jsonargparse frame on the way says which key and list entry it was instantiating."""
    parts: list[str] = []
    while error is not None:
        for frame, _ in traceback.walk_tb(error.__traceback__):
            _read_frame(frame, parts)
        if not _raised_by_jsonargparse(error):
            return (".init_args.".join(parts), error) if parts else None
        error = error.__cause__
    return None


def _read_frame(frame, parts: list[str]) -> None:
    if not _in_jsonargparse(frame):
        return
    name, local = frame.f_code.co_name, frame.f_locals
    if name == "instantiate_classes" and isinstance(local.get("self"), argparse.Action):
        parts.append(local["self"].dest)  # "model.verifier"; a nested component's is "main"
    elif name == "adapt_typehints" and parts and isinstance(local.get("val"), list) and "n" in local:
        parts[-1] += f"[{local['n']}]"  # the list entry being adapted


def _in_jsonargparse(frame) -> bool:
    return frame.f_globals.get("__name__", "").partition(".")[0] == "jsonargparse"


def _raised_by_jsonargparse(error: BaseException) -> bool:
    frames = list(traceback.walk_tb(error.__traceback__))
    return bool(frames) and _in_jsonargparse(frames[-1][0])
