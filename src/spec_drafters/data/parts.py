"""Corpora written in parts: each part a gzipped JSONL file written atomically, the parts joined into one
file deterministically. `reference-corpus` (data/reference_corpus.py) and `regenerate`
(data/regenerate.py) both answer prompts part by part this way, so that a killed run keeps every finished
part and a rerun continues.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path


def write_part(path: Path, records: list[dict], ensure_ascii: bool = True) -> None:
    """One part, gzip without a timestamp (same records, same bytes), written atomically: a killed run
    never leaves a half-written part."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write("".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in records).encode())
    os.replace(tmp, path)


def part_ids(path: Path) -> list[str] | None:
    """The ids a finished part holds, or None when there is none or it cannot be read (then it is
    answered again)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return [json.loads(line)["id"] for line in fh]
    except (OSError, EOFError, ValueError, KeyError):
        return None


def assemble(parts: list[Path], out: Path, each: Callable[[bytes], None] | None = None) -> dict:
    """Joins ``parts`` in order into ``out`` (deterministic gzip); returns the record count, the sha256
    of the uncompressed lines and the file's name. ``each`` sees every line (counts of the caller's)."""
    digest = hashlib.sha256()
    n = 0
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as dst:
        for part in parts:
            with gzip.open(part, "rb") as src:
                for line in src:
                    digest.update(line)
                    dst.write(line)
                    n += 1
                    if each is not None:
                        each(line)
    os.replace(tmp, out)
    return {"records": n, "sha256": digest.hexdigest(), "file": out.name}  # beside manifest.json
