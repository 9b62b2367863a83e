"""``export``, ``inspect``, ``diff`` and ``lint``: the questions the seeds answered by hand, one command each.

The reports themselves are plain functions in ``spec_drafters.artefacts`` (inspect.py, diff.py,
lint.py); this module parses the command lines and builds the setup a config file describes.

    spec-drafters export CKPT_OR_FOLDER --out DIR [--layout spec_drafters|zlab|speculators] [--force]
    spec-drafters inspect PATH [PATH ...] [--json]
    spec-drafters diff A B [--all] [--json]
    spec-drafters lint CONFIG [CONFIG ...] [--model.* ...] [--strict] [--json]  (or --config CONFIG)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spec_drafters.artefacts.diff import Row, diff_choices, file_choices, format_diff, setup_choices
from spec_drafters.artefacts.inspect import format_inspect, inspect_drafter, inspect_setup
from spec_drafters.artefacts.lint import Finding, allow, lint_setup, special_tokens, text_sample
from spec_drafters.cli.checks import config_paths, out_folder, read_config
from spec_drafters.cli.setup_args import is_config, load_setup, meta_target_args, setup_from_config
from spec_drafters.errors import ArgumentError, InputError

# --- export ------------------------------------------------------------------------------------------


def export_parser() -> argparse.ArgumentParser:
    from spec_drafters.artefacts.folders import LAYOUTS

    ap = argparse.ArgumentParser(
        prog="spec-drafters export",
        description="Write a drafter (Lightning checkpoint or drafter folder) as config.json and "
        "model.safetensors. A non-empty --out is refused unless --force; the source itself never "
        "(docs/interop.md#export).",
    )
    ap.add_argument("source", help="a Lightning checkpoint (.ckpt) or a drafter folder of any layout")
    ap.add_argument("--out", required=True, help="the folder to write (not the source, not inside it)")
    ap.add_argument("--layout", choices=LAYOUTS, default="spec_drafters")
    ap.add_argument("--num_target_layers", type=int, help="the target's depth (speculators folders omit it)")
    ap.add_argument(
        "--verifier",
        help="speculators layout: the target's model folder (or the embedded target's card name), checked "
        "against the drafter, named in speculators_config.verifier, and the source of a draft "
        "vocabulary's head rows (lm_head.weight), which vLLM needs. Default: the embedded target when "
        "the drafter was trained on it",
    )
    ap.add_argument(
        "--verifier_name",
        help="the name recorded as speculators_config.verifier.name_or_path (e.g. a hub id) instead of "
        "the --verifier folder's path",
    )
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="cast the weights (integer tensors such as a draft vocabulary's ids stay as they are)",
    )
    ap.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out: its config.json, model.safetensors and calibration.json are "
        "replaced, other files kept",
    )
    ap.add_argument(
        "--overwrite_registry",
        action="store_true",
        help="with --force, also replace a shipped drafter of a registry (registry/drafters/NAME)",
    )
    return ap


def export(argv: list[str]) -> None:
    import torch

    from spec_drafters.artefacts.export import carry_calibration, check_out, replace_files
    from spec_drafters.artefacts.folders import folder_from_checkpoint, layout_files, read_folder, write_files

    args = export_parser().parse_args(argv)
    src, out = Path(args.source), Path(args.out)
    if not src.exists():
        raise InputError(f"{src}: no such file or folder (export reads a checkpoint or a drafter folder)")
    out_folder(out)  # a file, or a folder that cannot be written: before any work
    stale = check_out(src, out, args.force, args.overwrite_registry)
    try:
        folder = read_folder(src, args.num_target_layers) if src.is_dir() else folder_from_checkpoint(src)
    except InputError:
        raise
    except ValueError as e:  # a config its drafter class refuses (DrafterConfig.validate)
        raise InputError(f"{src}: {e}") from None
    if args.dtype:
        dtype = getattr(torch, args.dtype)
        for tensors in (folder.state, folder.aux):
            tensors.update({k: v.to(dtype) for k, v in tensors.items() if v.is_floating_point()})
    verifier = (
        export_verifier(folder, args.verifier, args.verifier_name) if args.layout == "speculators" else None
    )
    try:
        # a layout that cannot hold it: nothing removed
        config, state = layout_files(folder, args.layout, verifier)
    except ValueError as e:
        raise InputError(f"--layout {args.layout}: {e}") from None
    cfg = folder.config
    mixed = cfg.causal_block_layers and len(cfg.causal_block_layers) < cfg.num_layers
    if args.layout == "speculators" and mixed:
        print(
            "WARNING: vLLM (0.32; vllm#56692) reads sliding_window_non_causal=false as causal for every "
            f"layer: this drafter's full-attention layers (all but {cfg.causal_block_layers}) would draft "
            "with a causal mask there"
        )
    replace_files(out, stale)
    write_files(out, config, state, args.layout)
    carry_calibration(src, out, cast=bool(args.dtype))
    print(f"wrote {out} ({args.layout} layout, {len(folder.state)} drafter tensors)")


def export_verifier(folder, where: str | None, name: str | None = None):
    """The target a speculators export names (artefacts/verifier.py): ``where`` (--verifier: a model
    folder or the embedded target's card name), else the embedded target when the drafter was trained
    on it; without one, says what the folder lacks. ``name``: --verifier_name."""
    from spec_drafters.artefacts.verifier import read_verifier
    from spec_drafters.target.loaders import EmbeddedSmolLM2

    trained_on = (folder.meta.get("target") or {}).get("name")
    if where is None and trained_on == EmbeddedSmolLM2.card_name:
        where = EmbeddedSmolLM2.card_name
    if where is None:
        lacks = ""
        if folder.config.draft_vocab_size:
            lacks = " and lm_head.weight (vLLM cannot serve its draft vocabulary)"
        print(
            f"note: no --verifier: speculators_config.verifier names {trained_on!r} with no architectures"
            f"{lacks}; pass --verifier TARGET_FOLDER for a folder an engine loads as-is"
        )
        return None
    folder_path = EmbeddedSmolLM2().folder() if where == EmbeddedSmolLM2.card_name else Path(where)
    verifier = read_verifier(folder_path, name)
    print(f"verifier: {verifier.name_or_path} ({', '.join(verifier.architectures) or 'no architectures'})")
    return verifier


# --- inspect -----------------------------------------------------------------------------------------


def inspect_path(path: str | Path) -> dict:
    """The inspect report of a drafter folder, a checkpoint or a config file (built, untrained)."""
    return inspect_setup(setup_from_config(path), str(path)) if is_config(path) else inspect_drafter(path)


def inspect_cmd(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="spec-drafters inspect",
        description="What a drafter is, read from its weights' shapes first (fc.weight says how many "
        "target layers are injected) and checked against its config; every disagreement is a WARNING.",
    )
    ap.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a drafter folder (any layout), a checkpoint or a config YAML",
    )
    ap.add_argument("--json", action="store_true", help="print the reports as JSON")
    args = ap.parse_args(argv)
    reports = [inspect_path(p) for p in args.paths]
    if args.json:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        print("\n\n".join(format_inspect(r) for r in reports))


# --- diff --------------------------------------------------------------------------------------------


def choices(path: str | Path) -> dict:
    """Every choice of a config YAML (built), a drafter folder or a checkpoint."""
    return setup_choices(setup_from_config(path)) if is_config(path) else file_choices(path)


def diff(a: str | Path, b: str | Path, everything: bool = False) -> list[Row]:
    """The choices that differ between two configs, drafter folders or checkpoints (all of them with
    ``everything``)."""
    for path in (a, b):  # both, before building either
        if not Path(path).exists():
            raise InputError(
                f"{path}: no such file or folder (diff reads config YAMLs, drafter folders, checkpoints)"
            )
    return diff_choices(choices(a), choices(b), everything)


def diff_cmd(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(
        prog="spec-drafters diff",
        description="Every architectural and training choice that differs between two drafters or configs.",
    )
    ap.add_argument("a", metavar="A", help="a config YAML, a drafter folder or a checkpoint")
    ap.add_argument("b", metavar="B", help="the same kinds as A")
    ap.add_argument("--all", action="store_true", help="list the equal choices too")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    rows = diff(args.a, args.b, everything=args.all)
    if args.json:
        print(json.dumps([{"choice": k, "a": a, "b": b} for k, a, b in rows], indent=2, default=str))
    else:
        print(format_diff(args.a, args.b, rows))


# --- lint --------------------------------------------------------------------------------------------


def lint_config(argv: list[str]) -> list[Finding]:
    """The findings of the setup that validate's arguments (``--config``, ``--model.*``) build; a
    setup that refuses to build is one ``config-invalid`` (or ``mask-token-outside-vocab``) error."""
    from spec_drafters.target.cards import MaskTokenError

    paths = config_paths(argv)
    for p in paths:
        read_config(p)  # malformed YAML: one line naming the file and line
    try:
        setup = load_setup([*argv, *meta_target_args(paths)], quiet=True)
    except (ValueError, KeyError) as e:  # the setup refuses to build: report why, as lint would
        own = e.__cause__ if isinstance(e, ArgumentError) else e
        code = "mask-token-outside-vocab" if isinstance(own, MaskTokenError) else "config-invalid"
        return allow(paths, [Finding("error", code, e.flagged() if isinstance(e, ArgumentError) else str(e))])
    data_path = None
    for p in paths:
        data = read_config(p).get("data")
        data_path = data.get("path", data_path) if isinstance(data, dict) else data_path
    data_path = flag_value(argv, "--data.path") or data_path
    sample = text_sample(data_path) if setup.tokenizer is not None else None
    findings = lint_setup(setup, sample)
    if setup.tokenizer is not None:
        findings += special_tokens(data_path, setup.tokenizer)
    return allow(paths, decoding_is_an_error(paths, findings))


def flag_value(argv: list[str], flag: str) -> str | None:
    """The last value given to ``flag`` (``--flag V`` or ``--flag=V``), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def decoding_is_an_error(paths: list[str], findings: list[Finding]) -> list[Finding]:
    """``decoding-unsupported`` is a warning for a config that only trains, an error for one whose
    validation decodes (a SpeculativeDecodingEval callback): that run would stop at its first decode."""
    decodes = any(
        "SpeculativeDecodingEval" in str((read_config(p).get("trainer") or {}).get("callbacks"))
        for p in paths
    )
    for f in findings:
        if decodes and f.code == "decoding-unsupported":
            f.severity = "error"
            f.message += " (this config decodes in validation: SpeculativeDecodingEval)"
    return findings


def lint_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="spec-drafters lint",
        usage="%(prog)s [CONFIG ...] [--config CONFIG ...] [--model.* ...] [--strict] [--json]",
        description="Known pitfalls of a config before a long run, each with a severity and a one-line "
        "why; exits 1 on errors. A config allows a warning it makes on purpose with a "
        "'# lint: allow CODE' comment. Configs are given as paths (as inspect and diff take them) or "
        "with --config; --config and --model.* are LightningCLI's.",
        allow_abbrev=False,
    )
    ap.add_argument("--strict", action="store_true", help="fail on warnings too (a CI gate)")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    return ap


