"""``spec-drafters``: LightningCLI for fit/validate/test, plus ``registry``, ``compare`` and ``corpus``.

    spec-drafters fit --config configs/quickstart.yaml
    spec-drafters validate --config configs/quickstart.yaml --ckpt_path runs/quickstart/checkpoints/last.ckpt
    spec-drafters generate --config CONFIG --ckpt_path CKPT (--prompt TEXT | --prompts FILE | --humaneval N)
    spec-drafters export CKPT_OR_FOLDER --out DIR [--layout spec_drafters|zlab|speculators]
    spec-drafters inspect PATH [--json]
    spec-drafters diff A B [--all] [--json]
    spec-drafters lint --config CONFIG [--strict] [--json]
    spec-drafters registry [--json]
    spec-drafters compare untrained.json trained.json
    spec-drafters corpus --out data/stdlib_smollm2.jsonl.gz

Before LightningCLI parses anything, every component choice in the config files and ``--model.*``
overrides is checked against the registry, so that an unknown name fails with the list of valid ones
(jsonargparse alone only says "expected a dot import path").
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import typing
import warnings
from pathlib import Path

import torch
import yaml
from jsonargparse import lazy_instance
from lightning.pytorch.cli import LightningCLI

from spec_drafters.registry import (
    KINDS,
    UnknownComponentError,
    entries,
    load_components,
    lookup,
    name_of,
    valid_names,
)
from spec_drafters.tracking import RunAimLogger


# --- component-name checks ------------------------------------------------------------------------
def _component_base(annotation) -> type | None:
    return annotation if inspect.isclass(annotation) and hasattr(annotation, "component_kind") else None


def _resolve(base: type, name: str, flag: str) -> type:
    kind = base.component_kind
    try:
        return lookup(kind, name)
    except UnknownComponentError:
        pass
    if "." in name:  # a class path outside the registry: a plugin or a user's subclass
        module, _, attr = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise UnknownComponentError(
                f"{flag}: cannot import {name!r} ({e}); registered {kind}: {valid_names(kind)}"
            ) from None
        if not (inspect.isclass(cls) and issubclass(cls, base)):
            raise UnknownComponentError(f"{flag}: {name!r} is not a {base.__qualname__}")
        return cls
    raise UnknownComponentError(f"{flag}: unknown {kind} {name!r}; valid: {valid_names(kind)}")


def check_components(cls: type, init_args: dict, flag: str) -> None:
    """Walks ``init_args`` of ``cls`` and resolves every value whose parameter is a component kind."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: nothing we can check
        return
    for key, value in (init_args or {}).items():
        base = _component_base(hints.get(key))
        if base is None or value is None:
            continue
        name = (
            value if isinstance(value, str) else value.get("class_path") if isinstance(value, dict) else None
        )
        if name is None:
            continue
        chosen = _resolve(base, name, f"{flag}.{key}")
        if isinstance(value, dict):
            check_components(chosen, value.get("init_args") or {}, f"{flag}.{key}.init_args")


def _configs_from_argv(argv: list[str]) -> list[dict]:
    configs, i = [], 0
    while i < len(argv):
        arg = argv[i]
        path = None
        if arg in ("--config", "-c") and i + 1 < len(argv):
            path, i = argv[i + 1], i + 1
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg.startswith("--model.") and "=" not in arg and i + 1 < len(argv):
            configs.append(_dotted(arg[2:], argv[i + 1]))
            i += 1
        elif arg.startswith("--model.") and "=" in arg:
            key, value = arg[2:].split("=", 1)
            configs.append(_dotted(key, value))
        if path and Path(path).is_file():
            configs.append(yaml.safe_load(Path(path).read_text()) or {})
        i += 1
    return configs


def _dotted(key: str, value: str) -> dict:
    parts = key.split(".")
    if parts[-1] == "class_path":
        parts, value = parts[:-1], {"class_path": value}
    out: dict = {parts[-1]: value}
    for p in reversed(parts[:-1]):
        out = {p: out}
    return out


