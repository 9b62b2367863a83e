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
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from spec_drafters.errors import InputError
from spec_drafters.lightning.tracking import RunAimLogger
from spec_drafters.registry import (
    KINDS,
    UnknownComponentError,
    entries,
    load_components,
    lookup,
    name_of,
    valid_names,
)


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
            configs.append(read_config(path))
        i += 1
    return configs


#: Top-level sections whose value is a mapping of arguments, or a string jsonargparse reads as a file.
SECTIONS = ("model", "data", "trainer")


def read_config(path: str | Path) -> dict:
    """A config file's mapping. Malformed YAML names the file and line (yaml alone says
    ``<unicode string>``); a top level or a section that is not a mapping names the file and field."""
    if not Path(path).is_file():
        raise InputError(f"{path}: no such config file")
    try:
        cfg = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        raise InputError(f"{path}{_yaml_place(e)}: not valid YAML ({_yaml_problem(e)})") from None
    cfg = {} if cfg is None else cfg
    if not isinstance(cfg, dict):
        raise InputError(
            f"{path}: the top level must be a mapping of sections (model:, data:, trainer:), "
            f"got a {type(cfg).__name__}"
        )
    for key in SECTIONS:
        value = cfg.get(key)
        if not (value is None or isinstance(value, (dict, str))):
            raise InputError(
                f"{path}: '{key}:' must be a mapping of arguments (or a config file), "
                f"got {type(value).__name__} {value!r}"
            )
    return cfg


