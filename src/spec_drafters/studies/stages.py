"""The one resume scheme of the studies (experiments/) and the long benchmarks: a folder of kept stages.

A study is a list of named stages (a fit, a cache build, a piece of a decoding run). When a stage
finishes, its result is written atomically to ``<folder>/<name>.json`` together with what it was
measured with (its *identity*: config hashes, steps, the drafter's sha256, ...), the git commit, the
command and its wall time. Run the study again and every kept stage is read back instead of run, so a
killed study continues, and a fresh clone continues from the committed folder. A kept stage whose
identity differs from the one asked for now is refused with the differing keys named: results of
another setting are never merged into a table (docs/experiments.md "Resuming").

Bulky outputs a stage needs while it runs (checkpoints, caches) live elsewhere (git-ignored run
folders) and resume by their own means (Lightning's ``last.ckpt``, the cache's shards); the kept stage
is the result alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from spec_drafters.files import write_json
from spec_drafters.studies.results import command_line, git_sha

IDENTITY = "identity.json"  # the folder-wide identity, when a study has one


def stage_record(
    result: dict,
    identity: dict | None = None,
    seconds: float | None = None,
    git_sha: str | None = None,
    command: str | None = None,
    finished: str | None = None,
) -> dict:
    """A kept stage's file: its result and what it was measured with (None: not recorded)."""
    return {"result": result, "identity": identity, "seconds": seconds, "git_sha": git_sha,
            "command": command, "finished": finished}  # fmt: skip


class IdentityMismatch(SystemExit):
    """A kept stage (or folder) was measured with other settings than asked for now."""


def differing(kept: dict, now: dict, optional: frozenset[str] = frozenset()) -> list[str]:
    """Keys whose values differ; a key in ``optional`` absent from ``kept`` (recorded only since a later
    version) is not a difference."""
    keys = set(kept) | set(now)
    return sorted(k for k in keys if not (k in optional and k not in kept) and kept.get(k) != now.get(k))


class Stages:
    """Kept stages in ``folder``; ``identity`` (optional) is what every stage of the folder shares,
    checked against ``identity.json`` (written on first use); ``optional`` keys of it may be missing
    from an older folder's file."""

    def __init__(self, folder: Path, identity: dict | None = None, optional: frozenset[str] = frozenset()):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        if identity is not None:
            self._check_folder(identity, optional)

    def _check_folder(self, identity: dict, optional: frozenset[str]) -> None:
        file = self.folder / IDENTITY
        if not file.is_file():
            write_json(file, identity)
            return
        diff = differing(json.loads(file.read_text()), identity, optional)
        if diff:
            raise IdentityMismatch(
                f"{self.folder} holds stages measured with other settings (differs in {', '.join(diff)}): "
                "use another folder or name, or move this one away to measure again"
            )

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def kept(self, name: str, identity: dict | None = None) -> dict | None:
        """The kept stage ``name`` (its whole record: result, identity, git_sha, command, seconds,
        finished), None when it has not finished; refused when kept with another identity."""
        file = self.path(name)
        if not file.is_file():
            return None
        entry = json.loads(file.read_text())
        if identity is not None and (diff := differing(entry.get("identity") or {}, identity)):
            raise IdentityMismatch(
                f"{file} was measured with other settings than now (differs in {', '.join(diff)}): "
                "move it away to run it again"
            )
        return entry

    def run(self, name: str, fn: Callable[[], dict | None], identity: dict | None = None) -> dict:
        """The stage's record (``["result"]`` is ``fn()``'s dict, ``["seconds"]`` its wall time), ``fn``
        run only when ``name`` is not kept yet (then kept)."""
        entry = self.kept(name, identity)
        if entry is None:
            t0 = time.perf_counter()
            result = fn() or {}
            seconds, finished = time.perf_counter() - t0, time.strftime("%Y-%m-%dT%H:%M:%S")
            entry = stage_record(result, identity, seconds, git_sha(), command_line(), finished)
            write_json(self.path(name), entry)
        return entry

    def upgrade_flat(self, identity_keys: tuple[str, ...] = ()) -> int:
        """Kept files written before this scheme (one flat dict: the result beside ``git_sha``,
        ``seconds`` and the ``identity_keys``) rewritten as stage records, values unchanged; returns
        how many. The first studies kept their rows that way (experiments/ablation.py, data_source.py)."""
        n = 0
        for file in sorted(self.folder.glob("*.json")):
            row = json.loads(file.read_text())
            if file.name == IDENTITY or "result" in row:
                continue
            meta = {"git_sha", "seconds", *identity_keys}
            identity = {k: row[k] for k in identity_keys if k in row} or None
            result = {k: v for k, v in row.items() if k not in meta}
            write_json(file, stage_record(result, identity, row.get("seconds"), row.get("git_sha")))
            n += 1
        return n

    def missing(self, names: list[str]) -> list[str]:
        return [n for n in names if not self.path(n).is_file()]
