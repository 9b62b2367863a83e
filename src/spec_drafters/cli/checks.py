"""Component names in config files and ``--model.*`` overrides, checked against the registry before
LightningCLI parses anything: an unknown name fails with the list of valid ones (jsonargparse alone
only says "expected a dot import path"). Also the config-file reader that names the file and line, and
the YAML loader that refuses a key given twice in one mapping (PyYAML and jsonargparse keep the last
one silently: a repeated ``model:`` section once dropped the first one's settings).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import typing
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import UnionType

import yaml

from spec_drafters.errors import InputError
from spec_drafters.registry import UnknownComponentError, lookup, valid_names


def _component_base(annotation) -> type | None:
    return annotation if inspect.isclass(annotation) and hasattr(annotation, "component_kind") else None


def _component_list_base(annotation) -> type | None:
    """The component kind of a ``list[Kind]`` parameter (also ``list[Kind] | None``), else None."""
    options = (
        typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, UnionType) else ()
    )
    for option in (annotation, *options):
        if typing.get_origin(option) in (list, tuple, Sequence) and typing.get_args(option):
            return _component_base(typing.get_args(option)[0])
    return None


def _check_value(base: type, value, flag: str) -> None:
    name = value if isinstance(value, str) else value.get("class_path") if isinstance(value, dict) else None
    if name is None:
        return
    chosen = _resolve(base, name, flag)
    if isinstance(value, dict):
        check_components(chosen, value.get("init_args") or {}, f"{flag}.init_args")


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
        if value is None:
            continue
        base = _component_base(hints.get(key))
        if base is not None:
            _check_value(base, value, f"{flag}.{key}")
            continue
        base = _component_list_base(hints.get(key))
        if base is not None and isinstance(value, list):  # e.g. eval_verifiers, a loss mix's losses
            for i, item in enumerate(value):
                _check_value(base, item, f"{flag}.{key}[{i}]")


def argv_flags(argv: list[str]) -> list[tuple[str, str | None]]:
    """A LightningCLI command line as (flag, value) pairs, ``--flag V`` and ``--flag=V`` alike: the one
    reading of ``--config``, ``--model.*`` and section flags for every check made before parsing."""
    pairs, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and "=" in arg:
            flag, value = arg.split("=", 1)
        elif _takes_value(arg) and i + 1 < len(argv):
            flag, value, i = arg, argv[i + 1], i + 1
        else:
            flag, value = arg, None
        pairs.append((flag, value))
        i += 1
    return pairs


def _takes_value(flag: str) -> bool:
    return flag in ("--config", "-c") or flag.startswith("--model.") or flag in SECTION_FLAGS


def config_paths(argv: list[str]) -> list[str]:
    """The ``--config``/``-c`` files of a LightningCLI command line, in order."""
    return [value for flag, value in argv_flags(argv) if flag in ("--config", "-c") and value]


def _configs_from_argv(argv: list[str]) -> list[dict]:
    configs = []
    for flag, value in argv_flags(argv):
        if value is None:
            continue
        if flag in ("--config", "-c") and Path(value).is_file():
            configs.append(read_config(value))
        elif flag.startswith("--model."):
            configs.append(_dotted(flag[2:], value))
        elif flag in SECTION_FLAGS and Path(value).is_file():  # --trainer FILE: a section read from a file
            read_yaml(value)
    return configs


#: Top-level sections whose value is a mapping of arguments, or a string jsonargparse reads as a file.
SECTIONS = ("model", "data", "trainer")


#: The command-line flags that read a whole section from a YAML file (``--trainer preset.yaml``).
SECTION_FLAGS = tuple(f"--{key}" for key in SECTIONS)


def read_yaml(path: str | Path):
    """A user's YAML file as plain data. Malformed YAML names the file and line (yaml alone says
    ``<unicode string>``), a duplicate key both of its lines, an empty file the file."""
    if not Path(path).is_file():
        raise InputError(f"{path}: no such config file")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        data = load_yaml(text, str(path))
    except yaml.YAMLError as e:
        raise InputError(f"{path}{_yaml_place(e)}: not valid YAML ({_yaml_problem(e)})") from None
    if data is None:  # jsonargparse would stop on it with its usage text ("Unexpected config")
        raise InputError(f"{path}: the file is empty (no settings in it)")
    return data


def load_yaml(text: str, name: str | None = None):
    """``yaml.safe_load``, refusing a key repeated in one mapping (:func:`check_unique_keys`)."""
    check_unique_keys(text, name)
    return yaml.safe_load(text)


def check_unique_keys(text: str, name: str | None = None) -> None:
    """An InputError naming ``name`` (a file; else "a YAML value") and both lines when a mapping of
    ``text``, at any depth, has a key twice. Malformed YAML is left to the loader that reads it, so its
    own error stays as it was."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return
    seen: set[int] = set()  # an anchored node is walked once, however often it is aliased
    todo = deque([root] if root is not None else [])  # breadth first: the outermost duplicate first
    while todo:
        node = todo.popleft()
        if id(node) in seen or isinstance(node, yaml.ScalarNode):
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
            continue
        first: dict[tuple, int] = {}
        for key, value in node.value:
            todo.append(value)
            if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, yaml.ScalarNode):
                continue  # `<<: *base` merges keys that the mapping's own keys may override
            line = key.start_mark.line + 1
            if (key.tag, key.value) in first:
                where = f"{name}:{line}" if name else f"a YAML value, line {line}"
                raise InputError(
                    f"{where}: duplicate key {key.value!r} (first at line {first[key.tag, key.value]}); "
                    "YAML would keep the last one silently"
                )
            first[key.tag, key.value] = line


