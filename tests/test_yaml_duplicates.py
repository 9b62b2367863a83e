"""A key given twice in one YAML mapping is refused with the file and both lines, wherever a config is
read: the project's own reader (fit's component check, lint) and what jsonargparse reads for
LightningCLI (cli/checks.py ``use_unique_key_loader``). YAML alone keeps the last one silently: a
repeated ``model:`` section once dropped ``drafter.num_layers: 2`` with exit status 0."""

from __future__ import annotations

import jsonargparse
import pytest

from bad_input import check_row, config, fit, write
from spec_drafters.cli.checks import check_unique_keys, load_yaml, use_unique_key_loader
from spec_drafters.errors import InputError

TOP = "model:\n  drafter:\n    num_layers: 2\ndata:\n  batch_size: 2\nmodel:\n  lr: 0.001\n"
NESTED = "model:\n  drafter:\n    num_layers: 2\n    block_size: 4\n    num_layers: 1\n"
IN_A_LIST = (
    "trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n"
    "      init_args: {save_last: true, save_last: false}\n"
)


def _lint(tmp, text):
    return ["lint", "--config", write(tmp / "bad.yaml", text)]


def _trainer_file(tmp, text):
    return fit(tmp, "--trainer", write(tmp / "preset.yaml", text))


def _section_file(tmp, text):
    write(tmp / "preset.yaml", text)
    return config(tmp, "trainer: preset.yaml\n")


ROWS = [
    # (id, tmp -> command line, exit status, message fragment)
    ("fit-top-level", lambda tmp: config(tmp, TOP), 1, "bad.yaml:6: duplicate key 'model' (first at line 1)"),
    (
        "fit-nested",
        lambda tmp: config(tmp, NESTED),
        1,
        "bad.yaml:5: duplicate key 'num_layers' (first at line 3)",
    ),
    (
        "fit-in-a-list",
        lambda tmp: config(tmp, IN_A_LIST),
        1,
        "bad.yaml:4: duplicate key 'save_last' (first at line 4)",
    ),
    ("lint-top-level", lambda tmp: _lint(tmp, TOP), 1, "bad.yaml:6: duplicate key 'model' (first at line 1)"),
    (
        "lint-nested",
        lambda tmp: _lint(tmp, NESTED),
        1,
        "bad.yaml:5: duplicate key 'num_layers' (first at line 3)",
    ),
    (
        "fit-trainer-file",
        lambda tmp: _trainer_file(tmp, "max_steps: 1\nlogger: false\nmax_steps: 2\n"),
        1,
        "preset.yaml:3: duplicate key 'max_steps' (first at line 1)",
    ),
    (
        "fit-section-named-by-file",
        lambda tmp: _section_file(tmp, "max_steps: 1\nmax_steps: 2\n"),
        1,
        "preset.yaml:2: duplicate key 'max_steps' (first at line 1)",
    ),
    (
        "fit-flag-value",
        lambda tmp: fit(tmp, "--model.drafter", "{num_layers: 1, num_layers: 2}"),
        1,
        "duplicate key 'num_layers'",
    ),
    ("fit-empty-config", lambda tmp: config(tmp, ""), 1, "bad.yaml: the file is empty"),
    (
        "fit-comments-only-config",
        lambda tmp: config(tmp, "# nothing yet\n"),
        1,
        "bad.yaml: the file is empty",
    ),
    ("lint-empty-config", lambda tmp: _lint(tmp, ""), 1, "bad.yaml: the file is empty"),
    ("fit-empty-trainer-file", lambda tmp: _trainer_file(tmp, "\n"), 1, "preset.yaml: the file is empty"),
]


@pytest.mark.parametrize("make, status, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_duplicate_keys_end_as_one_line_naming_both_lines(make, status, fragment, tmp_path, capsys):
    check_row(make(tmp_path), status, fragment, capsys)


def test_what_is_not_a_duplicate_still_loads():
    """The same key in two mappings, a merge key overridden by the mapping's own, an alias used twice,
    the string '1' beside the integer 1: all plain YAML, all kept."""
    text = "a: {x: 1}\nb: {x: 2}\nbase: &b {y: 1}\nc:\n  <<: *b\n  y: 2\nd: [*b, *b]\ne: {1: a, '1': b}\n"
    assert load_yaml(text) == {
        "a": {"x": 1},
        "b": {"x": 2},
        "base": {"y": 1},
        "c": {"y": 2},
        "d": [{"y": 1}, {"y": 1}],
        "e": {1: "a", "1": "b"},
    }
    check_unique_keys("key: [1\n")  # malformed: left to the loader that reads it, which names it


def _parser() -> jsonargparse.ArgumentParser:
    use_unique_key_loader()
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action="config")
    parser.add_argument("--model", type=dict)
    parser.add_argument("--data", type=dict)
    return parser


def test_jsonargparse_refuses_duplicates_itself(tmp_path):
    """Without the CLI's own reading first (a library caller of SpecDraftersCLI): jsonargparse's loader
    refuses them, naming the file it was reading."""
    with pytest.raises(InputError, match=r"bad\.yaml:6: duplicate key 'model' \(first at line 1\)"):
        _parser().parse_args(["--config", write(tmp_path / "bad.yaml", TOP)])
    with pytest.raises(InputError, match="duplicate key 'num_layers'"):
        _parser().parse_args(["--config", write(tmp_path / "nested.yaml", NESTED)])


def test_jsonargparse_keeps_its_own_behaviour_otherwise(tmp_path):
    """Registering the loader changes nothing else: values, files and jsonargparse's own error for
    malformed YAML are as before (the CLI names the line first, tests/test_bad_input_table.py)."""
    parser = _parser()
    good = write(tmp_path / "good.yaml", "model:\n  lr: 0.1\ndata: {path: x.jsonl}\n")
    parsed = parser.parse_args(["--config", good, "--model", "{drafter: {num_layers: 2}}"])
    assert parsed.model == {"drafter": {"num_layers": 2}} and parsed.data == {"path": "x.jsonl"}
    malformed = write(
        tmp_path / "bad.yaml", "model:\n  lr: 0.003\n  drafter: {num_layers: 1\ndata:\n  x: 1\n"
    )
    with pytest.raises(jsonargparse.ArgumentError, match="Problems parsing config"):
        parser.parse_args(["--config", malformed])
    use_unique_key_loader()  # registered once: a second call does not wrap the loader again
    assert jsonargparse.get_loader("yaml").refuses_duplicate_keys


def test_the_fit_that_dropped_a_section_now_stops(tmp_path, capsys):
    """The issue's case: a second ``model:`` section silently replaced the first's num_layers."""
    text = "model:\n  drafter:\n    num_layers: 2\nmodel:\n  lr: 0.001\n"
    check_row([*fit(tmp_path), "--config", write(tmp_path / "two.yaml", text)], 1,
              "two.yaml:4: duplicate key 'model' (first at line 1)", capsys)  # fmt: skip
    assert not list(tmp_path.rglob("*.ckpt"))  # stopped before training