def _yaml_place(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    problem = getattr(e, "problem", None) or str(e)
    context, mark = getattr(e, "context", None), getattr(e, "context_mark", None)
    return f"{problem}, {context} at line {mark.line + 1}" if context and mark else problem


def _dotted(key: str, value: str) -> dict:
    parts = key.split(".")
    if parts[-1] == "class_path":
        parts, value = parts[:-1], {"class_path": value}
    out: dict = {parts[-1]: value}
    for p in reversed(parts[:-1]):
        out = {p: out}
    return out


def check_argv_components(argv: list[str]) -> None:
    from spec_drafters.lightning.module import DFlashModule

    for cfg in _configs_from_argv(argv):
        model = cfg.get("model")
        if isinstance(model, dict):  # a file path is checked by jsonargparse
            check_components(DFlashModule, model, "--model")
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

        from spec_drafters.lightning import callbacks

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


#: ``--ckpt_path`` values that Lightning resolves itself (they name no file).
CKPT_KEYWORDS = ("best", "last", "hpc", "registry")


def read_checkpoint(path: str) -> dict:
    """``--ckpt_path``'s checkpoint as plain data only; anything else ends as one line naming it."""
    from spec_drafters.artefacts.folders import read_checkpoint_file

    try:
        return read_checkpoint_file(path, "--ckpt_path")
    except InputError as e:
        sys.exit(f"spec-drafters: error: {e}")


def _model_flags(argv: list[str]) -> list[str]:
    """The model arguments set on the command line, as dotted keys (``drafter.block_size``)."""
    flags = [a.split("=", 1)[0].rstrip("+") for a in argv if a.startswith("--model.")]
    return [f[len("--model.") :] for f in flags]


def _target_identity(target) -> str | None:
    """The card name the configured target will load, when its loader knows it without loading."""
    from spec_drafters.target.loaders import TargetLoader

    if target is None or not hasattr(target, "class_path"):
        return None
    cls = _resolve_class(target.class_path)
    if cls.identity is TargetLoader.identity:  # a loader that only knows once loaded: no early check
        return None
    init_args = target.get("init_args")
    return cls(**(init_args.as_dict() if init_args else {})).identity()


class SpecDraftersCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # No --weights_only flag: every checkpoint is loaded as plain data (_prepare_subcommand_kwargs).
        return {
            k: v | {"weights_only"}
            for k, v in LightningCLI.subcommands().items()
            if k in ("fit", "validate", "test")
        }

    def parse_arguments(self, parser, args) -> None:
        # Kept to tell which flags the user gave when a checkpoint overrides them (_parse_ckpt_path).
        if args is None:
            self.argv = sys.argv[1:]
        else:  # a dict or Namespace of arguments names no flags
            self.argv = list(args) if isinstance(args, (list, tuple)) else []
        super().parse_arguments(parser, args)

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict:
        # Lightning's own default unpickles remote checkpoints in full (weights_only=False for URLs);
        # ours hold plain types only (DFlashModule's hyperparameters are plain dicts).
        return {**super()._prepare_subcommand_kwargs(subcommand), "weights_only": True}

    def _parse_ckpt_path(self) -> None:
        """With ``--ckpt_path``, LightningCLI replaces the model arguments by the checkpoint's, which
        would silently ignore ``validate --model.verifier DDTree``. Keep this run's RUN_TIME_ARGS.

        Before anything is built: the file must exist and be plain data, and the checkpoint's target
        must be this run's (otherwise its drafter settings would fail against the wrong target first,
        e.g. as a bad ``num_taps``). A command-line flag the checkpoint overrides is warned about.
        """
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if not ckpt_path or str(ckpt_path) in CKPT_KEYWORDS:
            return
        ckpt = read_checkpoint(ckpt_path)
        saved = ckpt.get("spec_drafters", {}).get("target", {}).get("name")
        mine = _target_identity(self.config[sub].get("model.target"))
        if saved and mine and saved != mine:
            raise InputError(
                f"--ckpt_path {ckpt_path}: the checkpoint was trained for target {saved!r}, "
                f"--model.target loads {mine!r}"
            )
        hparams = ckpt.get("hyper_parameters", {})
        hparams = {k: v for k, v in hparams.items() if k not in RUN_TIME_ARGS and not k.startswith("_")}
        if not hparams:
            return
        before = self.config[sub].clone()
        self.config = self.parser.parse_object({sub: {"model": hparams}}, self.config)
        for key in _model_flags(self.argv):
            given, used = before.get(f"model.{key}"), self.config[sub].get(f"model.{key}")
            if given != used:
                rank_zero_warn(
                    f"--model.{key} {_shown(given)} is overridden by the checkpoint's {_shown(used)} "
                    f"(--ckpt_path {ckpt_path}): a checkpoint keeps the drafter it was trained as"
                )

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

    def _default_progress_bar(self) -> list | None:
        """The configured callbacks plus RunProgressBar where Lightning would add its default rich
        bar (progress bar enabled, none configured); None where it would add none."""
        from spec_drafters.lightning.callbacks import RunProgressBar

        trainer_args = self._get(self.config_init, "trainer", default={})
        callbacks = trainer_args.get("callbacks") or []
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        if not _RICH_AVAILABLE or trainer_args.get("enable_progress_bar") is False:
            return None
        if any(isinstance(c, ProgressBar) for c in callbacks):
            return None
        return [*callbacks, RunProgressBar()]

    def instantiate_trainer(self, **kwargs):
        if self.subcommand not in (None, "fit"):
            # fit's config.yaml stays the run's recipe when a validate or test run shares its folder.
            name = f"config_{self.subcommand}.yaml"
            self.save_config_kwargs = {**self.save_config_kwargs, "config_filename": name}
        callbacks = self._default_progress_bar()
        if callbacks is not None and "callbacks" not in kwargs:
            kwargs["callbacks"] = callbacks
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


def _shown(value) -> str:
    """A config value as a flag would spell it (class choices by class path)."""
    if hasattr(value, "class_path"):
        value = value.as_dict()
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)


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
    from spec_drafters.lightning import callbacks  # noqa: F401 - lets YAML name our callbacks by class name
    from spec_drafters.lightning.datamodule import TextDataModule
    from spec_drafters.lightning.module import DFlashModule

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
    from spec_drafters.lightning import callbacks  # noqa: F401
    from spec_drafters.lightning.datamodule import TextDataModule
    from spec_drafters.lightning.module import DFlashModule

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
        ckpt = read_checkpoint(ckpt_path)
        module.on_load_checkpoint(ckpt)  # checks the drafter keys and the target's identity
        module.load_state_dict(ckpt["state_dict"], strict=False)
    elif not quiet and module.hparams.get("init_from") is None:
        print("spec-drafters: no --ckpt_path, the drafter is untrained", file=sys.stderr)
    module.drafter.to(module.target.embed_tokens.weight.dtype)  # serve in the target's dtype
    return (module.eval(), cli.datamodule) if with_data else module.eval()