def use_unique_key_loader() -> None:
    """Makes jsonargparse (LightningCLI's ``--config``, ``--trainer FILE``, a section's file, a YAML
    value of a flag) refuse duplicate keys too: its own YAML loader, behind :func:`check_unique_keys`.
    Registered once per process through jsonargparse's public ``set_loader``."""
    from jsonargparse import get_loader, set_loader

    own = get_loader("yaml")
    if getattr(own, "refuses_duplicate_keys", False):
        return

    def load(stream: str, path: str = ""):  # jsonargparse passes the config file's name as `path`
        check_unique_keys(stream, path or None)
        return own(stream)

    load.refuses_duplicate_keys = True
    set_loader("yaml", load, exceptions=(yaml.YAMLError,))


def read_config(path: str | Path) -> dict:
    """A config file's mapping (:func:`read_yaml`); a top level or a section that is not a mapping
    names the file and field, and so does a section read from a file (``trainer: preset.yaml``)."""
    cfg = read_yaml(path)
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
        if isinstance(value, str) and (Path(path).parent / value).is_file():  # as jsonargparse reads it
            read_yaml(Path(path).parent / value)
    return cfg


def _yaml_place(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    problem = getattr(e, "problem", None) or str(e)
    context, mark = getattr(e, "context", None), getattr(e, "context_mark", None)
    return f"{problem}, {context} at line {mark.line + 1}" if context and mark else problem


def _dotted(key: str, value: str) -> dict:
    if value.lstrip().startswith(("{", "[")):  # an inline YAML/JSON value, as jsonargparse reads it
        with contextlib.suppress(yaml.YAMLError):  # jsonargparse reports malformed values
            value = yaml.safe_load(value)
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
                    cls = resolve_class(cb["class_path"])
                except (ImportError, AttributeError):
                    continue  # LightningCLI reports unknown callbacks itself
                check_components(cls, cb.get("init_args") or {}, f"--trainer.callbacks[{i}].init_args")


def resolve_class(path: str) -> type:
    if "." not in path:
        import lightning.pytorch.callbacks as builtin

        from spec_drafters.lightning import callbacks

        return getattr(callbacks, path, None) or getattr(builtin, path)
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


# --- outputs ----------------------------------------------------------------------------------------
def out_file(path: str | Path, flag: str = "--out") -> Path:
    """A file a command writes once its work is done, checked before the work starts: not a folder,
    and where it goes a folder this user can write (found out at the end, it would lose the work)."""
    out = Path(path)
    if out.is_dir():
        raise InputError(f"{flag} {path}: is a folder; give the path of a file to write")
    if out.exists() and not os.access(out, os.W_OK):
        raise InputError(f"{flag} {path}: the file exists and cannot be written (permissions)")
    _check_writable(out.parent, flag, path)
    return out


def out_folder(path: str | Path, flag: str = "--out") -> Path:
    """A folder a command writes into, checked before the work starts: not a file, and writable."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputError(f"{flag} {path}: is a file, not a folder")
    _check_writable(out, flag, path)
    return out


def _check_writable(folder: Path, flag: str, path) -> None:
    """``folder`` exists and is writable, or can be created (its nearest existing parent is a
    writable folder); nothing is created here."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{flag} {path}: {existing} is a file, so no folder can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: the folder {existing} cannot be written (permissions)")
