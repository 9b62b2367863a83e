"""Where ``export`` may write, decided before any work: nothing is overwritten without being asked.

- ``--out`` that is the source itself, inside it or around it (resolved paths): refused, ``--force``
  or not (writing over the source loses what is being read). A file is refused by the CLI's
  ``out_folder``, as every command's ``--out`` folder is.
- a non-empty ``--out``: refused unless ``--force``; then the drafter files of an earlier export or
  calibration (``FOLDER_FILES``: config.json, model.safetensors, calibration.json, whichever layout
  wrote them) are replaced, and every other file is kept and named.
- a non-empty folder of a drafter registry (``registry/drafters/NAME``, as this repository ships
  ``smollm2-reference``): refused unless ``--force --overwrite_registry``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from spec_drafters.artefacts.folders import FOLDER_FILES
from spec_drafters.errors import InputError


def in_registry(path: Path) -> bool:
    """A folder of a drafter registry (``.../registry/drafters/NAME``) or inside one."""
    return any(p.name == "drafters" and p.parent.name == "registry" for p in path.resolve().parents)


def check_out(source: Path, out: Path, force: bool, overwrite_registry: bool) -> list[Path]:
    """Refuses an ``--out`` that export may not write; returns the files ``--force`` will replace.
    ``out`` is a folder or nothing yet (the CLI checks that first, as for every command's --out)."""
    src, dst = source.resolve(), out.resolve()
    if dst == src or src in dst.parents or dst in src.parents:
        where = "is" if dst == src else "is inside" if src in dst.parents else "holds"
        raise InputError(
            f"--out {out}: {where} the source {source}; export never writes over what it reads "
            "(--force or not): choose another folder"
        )
    present = sorted(out.iterdir()) if out.is_dir() else []
    if not present:
        return []
    names = ", ".join(p.name for p in present[:6]) + (", ..." if len(present) > 6 else "")
    if in_registry(out) and not (force and overwrite_registry):
        raise InputError(
            f"--out {out}: a shipped drafter of the registry ({names}); replacing it takes --force "
            "--overwrite_registry"
        )
    if not force:
        raise InputError(
            f"--out {out}: not empty ({names}); pass --force to replace the drafter files an earlier "
            f"export or calibration wrote there ({', '.join(FOLDER_FILES)}; other files are kept)"
        )
    return [p for p in present if p.name in FOLDER_FILES and p.is_file()]


def replace_files(out: Path, stale: list[Path]) -> None:
    """Removes ``stale`` (check_out's list) just before the new files are written, naming what stays."""
    for path in stale:
        path.unlink()
    if stale:
        print(f"replaced in {out}: {', '.join(p.name for p in stale)}")
    kept = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if kept:
        print(f"kept in {out} (not export's): {', '.join(kept)}")


def carry_calibration(source: Path, out: Path, cast: bool) -> None:
    """A source folder's calibration.json (temperatures of these weights) goes along with them; after
    a dtype cast it is left behind, and said so, since it was measured at the source's precision."""
    calibration = source / "calibration.json"
    if not (source.is_dir() and calibration.is_file()):
        return
    if cast:
        print(f"note: {calibration} not carried (measured before the --dtype cast); run calibrate on {out}")
        return
    shutil.copyfile(calibration, out / "calibration.json")  # a new file: its mode follows the umask
    print(f"carried {calibration} along")