def check_argv_components(argv: list[str]) -> None:
    from spec_drafters.module import DFlashModule

    for cfg in _configs_from_argv(argv):
        check_components(DFlashModule, cfg.get("model") or {}, "--model")
        trainer = cfg.get("trainer")
        trainer = (
            trainer if isinstance(trainer, dict) else {}
        )  # a preset file path is checked by jsonargparse
        for i, cb in enumerate(trainer.get("callbacks") or []):
            if isinstance(cb, dict) and "class_path" in cb:
                try:
                    cls = _resolve_class(cb["class_path"])
                except (ImportError, AttributeError):
                    continue  # LightningCLI reports unknown callbacks itself
                check_components(cls, cb.get("init_args") or {}, f"--trainer.callbacks[{i}].init_args")


def _resolve_class(path: str) -> type:
    if "." not in path:
        import lightning.pytorch.callbacks as builtin

        from spec_drafters import callbacks

        return getattr(callbacks, path, None) or getattr(builtin, path)
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


# --- LightningCLI ------------------------------------------------------------------------------------
#: Model arguments that belong to this run, not to the checkpoint: where the target is loaded from (a
#: path on this machine; its identity is still checked against the checkpoint) and how drafts are
#: evaluated. Everything else that shapes the drafter comes from the checkpoint.
RUN_TIME_ARGS = (
    "target",
    "verifier",
    "eval_verifiers",
    "val_anchors",
    "val_target_source",
    "init_from",
    "shard_target",
    "activation_checkpointing",
    "loss_chunk_rows",
)


class SpecDraftersCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {k: v for k, v in LightningCLI.subcommands().items() if k in ("fit", "validate", "test")}

    def _parse_ckpt_path(self) -> None:
        """With ``--ckpt_path``, LightningCLI replaces the model arguments by the checkpoint's, which
        would silently ignore ``validate --model.verifier DDTree``. Keep this run's RUN_TIME_ARGS."""
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = torch.load(ckpt_path, weights_only=True, map_location="cpu").get("hyper_parameters", {})
        hparams = {k: v for k, v in hparams.items() if k not in RUN_TIME_ARGS and not k.startswith("_")}
        if hparams:
            self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)

    def add_arguments_to_parser(self, parser) -> None:
        # Aim by default, its repository in the run folder; --trainer.logger CSVLogger or
        # TensorBoardLogger (or a list) instead, --trainer.logger false for none.
        parser.set_defaults({"trainer.logger": lazy_instance(RunAimLogger)})
        parser.add_argument(
            "--results",
            type=str | None,
            default=None,
            help="Write the final metrics and the drafter's description to this JSON file.",
        )

    def _write_results(self) -> None:
        path = self.config[self.subcommand].get("results")
        if not path or not self.trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in sorted(self.trainer.callback_metrics.items())}
        payload = {
            "subcommand": self.subcommand,
            "ckpt_path": self.config[self.subcommand].get("ckpt_path"),
            "last_checkpoint": getattr(self.trainer.checkpoint_callback, "last_model_path", None) or None,
            "metrics": metrics,
            "calibration": getattr(self.model, "calibration", {}),
            "drafter": self.model.describe(),
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"results written to {path}")

    def instantiate_trainer(self, **kwargs):
        trainer = super().instantiate_trainer(**kwargs)
        for logger in trainer.loggers:
            if isinstance(logger, RunAimLogger):
                logger.place_in(trainer.default_root_dir)
        return trainer

    def after_validate(self) -> None:
        self._write_results()

    def after_test(self) -> None:
        self._write_results()

    def after_fit(self) -> None:
        self._write_results()


def validate_many(argv: list[str]) -> None:
    """``validate ... --drafters A B ...``: the same evaluation for several drafters, side by side.

    Each of A, B, ... is a Lightning checkpoint (.ckpt), a drafter folder of any layout (an imported
    reference drafter, say), or ``untrained``. Same config, seed and data for all; results go to
    ``--results DIR`` (default runs/validate_many) as <name>.json, then one table.
    """
    i = argv.index("--drafters")
    j = next((n for n in range(i + 1, len(argv)) if argv[n].startswith("--")), len(argv))
    drafters, rest = argv[i + 1 : j], argv[:i] + argv[j:]
    if not drafters:
        sys.exit("spec-drafters: error: --drafters needs at least one checkpoint, folder or 'untrained'")
    out_dir = Path("runs/validate_many")
    if "--results" in rest:
        k = rest.index("--results")
        out_dir, rest = Path(rest[k + 1]), rest[:k] + rest[k + 2 :]
    outputs = []
    for path in drafters:
        name = (
            "untrained"
            if path == "untrained"
            else Path(path).stem
            if path.endswith(".ckpt")
            else Path(path).name
        )
        if any(o.stem == name for o in outputs):
            name = f"{name}_{len(outputs)}"
        extra = (
            []
            if path == "untrained"
            else ["--ckpt_path", path]
            if path.endswith(".ckpt")
            else ["--model.init_from", path]
        )
        out = out_dir / f"{name}.json"
        run_lightning([*rest, *extra, "--results", str(out)])
        outputs.append(out)
    print()
    compare([str(o) for o in outputs])


