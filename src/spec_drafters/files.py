"""File rules shared by the target's one-time conversion, the offline feature cache and the studies'
kept stages: an exclusive lock between processes, a file's sha256, and a JSON file written atomically."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive lock on ``path`` (created if missing) between processes on one machine, e.g. two
    FSDP ranks converting the target once, or two cache builders sharing a folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB pieces (GGUF identity, offline-cache shard checksums)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: Path, data, indent: int | None = 1) -> None:
    """``data`` as JSON in ``path``, atomically: a kill never leaves a half-written file (a sibling
    ``.tmp`` file is renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    os.replace(tmp, path)
