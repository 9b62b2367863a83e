"""``diff``: every architectural and training choice that differs between two drafters or configs.

Plain functions over files (a drafter folder of any layout, a Lightning checkpoint) and over a built
:class:`~spec_drafters.artefacts.setup.DrafterSetup`; building one from a config file is the CLI's job
(``spec-drafters diff``, cli/setup_args.py). Also the column labels that
``diff`` and ``compare`` share.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from spec_drafters.artefacts.checkpoints import read_checkpoint_file
from spec_drafters.artefacts.folders import read_config_json, read_folder
from spec_drafters.artefacts.setup import DrafterSetup
from spec_drafters.registry import as_config

Row = tuple[str, object, object]  # (choice, value in a, value in b); "-" where one side lacks it


def setup_choices(setup: DrafterSetup) -> dict:
    """Every choice of a built setup."""
    hp = {k: as_config(v) for k, v in setup.settings.items()}
    return _choices(setup.describe(), hp)


def file_choices(path: str | Path) -> dict:
    """Every choice of a drafter folder (any layout) or a Lightning checkpoint."""
    path = Path(path)
    if path.is_dir():
        folder = read_folder(path, num_target_layers=None if _has_depth(path) else 0)
        desc = {
            "target": {**folder.meta.get("target", {}), "num_layers": folder.num_target_layers or None},
            "fc_ids": folder.fc_ids,
            "drafter": asdict(folder.config),
            "components": folder.meta.get("components", {}),
        }
        return _choices(desc, {})
    ckpt = read_checkpoint_file(path)
    return _choices(ckpt.get("spec_drafters") or {}, ckpt.get("hyper_parameters") or {})


def _choices(desc: dict, hp: dict) -> dict:
    """A drafter description and its hyperparameters as flat ``choice -> value`` (no Nones)."""
    out: dict = {}
    target = desc.get("target", {})
    out["target.name"] = target.get("name")
    out["target.num_layers"] = target.get("num_layers")
    out["tapped_layer_ids"] = target.get("tap_ids")
    out["fc_layer_ids"] = desc.get("fc_ids")
    out["fc_layers"] = len(desc["fc_ids"]) if desc.get("fc_ids") else None
    for k, v in (desc.get("drafter") or {}).items():
        out[f"drafter.{k}"] = v
    for k, v in (desc.get("components") or {}).items():
        out[f"component.{k}"] = v
    for k, v in hp.items():
        if k not in ("target", "drafter"):
            _flatten(f"config.{k}", v, out)
    return {k: v for k, v in out.items() if v is not None}


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict) and "class_path" in value:
        out[prefix] = value["class_path"].rsplit(".", 1)[-1]
        for k, v in (value.get("init_args") or {}).items():
            _flatten(f"{prefix}.{k}", v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = value


def _has_depth(path: Path) -> bool:
    config = read_config_json(path / "config.json") if (path / "config.json").is_file() else {}
    return config.get("speculators_model_type") != "dflash" or "num_target_layers" in config


def diff_choices(a: dict, b: dict, everything: bool = False) -> list[Row]:
    """The choices that differ (all of them with ``everything``), sorted by name."""
    rows = []
    for key in sorted(a.keys() | b.keys()):
        va, vb = a.get(key, "-"), b.get(key, "-")
        if everything or va != vb:
            rows.append((key, va, vb))
    return rows


def format_diff(a, b, rows: list[Row]) -> str:
    if not rows:
        return f"no differences between {a} and {b}"
    la, lb = distinct_labels([Path(a), Path(b)])
    width = max(len(r[0]) for r in rows)
    va = max(12, len(la), *(len(str(r[1])) for r in rows))
    lines = [f"{'choice':<{width}}  {la:<{va}}  {lb}"]
    lines += [f"{k:<{width}}  {x!s:<{va}}  {y}" for k, x, y in rows]
    return "\n".join([*lines, legend([la, lb], [a, b])])


# --- column labels, shared with compare --------------------------------------------------------------


def distinct_labels(paths: list[Path]) -> list[str]:
    """Column labels: each path's shortest tail that no other path ends with (``a/last.ckpt`` and
    ``b/last.ckpt`` where names alone would be ``last.ckpt`` twice); the same path twice gets ``#2``."""
    parts = [p.parts for p in paths]
    labels = []
    for own in parts:
        others = [q for q in parts if q != own]  # the same path again is numbered below instead
        n = next((n for n in range(1, len(own)) if all(q[-n:] != own[-n:] for q in others)), len(own))
        labels.append(str(Path(*own[-n:])))
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        labels[i] = label if seen[label] == 1 else f"{label}#{seen[label]}"
    return labels


def legend(labels: list[str], paths: list) -> str:
    """One line saying which file each column is."""
    return "columns: " + ", ".join(f"{label} = {path}" for label, path in zip(labels, paths, strict=True))