def config_args(rest: list[str]) -> list[str]:
    """LightningCLI arguments with every bare path (``lint configs/x.yaml``) as ``--config PATH``: a
    token that is no flag and no flag's value (``--model.lr 0.1``; ``--model.lr=0.1`` holds its own)."""
    out, i = [], 0
    while i < len(rest):
        arg = rest[i]
        if arg.startswith("-"):
            takes_value = "=" in arg or i + 1 >= len(rest)
            out += [arg] if takes_value else [arg, rest[i + 1]]
            i += 1 if takes_value else 2
        else:
            out += ["--config", arg]
            i += 1
    return out


def lint_cmd(argv: list[str]) -> None:
    ap = lint_parser()
    args, rest = ap.parse_known_args(argv)
    rest = config_args(rest)
    if not config_paths(rest):
        ap.error("a config is required (lint CONFIG or --config CONFIG)")
    findings = lint_config(rest)
    if args.json:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
    else:
        print("\n".join(map(str, findings)) or "no findings")
    count = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "allowed")}
    print(
        f"{count['error']} error(s), {count['warning']} warning(s), {count['allowed']} allowed",
        file=sys.stderr,
    )
    # --strict: a CI gate, where a warning (v5's fc over 4 of 5 taps, labels from layer 61) must fail too.
    if count["error"] or (args.strict and count["warning"]):
        sys.exit(1)