def run_lightning(argv: list[str]) -> None:
    from spec_drafters import callbacks  # noqa: F401 - lets YAML name our callbacks by class name
    from spec_drafters.data import TextDataModule
    from spec_drafters.module import DFlashModule

    load_components()
    try:
        check_argv_components(argv)
    except UnknownComponentError as e:
        sys.exit(f"spec-drafters: error: {e}")
    SpecDraftersCLI(
        DFlashModule,
        TextDataModule,
        args=None if argv == sys.argv[1:] else argv,  # LightningCLI warns when both are given
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"default_env": False},
    )


# --- generate ----------------------------------------------------------------------------------------
class _LoadOnly(SpecDraftersCLI):
    """Parses a validate command line (config, overrides, --ckpt_path) and builds the module; runs nothing."""

    def _run_subcommand(self, subcommand: str) -> None:
        pass

    def instantiate_trainer(self, **kwargs):
        return None  # the module alone is needed; a GPU trainer preset must not stop a CPU inspection


def load_module(argv: list[str], quiet: bool = False, with_data: bool = False):
    """A DFlashModule from LightningCLI arguments, with the checkpoint's drafter weights loaded
    (and the data module with it when ``with_data``)."""
    from spec_drafters import callbacks  # noqa: F401
    from spec_drafters.data import TextDataModule
    from spec_drafters.module import DFlashModule

    load_components()
    try:
        check_argv_components(argv)
    except UnknownComponentError as e:
        sys.exit(f"spec-drafters: error: {e}")
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # args given on purpose
    cli = _LoadOnly(
        DFlashModule,
        TextDataModule,
        args=["validate", *argv, "--trainer.logger=false", "--trainer.enable_progress_bar=false"],
        parser_kwargs={"default_env": False},
    )
    module = cli.model
    ckpt_path = cli.config["validate"].get("ckpt_path")
    if ckpt_path:
        ckpt = torch.load(ckpt_path, weights_only=True, map_location="cpu")
        module.on_load_checkpoint(ckpt)  # checks the drafter keys and the target's identity
        module.load_state_dict(ckpt["state_dict"], strict=False)
    elif not quiet and module.hparams.get("init_from") is None:
        print("spec-drafters: no --ckpt_path, the drafter is untrained", file=sys.stderr)
    module.drafter.to(module.target.embed_tokens.weight.dtype)  # serve in the target's dtype
    return (module.eval(), cli.datamodule) if with_data else module.eval()


