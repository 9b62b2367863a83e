"""A component chosen in YAML gets its own defaults, never the module default's init_args.

jsonargparse keeps a default's init_args when a config switches the class_path to a class that accepts
the same names (jsonargparse issue #460). With ZLabTaps(num_taps=5) as the injection default, every
YAML ``AllTaps``/``AllButLast`` silently became z-lab's 5-tap formula: explicit ``layer_ids`` were
refused as "not both", and a bare ``AllTaps`` never reached the card's taps. These tests go through the
CLI parser (LightningCLI, as ``fit`` and ``lint`` do), for every registered class of every kind.
"""

import inspect
import json
import re
import typing

import pytest
import yaml

from spec_drafters.cli.checks import check_argv_components
from spec_drafters.cli.lightning_cli import SpecDraftersCLI
from spec_drafters.cli.main import main
from spec_drafters.cli.setup_args import load_setup
from spec_drafters.cli.tools import lint_config
from spec_drafters.lightning.datamodule import TextDataModule
from spec_drafters.lightning.module import DFlashModule
from spec_drafters.registry import component_class, entries
from spec_drafters.target.injection import AllTaps

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")  # args given on purpose


class DeepestTaps(AllTaps):
    """A plugin-style injection sharing AllTaps' parameters (as tests/plugin_example's)."""

    def __init__(self, layer_ids: list[int] | None = None, num_taps: int | None = None, keep: int = 2):
        super().__init__(layer_ids=layer_ids, num_taps=num_taps)
        self.keep = keep

    def fc_ids(self, card):
        return self.tap_ids(card)[-self.keep :]


class ParseOnly(SpecDraftersCLI):
    """Parses a command line as ``fit`` would; instantiates and runs nothing."""

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str) -> None:
        pass


def write(tmp_path, model: dict, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"model": model}))
    return str(path)


def parsed_model(tmp_path, model: dict) -> dict:
    args = ["fit", "--config", write(tmp_path, model)]
    check_argv_components(args)
    cli = ParseOnly(DFlashModule, TextDataModule, args=args, parser_kwargs={"default_env": False})
    return cli.config["fit"]["model"].as_dict()


#: Values for the arguments that have no default.
REQUIRED = {
    "HFPretrained": {"path": "/nonexistent"},
    "CustomInjection": {"taps": [1, 3], "fc": [3]},
    "CAP": {"main": {"class_path": "HardCE"}},
    "DSparkConfidence": {"main": {"class_path": "HardCE"}},
    "AdaptiveDDTree": {"cost_model": "/nonexistent/cost.json"},
    "LossMix": {
        "losses": [{"class_path": "HardCE"}, {"class_path": "TotalVariation"}],
        "coefficients": [0.1, 0.9],
    },
    "FrequentTokens": {"counts": "/nonexistent/counts.json"},
    "FolderVocab": {"path": "/nonexistent/drafter"},
}


def component_params() -> list[tuple[str, str]]:
    """(DFlashModule parameter, component kind) for every component argument."""
    hints = typing.get_type_hints(DFlashModule.__init__)
    out = []
    for name, hint in hints.items():
        bases = [a for a in (typing.get_args(hint) or (hint,)) if inspect.isclass(a)]
        bases += [b for a in typing.get_args(hint) for b in typing.get_args(a)]  # list[Verifier] | None
        kind = next((b.component_kind for b in bases if hasattr(b, "component_kind")), None)
        if kind:
            out.append((name, kind))
    return out


def cases():
    for param, kind in component_params():
        classes = [e.obj for e in entries(kind)] + ([DeepestTaps] if kind == "injection" else [])
        for cls in classes:
            yield pytest.param(param, cls, id=f"{param}-{cls.__name__}")


@pytest.mark.parametrize(("param", "cls"), list(cases()))
def test_a_class_chosen_in_yaml_gets_its_own_defaults(tmp_path, param, cls):
    path = f"{cls.__module__}.{cls.__qualname__}"
    spec = {"class_path": path, "init_args": REQUIRED.get(cls.__name__, {})}
    got = parsed_model(tmp_path, {param: [spec] if param == "eval_verifiers" else spec})[param]
    got = got[0] if param == "eval_verifiers" else got
    assert got["class_path"] == path
    own = inspect.signature(cls.__init__).parameters.values()
    defaults = {p.name: p.default for p in own if p.default is not inspect.Parameter.empty}
    assert {k: got["init_args"][k] for k in defaults} == defaults


def test_component_params_cover_every_kind_the_module_takes():
    kinds = dict(component_params())
    assert set(kinds) == {
        "target", "injection", "target_source", "val_target_source", "noise", "loss", "mask", "anchors",
        "verifier", "eval_verifiers", "draft_vocab",
    }  # fmt: skip


# --- every injection class from YAML, built through the CLI parser (load_setup, lint) ----------------------
def tiny_model(injection: dict, num_layers: int = 6) -> dict:
    target = {"class_path": "TinyRandom", "init_args": {"num_layers": num_layers}}
    return {"target": target, "drafter": {"num_layers": 1, "block_size": 4}, "injection": injection}


