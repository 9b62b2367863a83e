"""Errors name the flag the CLI parsed, not one the component guessed: the same class serves under
several flags (LayerLogits as target_source and val_target_source, DDTree as verifier and inside
eval_verifiers), and each use reports its own. Components raise plain errors; the LightningModule tags
the ones it calls with their argument (errors.argument), and the CLI names the flag of those that
jsonargparse's instantiation raises (cli/flags.py)."""

from __future__ import annotations

import json

import pytest
from jsonargparse import ArgumentParser

from spec_drafters.cli.flags import instantiation_error
from spec_drafters.cli.main import main
from spec_drafters.cli.setup_args import load_setup
from spec_drafters.errors import ArgumentError

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

TINY = ["validate", "--config", "tests/configs/tiny.yaml", "--trainer.logger", "false"]


def error_line(*overrides: str) -> str:
    """The one line ``spec-drafters validate`` ends with; a traceback fails the test."""
    with pytest.raises(SystemExit) as exited:
        main([*TINY, *overrides])
    assert isinstance(exited.value.code, str), exited.value.code  # sys.exit(message): exit status 1
    return exited.value.code


def ddtree(budget: int) -> dict:
    return {"class_path": "DDTree", "init_args": {"budget": budget}}


@pytest.mark.parametrize("flag", ["target_source", "val_target_source"])
def test_a_label_source_names_the_flag_it_was_given_by(flag):
    # LayerLogits checks its layer id against the target when the module builds (errors.argument).
    line = error_line(f"--model.{flag}", "LayerLogits", f"--model.{flag}.init_args.layer_id", "9")
    assert line.startswith(f"spec-drafters: error: --model.{flag}: layer_id 9 is outside"), line
    assert line.count("--model.") == 1, line  # the component spells no flag of its own


def test_a_verifier_names_the_flag_it_was_given_by():
    # DDTree refuses its budget in __init__, while jsonargparse instantiates it.
    line = error_line("--model.verifier", "DDTree", "--model.verifier.budget", "0")
    assert line.startswith("spec-drafters: error: --model.verifier: "), line
    assert line.endswith("budget must be >= 1, got 0"), line
    line = error_line("--model.eval_verifiers", json.dumps([ddtree(4), ddtree(0)]))
    assert line.startswith("spec-drafters: error: --model.eval_verifiers[1]: "), line
    assert line.endswith("budget must be >= 1, got 0"), line


def test_a_component_inside_a_component_is_named_by_its_full_path():
    line = error_line(
        "--model.loss", "CAP", "--model.loss.init_args.main", "HardCE",
        "--model.loss.init_args.main.init_args.gamma", "-1",
    )  # fmt: skip
    assert line.startswith("spec-drafters: error: --model.loss.init_args.main: "), line
    assert "got -1" in line, line


def test_library_callers_get_the_argument_not_a_flag():
    with pytest.raises(ArgumentError) as raised:
        load_setup(["--config", "tests/configs/tiny.yaml", "--model.eval_verifiers", json.dumps([ddtree(0)])])
    assert raised.value.argument == "eval_verifiers[0]"
    assert str(raised.value).endswith("budget must be >= 1, got 0")


# --- the mechanism on a bare jsonargparse parser: pins the installed jsonargparse's frames -------------
class Budgeted:
    def __init__(self, budget: int = 1):
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")


class Wrapper:
    def __init__(self, main: Budgeted):
        self.main = main


class Model:
    def __init__(self, one: Budgeted, wrapped: Wrapper | None = None, many: list[Budgeted] | None = None):
        pass


def _instantiate(*args: str) -> ValueError:
    parser = ArgumentParser()
    parser.add_class_arguments(Model, "model")
    config = parser.parse_args([f"--model.one={__name__}.Budgeted", *args])
    with pytest.raises(ValueError) as raised:
        parser.instantiate(config)
    return raised.value


@pytest.mark.parametrize(
    ("args", "argument"),
    [
        (["--model.one.budget=0"], "one"),
        ([f"--model.many=[{{class_path: {__name__}.Budgeted}}, {{class_path: {__name__}.Budgeted, "
          "init_args: {budget: 0}}]"], "many[1]"),
        ([f"--model.wrapped={__name__}.Wrapper", f"--model.wrapped.main={__name__}.Budgeted",
          "--model.wrapped.main.budget=0"], "wrapped.init_args.main"),
    ],
)  # fmt: skip
def test_the_flag_is_read_from_jsonargparse_instantiation(args, argument):
    named = instantiation_error(_instantiate(*args))
    assert isinstance(named, ArgumentError) and named.argument == argument
    assert named.flagged() == f"--model.{argument}: budget must be >= 1, got 0"


def test_an_error_that_is_not_a_constructors_is_left_alone():
    assert instantiation_error(ValueError("raised elsewhere")) is None