def generate(argv: list[str]) -> None:
    """``spec-drafters generate``: prompts through the target with the drafter and a chosen verifier."""
    import argparse

    from spec_drafters.prompts import HumanEvalPrompts, JsonlPrompts

    ap = argparse.ArgumentParser(
        prog="spec-drafters generate",
        description="Decode prompts with the target, the drafter and the configured verifier "
        "(--model.verifier); every other argument (--config, --ckpt_path, --model.*) is LightningCLI's.",
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts", help="a JSONL file of records with a 'prompt' (or 'text') field")
    src.add_argument("--humaneval", type=int, metavar="N", help="N HumanEval problems, evenly spaced")
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--out", help="write outputs and per-prompt statistics to this JSONL file")
    ap.add_argument(
        "--no_greedy", action="store_true", help="skip the plain greedy run (no speedup, no check)"
    )
    args, rest = ap.parse_known_args(argv)
    if args.max_new_tokens < 1:
        ap.error(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    texts = (
        args.prompt
        if args.prompt
        else JsonlPrompts(args.prompts).prompts()
        if args.prompts
        else HumanEvalPrompts(args.humaneval).prompts()
    )
    module = load_module(rest)
    verifier = name_of(module.verifier)
    rows = []
    for i, text in enumerate(texts):
        prompt = module.tokenizer.encode(text)
        spec = module.speculate(prompt, args.max_new_tokens)
        row = {
            "prompt": i,
            "verifier": verifier,
            "prompt_tokens": len(prompt),
            "output": module.tokenizer.decode(spec.tokens),
            "new_tokens": len(spec.tokens),
            "rounds": spec.rounds,
            "tau": spec.tau,
            "tokens_per_s": spec.tokens_per_s,
            "accept_lengths": spec.accept_lengths,
        }
        if not args.no_greedy:
            plain = module.greedy(prompt, args.max_new_tokens)
            row.update(
                greedy_tokens_per_s=plain.tokens_per_s,
                speedup=spec.tokens_per_s / plain.tokens_per_s,
                lossless=spec.tokens == plain.tokens,
            )
        rows.append(row)
        stats = f"tau {row['tau']:.2f}, {row['tokens_per_s']:.1f} tok/s"
        if "speedup" in row:
            stats += f", speedup {row['speedup']:.2f}, lossless {row['lossless']}"
        print(f"[{i}] {len(spec.tokens)} tokens, {spec.rounds} rounds, {stats}")
    n = len(rows)
    summary = {
        "verifier": verifier,
        "prompts": n,
        "tau": sum(r["tau"] for r in rows) / n,
        "tau_pooled": sum(sum(r["accept_lengths"]) for r in rows) / max(1, sum(r["rounds"] for r in rows)),
        "tokens_per_s": sum(r["new_tokens"] for r in rows)
        / sum(r["new_tokens"] / r["tokens_per_s"] for r in rows),
    }
    if not args.no_greedy:
        summary["lossless"] = sum(r["lossless"] for r in rows) / n
        greedy_time = sum(r["new_tokens"] / r["greedy_tokens_per_s"] for r in rows)
        summary["greedy_tokens_per_s"] = sum(r["new_tokens"] for r in rows) / greedy_time
        summary["speedup"] = summary["tokens_per_s"] / summary["greedy_tokens_per_s"]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"per-prompt results written to {args.out}")
    print(json.dumps(summary))


def cache_cmd(argv: list[str]) -> None:
    """``spec-drafters cache``: run the target once over the training data and write an offline cache."""
    import argparse

    from spec_drafters.cache import build_cache

    ap = argparse.ArgumentParser(
        prog="spec-drafters cache",
        description="Write the tapped features and label hidden states of the training records "
        "(train with --data.cache DIR). Other arguments (--config, --model.*, --data.*) are LightningCLI's.",
    )
    ap.add_argument("--out", required=True, help="the cache folder (an interrupted build resumes there)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--shard_records", type=int, default=64)
    args, rest = ap.parse_known_args(argv)
    module, data = load_module(rest, quiet=True, with_data=True)
    train, _ = data.examples(module.tokenizer)
    index = build_cache(module, train, args.out, args.dtype, args.shard_records, batch_size=data.batch_size)
    per_k = index["bytes"] / max(1, index["tokens"]) * 1000
    print(
        f"cache {args.out}: {len(index['shards'])} shards, {index['meta']['records']} records, "
        f"{index['tokens']} tokens, {index['bytes'] / 2**20:.1f} MiB "
        f"({per_k / 2**20:.2f} MiB per 1k tokens, {args.dtype})"
    )


# --- export, inspect, diff, lint ---------------------------------------------------------------------
def export(argv: list[str]) -> None:
    import argparse

    from spec_drafters.export import LAYOUTS, folder_from_checkpoint, read_folder, write_folder

    ap = argparse.ArgumentParser(
        prog="spec-drafters export",
        description="Write a drafter (Lightning checkpoint or drafter folder) as config.json and "
        "model.safetensors.",
    )
    ap.add_argument("source", help="a Lightning checkpoint (.ckpt) or a drafter folder of any layout")
    ap.add_argument("--out", required=True, help="the folder to write")
    ap.add_argument("--layout", choices=LAYOUTS, default="spec_drafters")
    ap.add_argument("--num_target_layers", type=int, help="the target's depth (speculators folders omit it)")
    args = ap.parse_args(argv)
    src = Path(args.source)
    folder = read_folder(src, args.num_target_layers) if src.is_dir() else folder_from_checkpoint(src)
    out = write_folder(folder, args.out, args.layout)
    print(f"wrote {out} ({args.layout} layout, {len(folder.state)} drafter tensors)")


def inspect_cmd(argv: list[str]) -> None:
    from spec_drafters.tools import format_inspect, inspect_drafter

    paths = [a for a in argv if a != "--json"]
    if not paths:
        sys.exit("usage: spec-drafters inspect PATH [PATH ...] [--json]")
    reports = [inspect_drafter(p) for p in paths]
    if "--json" in argv:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        print("\n\n".join(format_inspect(r) for r in reports))


def diff_cmd(argv: list[str]) -> None:
    from spec_drafters.tools import diff, format_diff

    paths = [a for a in argv if not a.startswith("--")]
    if len(paths) != 2:
        sys.exit(
            "usage: spec-drafters diff A B [--all] [--json]   (config YAML, drafter folder or checkpoint)"
        )
    rows = diff(paths[0], paths[1], everything="--all" in argv)
    if "--json" in argv:
        print(json.dumps([{"choice": k, "a": a, "b": b} for k, a, b in rows], indent=2, default=str))
    else:
        print(format_diff(paths[0], paths[1], rows))


def lint_cmd(argv: list[str]) -> None:
    from spec_drafters.tools import lint_config

    if "--config" not in argv and "-c" not in argv:
        sys.exit(
            "usage: spec-drafters lint --config CONFIG [--config ...] [--model.* ...] [--strict] [--json]"
        )
    findings = lint_config([a for a in argv if a not in ("--json", "--strict")])
    if "--json" in argv:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
    else:
        print("\n".join(map(str, findings)) or "no findings")
    count = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "allowed")}
    print(
        f"{count['error']} error(s), {count['warning']} warning(s), {count['allowed']} allowed",
        file=sys.stderr,
    )
    # --strict: a CI gate, where a warning (v5's fc over 4 of 5 taps, labels from layer 61) must fail too.
    if count["error"] or ("--strict" in argv and count["warning"]):
        sys.exit(1)