def generate(argv: list[str]) -> None:
    """``spec-drafters generate``: prompts through the target with the drafter and a chosen verifier."""
    import argparse

    from spec_drafters.data.prompts import HumanEvalPrompts, JsonlPrompts
    from spec_drafters.decode.generate import check_fits

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
    prompts = [module.tokenizer.encode(text) for text in texts]
    for i, prompt in enumerate(prompts):  # all of them before decoding any
        try:
            check_fits(module.target, len(prompt), args.max_new_tokens, f"prompt {i}")
        except ValueError as e:
            raise InputError(f"generate: {e}") from None
    rows = []
    for i, prompt in enumerate(prompts):
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

    from spec_drafters.data.feature_cache import build_cache

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
    index = build_cache(
        module.feature_spec(), data, args.out, args.dtype, args.shard_records, batch_size=data.batch_size
    )
    per_k = index["bytes"] / max(1, index["tokens"]) * 1000
    print(
        f"cache {args.out}: {len(index['shards'])} shards, {index['meta']['records']} records, "
        f"{index['tokens']} tokens, {index['bytes'] / 2**20:.1f} MiB "
        f"({per_k / 2**20:.2f} MiB per 1k tokens, {args.dtype})"
    )


def draft_vocab_cmd(argv: list[str]) -> None:
    """``spec-drafters draft-vocab``: count the training labels for a ``frequent_tokens`` vocabulary."""
    import argparse

    from spec_drafters.data.records import collate
    from spec_drafters.model.vocab import FrequentTokens, count_labels, coverage

    ap = argparse.ArgumentParser(
        prog="spec-drafters draft-vocab",
        description="Count the target's outputs on the training data (the cache's labels with "
        "--data.cache, else the supervised tokens of the text) and print the held-out coverage of the "
        "V_d most frequent. Other arguments (--config, --data.*) are LightningCLI's.",
    )
    ap.add_argument("--out", required=True, help="the counts file (JSON) for FrequentTokens(counts=...)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    args, rest = ap.parse_known_args(argv)
    module, data = load_module(rest, quiet=True, with_data=True)
    train, val = data.examples(module.tokenizer)
    if data.cache:
        from spec_drafters.data.feature_cache import CachedRecords

        records = CachedRecords(data.cache)
        counts = count_labels(records[i] for i in range(len(records)))
    else:
        counts = count_labels(collate([ex]) for ex in train)
    held_out = count_labels(collate([ex]) for ex in val)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"source": data.cache or data.path, "tokens": sum(counts.values()), "counts": dict(counts)}
    out.write_text(json.dumps(payload) + "\n")
    print(f"{out}: {len(counts)} distinct tokens in {payload['tokens']} training labels")
    vocab = module.target.vocab_size
    for size in args.sizes:
        ids = FrequentTokens(str(out), size).token_ids(vocab)
        share = coverage(ids, held_out)
        print(f"V_d {size:>6}: held-out coverage {share:.4f}, head rows {size / vocab:.3f}x")


# --- export, inspect, diff, lint ---------------------------------------------------------------------
def export(argv: list[str]) -> None:
    import argparse

    from spec_drafters.artefacts.folders import LAYOUTS, folder_from_checkpoint, read_folder, write_folder

    ap = argparse.ArgumentParser(
        prog="spec-drafters export",
        description="Write a drafter (Lightning checkpoint or drafter folder) as config.json and "
        "model.safetensors.",
    )
    ap.add_argument("source", help="a Lightning checkpoint (.ckpt) or a drafter folder of any layout")
    ap.add_argument("--out", required=True, help="the folder to write")
    ap.add_argument("--layout", choices=LAYOUTS, default="spec_drafters")
    ap.add_argument("--num_target_layers", type=int, help="the target's depth (speculators folders omit it)")
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="cast the weights (integer tensors such as a draft vocabulary's ids stay as they are)",
    )
    args = ap.parse_args(argv)
    src = Path(args.source)
    if not src.exists():
        raise InputError(f"{src}: no such file or folder (export reads a checkpoint or a drafter folder)")
    folder = read_folder(src, args.num_target_layers) if src.is_dir() else folder_from_checkpoint(src)
    if args.dtype:
        dtype = getattr(torch, args.dtype)
        for tensors in (folder.state, folder.aux):
            tensors.update({k: v.to(dtype) for k, v in tensors.items() if v.is_floating_point()})
    out = write_folder(folder, args.out, args.layout)
    print(f"wrote {out} ({args.layout} layout, {len(folder.state)} drafter tensors)")