@pytest.mark.parametrize(
    ("injection", "num_layers", "fc", "taps"),
    [
        ({"class_path": "AllTaps", "init_args": {"layer_ids": [1, 3]}}, 6, [1, 3], [1, 3]),
        ({"class_path": "AllTaps", "init_args": {"num_taps": 3}}, 6, [1, 2, 3], [1, 2, 3]),
        ({"class_path": "AllTaps"}, 8, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]),  # no card default: z-lab's 5
        ({"class_path": "AllButLast", "init_args": {"layer_ids": [1, 3, 4]}}, 6, [1, 3], [1, 3, 4]),
        ({"class_path": "AllButLast", "init_args": {"num_taps": 3}}, 6, [1, 2], [1, 2, 3]),
        ({"class_path": "AllButLast"}, 8, [1, 2, 3, 4], [1, 2, 3, 4, 5]),
        ({"class_path": "AllTaps", "init_args": {"num_taps": 3}}, 6, [1, 2, 3], [1, 2, 3]),
        ({"class_path": "AllTaps", "init_args": {"num_taps": 5}}, 8, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]),
        ({"class_path": "AllTaps", "init_args": {"layer_ids": [0, 4, 5]}}, 6, [0, 4, 5], [0, 4, 5]),
        ({"class_path": "CustomInjection", "init_args": {"taps": [1, 3, 5], "fc": [3, 5]}}, 6, [3, 5],
         [1, 3, 5]),
        ({"class_path": "test_component_defaults.DeepestTaps", "init_args": {"layer_ids": [1, 2, 4]}}, 6,
         [2, 4], [1, 2, 4]),
    ],
)  # fmt: skip
def test_every_injection_class_builds_from_yaml(tmp_path, injection, num_layers, fc, taps):
    module = load_setup(["--config", write(tmp_path, tiny_model(injection, num_layers))], quiet=True)
    assert module.fc_ids == fc and module.target.tap_ids == taps
    # The checkpoint records what the YAML set and the class's own defaults, nothing else.
    own = inspect.signature(component_class(module.injection).__init__).parameters.values()
    own = {p.name: p.default for p in own if p.default not in (None, inspect.Parameter.empty)}
    recorded = module.settings["injection"]["init_args"]
    assert {k: v for k, v in recorded.items() if v is not None} == own | injection.get("init_args", {})


@pytest.mark.parametrize(
    ("layer_ids", "message"),
    [
        ([1, 6], r"layer_ids has layer ids \[6\] outside the target's 0\.\.5"),
        ([1, 1], r"layer_ids has duplicate layer ids"),
        ([3, 1], r"layer_ids must be sorted ascending"),
    ],
)
def test_bad_yaml_layer_ids_are_reported_as_themselves(tmp_path, layer_ids, message):
    for cls in ("AllTaps", "AllButLast"):
        model = tiny_model({"class_path": cls, "init_args": {"layer_ids": layer_ids}})
        (finding,) = lint_config(["--config", write(tmp_path, model)])
        assert finding.code == "config-invalid" and re.search(message, finding.message), finding.message


def test_a_bare_all_taps_on_a_shallow_target_names_the_card_not_num_taps(tmp_path):
    (finding,) = lint_config(["--config", write(tmp_path, tiny_model({"class_path": "AllTaps"}))])
    assert "has no default_tap_ids" in finding.message and ".num_taps has" not in finding.message


def test_the_minimal_case_lints_without_errors(tmp_path, capsys):
    model = tiny_model({"class_path": "AllTaps", "init_args": {"layer_ids": [1, 3]}})
    main(["lint", "--config", write(tmp_path, model)])  # no SystemExit: exit code 0
    assert "error" not in capsys.readouterr().out


def test_the_module_default_is_the_card_default_with_nothing_set(tmp_path):
    assert parsed_model(tmp_path, {})["injection"] == {
        "class_path": "spec_drafters.target.injection.AllTaps",
        "init_args": {"layer_ids": None, "num_taps": None},
    }


def test_a_num_taps_kept_from_an_earlier_config_is_named_with_the_way_out():
    """tests/configs/tiny.yaml sets AllTaps(num_taps=3): an override switching to AllTaps keeps it
    (jsonargparse's rule for values a config set), so the error names both values and the fix."""
    switch = ["--config", "tests/configs/tiny.yaml", "--model.injection", "AllTaps",
              "--model.injection.init_args.layer_ids", "[1, 3]"]  # fmt: skip
    (finding,) = lint_config(switch)
    assert "got layer_ids [1, 3] and num_taps 3" in finding.message and "set it to null" in finding.message
    assert lint_config([*switch, "--model.injection.init_args.num_taps", "null"]) == []


# --- what a checkpoint records reads back as the same component --------------------------------------------
@pytest.mark.parametrize(
    ("param", "cls"),
    [c for c in cases() if c.values[0] not in ("target", "draft_vocab") and c.values[1] is not DeepestTaps],
)
def test_recorded_hyperparameters_parse_back_to_the_same_component(tmp_path, param, cls):
    """A checkpoint's hyperparameters are ``as_config`` of the built components; ``validate
    --ckpt_path`` parses them again. A LossMix once recorded its terms' ModuleList as a bogus class, so
    its checkpoints could not be loaded (lk_mix of the ablation)."""
    path = f"{cls.__module__}.{cls.__qualname__}"
    init_args = dict(REQUIRED.get(cls.__name__, {}))
    if "cost_model" in init_args:  # read when the verifier is built: a real cost file
        init_args["cost_model"] = str(tmp_path / "cost.json")
        cost = {"tokens": [1, 2, 4], "verify": [1.0, 1.1, 1.2], "draft": 0.1, "machine": {"threads": 1}}
        (tmp_path / "cost.json").write_text(json.dumps(cost))
    spec = {"class_path": path, "init_args": init_args}
    model = {"target": {"class_path": "TinyRandom", "init_args": {"num_layers": 8}}}
    model["drafter"] = {"num_layers": 1, "block_size": 4}
    model[param] = [spec] if param == "eval_verifiers" else spec
    recorded = load_setup(["--config", write(tmp_path, model)], quiet=True).settings[param]
    again = {**model, param: recorded}
    reread = load_setup(["--config", write(tmp_path, again, "again.yaml")], quiet=True).settings[param]
    assert reread == recorded
    assert yaml.safe_load(yaml.safe_dump(recorded)) == recorded  # plain data, as a checkpoint keeps it
