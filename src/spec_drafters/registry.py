"""The component index: every swappable part has a kind and a stable snake_case name.

Names are artefact keys: they go into checkpoints, exports, listings and tests, so they never change
once released. Experiments select components by class name or ``class_path`` (LightningCLI
conventions); the registry is what lets a failed lookup list the valid choices and lets
``spec-drafters registry`` show everything that exists.

This module imports no component. :func:`load_components` imports the built-in component modules and
the plugins that other packages declare under the entry-point group ``spec_drafters.components``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TypeVar

from torch import nn

T = TypeVar("T")

#: Kinds and what they choose. The order is the order of ``spec-drafters registry``.
KINDS: dict[str, str] = {
    "target": "the frozen target model and how it is loaded",
    "injection": "which target layers are tapped and which of them feed the drafter's fc",
    "target_source": "where the training labels come from",
    "noise": "perturbation of the drafter's fc input during training (never of the labels)",
    "loss": "the training objective over block slots",
    "slot_weights": "how much each block slot counts in a loss (exponential decay, D-PACE)",
    "mask": "the drafter's training attention mask",
    "attention": "attention kernels, one signature, eager reference first",
    "anchors": "how anchor positions are chosen per sequence",
    "verifier": "the acceptance rule for drafts (offline and in real decoding)",
    "draft_vocab": "which target tokens the drafter may propose (the head's rows it drafts over)",
    "prompts": "evaluation prompt sets for real decoding",
    "engine": "what generates training answers for regenerate (in process, or an OpenAI-compatible server)",
}

#: Built-in modules that register components on import.
BUILTIN_MODULES = (
    "spec_drafters.target.loaders",
    "spec_drafters.target.injection",
    "spec_drafters.target.labels",
    "spec_drafters.train.noise",
    "spec_drafters.train.weights",
    "spec_drafters.train.losses",
    "spec_drafters.train.acceptance_losses",
    "spec_drafters.model.masks",
    "spec_drafters.model.attention",
    "spec_drafters.train.anchors",
    "spec_drafters.decode.verifiers",
    "spec_drafters.model.vocab",
    "spec_drafters.data.prompts",
    "spec_drafters.decode.engines",
)

#: Entry-point group through which other packages add components (docs/components.md, "Plugins").
PLUGIN_GROUP = "spec_drafters.components"


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    obj: Any  # a class, or a function for the "attention" kind

    @property
    def class_path(self) -> str:
        return f"{self.obj.__module__}.{self.obj.__qualname__}"

    def parameters(self) -> list[str]:
        """Constructor (or function) parameters as ``name: type = default`` strings."""
        target = self.obj.__init__ if inspect.isclass(self.obj) else self.obj
        out = []
        for p in inspect.signature(target).parameters.values():
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            ann = p.annotation
            if ann is inspect.Parameter.empty:  # unannotated: its __name__ would print as "_empty"
                ann = ""
            elif not isinstance(ann, str):
                ann = inspect.formatannotation(ann)  # Literal['x', 'y'], int | None, list[int]
            text = f"{p.name}: {ann}" if ann else p.name
            if p.default is not inspect.Parameter.empty:
                text += f" = {p.default!r}"
            out.append(text)
        return out


_REGISTRY: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}


class UnknownComponentError(KeyError):
    """A name that is not registered; the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence
        return str(self.args[0])


def register(kind: str, name: str) -> Callable[[T], T]:
    """Class (or function) decorator: ``@register("loss", "hard_ce")``."""
    if kind not in KINDS:
        raise ValueError(f"unknown component kind {kind!r}; kinds: {', '.join(KINDS)}")

    def wrap(obj: T) -> T:
        known = _REGISTRY[kind].get(name)
        # Re-registering the same class (a module reload) is harmless; a different one is a clash.
        if known is not None and known.class_path != Entry(kind, name, obj).class_path:
            raise ValueError(f"{kind} name {name!r} is already taken by {known.class_path}")
        _REGISTRY[kind][name] = Entry(kind, name, obj)
        obj.registry_name = name  # type: ignore[attr-defined]
        return obj

    return wrap


def entries(kind: str) -> list[Entry]:
    if kind not in KINDS:
        raise UnknownComponentError(f"unknown component kind {kind!r}; kinds: {', '.join(KINDS)}")
    return sorted(_REGISTRY[kind].values(), key=lambda e: e.name)


def valid_names(kind: str) -> str:
    return ", ".join(f"{e.name} ({e.obj.__qualname__})" for e in entries(kind)) or "none registered"


def lookup(kind: str, name: str) -> Any:
    """The object registered as ``name``; accepts the snake_case name, the class name or the class path."""
    for e in entries(kind):
        if name in (e.name, e.obj.__qualname__, e.class_path):
            return e.obj
    raise UnknownComponentError(f"unknown {kind} {name!r}; valid: {valid_names(kind)}")


def component_class(obj: Any) -> type:
    """The class of a component instance, seeing through jsonargparse's ``lazy_instance`` wrappers."""
    cls = obj if inspect.isclass(obj) else type(obj)
    return next(c for c in cls.__mro__ if c.__module__ != "jsonargparse.typing")


def name_of(obj: Any) -> str:
    """The registry name of a component (instance, class or function).

    A subclass that was not registered itself is named by its class path, never by its parent's name:
    it may behave differently.
    """
    cls = obj if inspect.isfunction(obj) else component_class(obj)
    for kind_entries in _REGISTRY.values():
        for e in kind_entries.values():
            if e.obj is cls:
                return e.name
    return f"{cls.__module__}.{cls.__qualname__}"


def as_config(obj: Any) -> Any:
    """A component as a plain ``{"class_path", "init_args"}`` dict (LightningCLI's form).

    Components keep each constructor argument as an attribute of the same name; arguments that are
    not kept are left out, and the class's default applies when the config is re-read.
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple, nn.ModuleList)):  # LossMix keeps its terms in a ModuleList
        return [as_config(v) for v in obj]
    if isinstance(obj, dict):
        return {k: as_config(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    cls = component_class(obj)
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    return {
        "class_path": f"{cls.__module__}.{cls.__qualname__}",
        "init_args": {p: as_config(getattr(obj, p)) for p in params if hasattr(obj, p)},
    }


_loaded = False


def load_components() -> None:
    """Import the built-in component modules and every plugin module declared by installed packages."""
    global _loaded
    if _loaded:
        return
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    for ep in entry_points(group=PLUGIN_GROUP):
        ep.load()
    _loaded = True