def inspect_cmd(argv: list[str]) -> None:
    from spec_drafters.artefacts.tools import format_inspect, inspect_drafter

    paths = [a for a in argv if a != "--json"]
    if not paths:
        sys.exit("usage: spec-drafters inspect PATH [PATH ...] [--json]")
    reports = [inspect_drafter(p) for p in paths]
    if "--json" in argv:
        print(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        print("\n\n".join(format_inspect(r) for r in reports))


def diff_cmd(argv: list[str]) -> None:
    from spec_drafters.artefacts.tools import diff, format_diff

    paths = [a for a in argv if not a.startswith("--")]
    if len(paths) != 2:
        sys.exit(
            "usage: spec-drafters diff A B [--all] [--json]   (config YAML, drafter folder or checkpoint)"
        )
    for p in paths:
        if not Path(p).exists():
            raise InputError(
                f"{p}: no such file or folder (diff reads config YAMLs, drafter folders, checkpoints)"
            )
    rows = diff(paths[0], paths[1], everything="--all" in argv)
    if "--json" in argv:
        print(json.dumps([{"choice": k, "a": a, "b": b} for k, a, b in rows], indent=2, default=str))
    else:
        print(format_diff(paths[0], paths[1], rows))


def lint_cmd(argv: list[str]) -> None:
    from spec_drafters.artefacts.tools import lint_config

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
    from spec_drafters.artefacts.tools import distinct_labels, legend

    if not argv:
        sys.exit("usage: spec-drafters compare RESULTS.json [RESULTS.json ...]")
    runs = [_metrics(p) for p in argv]
    # Columns keyed by position, labelled by the shortest distinguishing path: two runs/*/fit.json
    # are two columns, not one (a dict keyed by file stem kept the last only).
    labels = distinct_labels([Path(p).with_suffix("") for p in argv])
    keys = sorted({k for m in runs for k in m})
    width = max([len("metric"), *map(len, keys)])
    cols = [max(14, len(label)) for label in labels]
    print(
        f"{'metric':<{width}}  " + "  ".join(f"{label:>{w}}" for label, w in zip(labels, cols, strict=True))
    )
    for k in keys:
        cells = [f"{m[k]:>{w}.4f}" if k in m else f"{'-':>{w}}" for m, w in zip(runs, cols, strict=True)]
        print(f"{k:<{width}}  " + "  ".join(cells))
    print(legend(labels, argv))


def _metrics(path: str) -> dict[str, float]:
    """The ``metrics`` of a ``--results`` file; anything else names the file and field."""
    from spec_drafters.errors import read_json

    data = read_json(path)
    metrics = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(metrics, dict):
        raise InputError(
            f"{path}: no 'metrics' object (compare reads the --results files of fit/validate/test)"
        )
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InputError(f"{path}: metrics.{k} is {v!r}, not a number")
    return metrics


def _corpus(argv: list[str]) -> None:
    from spec_drafters.data import corpus

    corpus.main(argv)


def _reference_corpus(argv: list[str]) -> None:
    from spec_drafters.data import reference_corpus

    reference_corpus.main(argv)


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
    "reference-corpus": _reference_corpus,
    "draft-vocab": draft_vocab_cmd,
    "cache": cache_cmd,
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv else ""
    try:
        if command in COMMANDS:
            COMMANDS[command](argv[1:])
        elif command in ("validate", "test") and "--drafters" in argv:
            validate_many(argv)
        else:
            run_lightning(argv)
    except InputError as e:  # the message names the flag, file and line or field: no traceback
        sys.exit(f"spec-drafters: error: {e}")


if __name__ == "__main__":
    main()
