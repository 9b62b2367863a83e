"""Bad input: a file, flag or field the user gave that cannot be used, said in one line.

``spec-drafters`` prints an InputError as ``spec-drafters: error: <message>`` and exits 1, without a
traceback: the message names the flag, the file and its line or field, which is all the user needs.
A ValueError, so that library callers catching ValueError keep working.
"""

from __future__ import annotations

import json
from pathlib import Path


class InputError(ValueError):
    """A file, flag or field that cannot be used; the message names it (file:line, or the field)."""


class MissingFile(InputError, FileNotFoundError):
    """A file or folder the user named is not there. Also a FileNotFoundError, so callers catching
    that keep working; an InputError, so the CLI prints one line (tagged with the flag by
    :class:`argument` where it came through a component)."""


def read_json(path: str | Path):
    """A user's JSON file; a missing file, bad bytes or malformed JSON name the file (and line)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None


class ArgumentError(InputError):
    """A component's plain error, tagged with the constructor argument it came through.

    Components never spell command-line flags: the same class serves as ``target_source`` and as
    ``val_target_source``, a verifier as ``verifier`` and inside ``eval_verifiers``. Whoever calls a
    component wraps the call in :func:`argument`; the entry point that parsed the flags turns
    ``.argument`` into its own spelling (the CLI: ``--model.<argument>``).
    """

    def __init__(self, argument: str, message: str):
        super().__init__(message)
        self.argument = argument

    def flagged(self, prefix: str = "--model.") -> str:
        return f"{prefix}{self.argument}: {self.args[0]}"


class argument:
    """``with argument("injection"): injection.fc_ids(card)``: a ValueError (InputError included)
    raised inside becomes an :class:`ArgumentError` naming ``injection``. Already tagged errors keep
    their (innermost) argument."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or isinstance(error, ArgumentError) or not isinstance(error, ValueError):
            return False
        raise ArgumentError(self.name, str(error)) from error