# --- registry listing and result comparison ---------------------------------------------------------------
def print_registry(argv: list[str]) -> None:
    load_components()
    listing = {
        kind: [
            {"name": e.name, "class_path": e.class_path, "parameters": e.parameters()} for e in entries(kind)
        ]
        for kind in KINDS
    }
    if "--json" in argv:
        print(json.dumps(listing, indent=2))
        return
    for kind, items in listing.items():
        print(f"{kind}: {KINDS[kind]}")
        for item in items:
            print(f"  {item['name']:<18} {item['class_path']}")
            print(f"  {'':<18} ({', '.join(item['parameters'])})")
        print()


def compare(argv: list[str]) -> None:
    """Prints the metrics of several ``--results`` files side by side."""
    if not argv:
        sys.exit("usage: spec-drafters compare RESULTS.json [RESULTS.json ...]")
    runs = {Path(p).stem: json.loads(Path(p).read_text())["metrics"] for p in argv}
    keys = sorted({k for m in runs.values() for k in m})
    width = max(len(k) for k in keys)
    print(f"{'metric':<{width}}  " + "  ".join(f"{name:>14}" for name in runs))
    for k in keys:
        cells = [f"{runs[name][k]:>14.4f}" if k in runs[name] else f"{'-':>14}" for name in runs]
        print(f"{k:<{width}}  " + "  ".join(cells))


def _corpus(argv: list[str]) -> None:
    from spec_drafters import corpus

    corpus.main(argv)


#: Commands of our own; everything else (fit, validate, test) goes to LightningCLI.
COMMANDS = {
    "registry": print_registry,
    "compare": compare,
    "generate": generate,
    "export": export,
    "inspect": inspect_cmd,
    "diff": diff_cmd,
    "lint": lint_cmd,
    "corpus": _corpus,
    "cache": cache_cmd,
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else ""
    if command in COMMANDS:
        COMMANDS[command](argv[1:])
    elif command in ("validate", "test") and "--drafters" in argv:
        validate_many(argv)
    else:
        run_lightning(argv)


if __name__ == "__main__":
    main()
