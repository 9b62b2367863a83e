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
