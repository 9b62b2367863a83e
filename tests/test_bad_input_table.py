"""Bad input through the real CLI: each row is one input that must end as ``spec-drafters: error: ...``
with the expected exit status and a message naming the file (and line or field), never a traceback.
Rows with exit status 0 are inputs that run but must say something: their fragment is a warning.

A row is (id, a function writing its input under tmp_path and returning the command line, exit
status, fragment of the message). ``made`` holds the tiny artefacts rows start from (a drafter
folder, an offline cache), built once per module.
"""

from __future__ import annotations

import functools
import shutil
import warnings
from pathlib import Path

import pytest

from spec_drafters.cli.main import main

TINY = "tests/configs/tiny.yaml"
FIT = ["fit", "--config", TINY, "--trainer.max_steps", "1", "--trainer.logger", "false"]


def _fit(tmp: Path, *extra: str) -> list[str]:
    """A one-step fit whose outputs (config.yaml, checkpoints) go under tmp, not the working folder."""
    return [*FIT, "--trainer.default_root_dir", str(tmp), *extra]


GOOD = Path("tests/data/tiny.jsonl").read_bytes()


class Made:
    """Valid artefacts of the tiny config, built on first use."""

    def __init__(self, root: Path):
        self.root = root

    @functools.cached_property
    def drafter(self) -> Path:
        from spec_drafters.artefacts.folders import folder_from_module, write_folder
        from spec_drafters.cli.main import load_module

        module = load_module(["--config", TINY], quiet=True)
        return write_folder(folder_from_module(module), self.root / "drafter")

    @functools.cached_property
    def checkpoint(self) -> Path:
        main([*FIT, "--trainer.default_root_dir", str(self.root / "fit"),
              "--trainer.callbacks.dirpath", str(self.root / "fit")])  # fmt: skip
        return self.root / "fit" / "last.ckpt"

    @functools.cached_property
    def cache(self) -> Path:
        main(["cache", "--config", TINY, "--out", str(self.root / "cache")])
        return self.root / "cache"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Made:
    return Made(tmp_path_factory.mktemp("made"))


def _write(path: Path, content: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def _config(tmp: Path, text: str) -> list[str]:
    return _fit(tmp, "--config", _write(tmp / "bad.yaml", text))


def _data(tmp: Path, first_line: bytes) -> list[str]:
    return _fit(tmp, "--data.path", _write(tmp / "d.jsonl", first_line + b"\n" + GOOD))


def _init_from(tmp: Path, made: Made, file: str, content: bytes) -> list[str]:
    folder = shutil.copytree(made.drafter, tmp / "drafter")
    (folder / file).write_bytes(content)
    return _fit(tmp, "--model.init_from", str(folder))


def _truncated_weights(tmp: Path, made: Made) -> list[str]:
    whole = (made.drafter / "model.safetensors").read_bytes()
    return _init_from(tmp, made, "model.safetensors", whole[: len(whole) // 2])


def _other_data(tmp: Path, made: Made) -> list[str]:
    other = _write(tmp / "other.jsonl", GOOD.replace(b"return a + b", b"return b + a"))
    return _fit(tmp, "--data.cache", str(made.cache), "--data.path", other)


def _validate(tmp: Path, ckpt: str, *extra: str) -> list[str]:
    return ["validate", "--config", TINY, "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp), "--ckpt_path", ckpt, *extra]  # fmt: skip


ROWS = [
    # (id, input -> command line, exit status, message fragment)
    (
        "ckpt-other-target",
        lambda tmp, made: _validate(tmp, str(made.checkpoint), "--model.target.init_args.num_layers", "2"),
        1,
        "trained for target 'tiny-qwen3-6x32-s0', --model.target loads 'tiny-qwen3-2x32-s0'",
    ),
    (
        "ckpt-overrides-a-shape-flag",  # runs with the checkpoint's shape, and says so
        lambda tmp, made: _validate(tmp, str(made.checkpoint), "--model.drafter.block_size", "8"),
        0,
        "--model.drafter.block_size 8 is overridden by the checkpoint's 4",
    ),
    (
        "export-garbage-checkpoint",
        lambda tmp, made: ["export", _write(tmp / "junk.ckpt", bytes(range(256)) * 4), "--out", str(tmp)],
        1,
        "junk.ckpt: not a readable checkpoint",
    ),
    (
        "inspect-truncated-checkpoint",
        lambda tmp, made: ["inspect", _write(tmp / "cut.ckpt", made.checkpoint.read_bytes()[:5000])],
        1,
        "cut.ckpt: not a readable checkpoint",
    ),
    (
        "lint-malformed-yaml",
        lambda tmp, made: ["lint", "--config", _write(tmp / "bad.yaml", "model:\n  lr: [1\n")],
        1,
        "bad.yaml:3:1: not valid YAML",
    ),
    (
        "ckpt-missing-file",
        lambda tmp, made: _validate(tmp, str(tmp / "missing.ckpt")),
        1,
        "missing.ckpt: no such file",
    ),
    (
        "ckpt-remote-url",  # refused before anything is fetched: port 9 (discard) is never contacted
        lambda tmp, made: _validate(tmp, "http://127.0.0.1:9/last.ckpt"),
        1,
        "remote checkpoints are not loaded",
    ),
    (
        "prompt-past-context",
        lambda tmp, made: [
            "generate",
            "--config",
            TINY,
            "--ckpt_path",
            str(made.checkpoint),
            "--prompt",
            "x" * 4090,
            "--max_new_tokens",
            "12",
        ],
        1,
        "prompt 0 has 4090 tokens, + max_new_tokens 12 = 4102, more than",
    ),
    (
        "yaml-malformed",
        lambda tmp, made: _config(tmp, "model:\n  lr: 0.003\n  drafter: {num_layers: 1\ndata:\n  x: 1\n"),
        1,
        "bad.yaml:4:5: not valid YAML",
    ),
    (
        "yaml-top-level-list",
        lambda tmp, made: _config(tmp, "- model\n- data\n"),
        1,
        "bad.yaml: the top level must be a mapping",
    ),
    (
        "yaml-model-scalar",
        lambda tmp, made: _config(tmp, "model: 3\n"),
        1,
        "bad.yaml: 'model:' must be a mapping",
    ),
    (
        "data-not-utf8",
        lambda tmp, made: _data(tmp, b'{"prompt": "caf\xe9", "response": "x", "split": "train"}'),
        1,
        "d.jsonl:1: not UTF-8 text",
    ),
    (
        "data-prompt-not-a-string",
        lambda tmp, made: _data(tmp, b'{"prompt": 5, "response": "x", "split": "train"}'),
        1,
        "d.jsonl:1: 'prompt' must be a string, got int",
    ),
    (
        "init-from-truncated-safetensors",
        _truncated_weights,
        1,
        "drafter/model.safetensors: not a readable safetensors file",
    ),
    (
        "init-from-broken-config-json",
        lambda tmp, made: _init_from(tmp, made, "config.json", b'{\n  "block_size": 4,\n'),
        1,
        "drafter/config.json:3: not valid JSON",
    ),
    (
        "generate-prompt-not-a-string",
        lambda tmp, made: ["generate", "--prompts", _write(tmp / "p.jsonl", '{"prompt": ["a"]}\n')],
        1,
        "p.jsonl:1: a prompt record needs a 'prompt' or 'text' string",
    ),
    (
        "compare-missing-file",
        lambda tmp, made: ["compare", _write(tmp / "a.json", '{"metrics": {}}'), str(tmp / "nope.json")],
        1,
        "nope.json: no such file",
    ),
    (
        "compare-malformed-file",
        lambda tmp, made: ["compare", _write(tmp / "r.json", '{"metrics": {"val/tau": 1.0,\n')],
        1,
        "r.json:2: not valid JSON",
    ),
    (
        "compare-no-metrics",
        lambda tmp, made: ["compare", _write(tmp / "r.json", '{"subcommand": "fit"}')],
        1,
        "r.json: no 'metrics' object",
    ),
    (
        "diff-missing-file",
        lambda tmp, made: ["diff", TINY, str(tmp / "nope.yaml")],
        1,
        "nope.yaml: no such file or folder",
    ),
    (
        "export-missing-source",
        lambda tmp, made: ["export", str(tmp / "nope.ckpt"), "--out", str(tmp / "out")],
        1,
        "nope.ckpt: no such file or folder",
    ),
    (
        "cache-other-max-length",
        lambda tmp, made: _fit(tmp, "--data.cache", str(made.cache), "--data.max_length", "64"),
        1,
        "was built with max_length=96, this run has 64 (--data.max_length)",
    ),
    (
        "cache-other-data-file",
        _other_data,
        1,
        "was built with data_sha256=",
    ),
]


@pytest.mark.parametrize("make, status, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_ends_as_one_line_naming_the_place(make, status, fragment, made, tmp_path, capsys):
    argv = make(tmp_path, made)
    capsys.readouterr()
    if status == 0:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            main(argv)  # runs to the end
        assert any(fragment in str(w.message) for w in seen), [str(w.message) for w in seen]
        return
    with pytest.raises(SystemExit) as exited:  # any other exception is a traceback: the row fails
        main(argv)
    code = exited.value.code
    message = code if isinstance(code, str) else capsys.readouterr().err
    assert (1 if isinstance(code, str) else code) == status, message
    assert message.startswith("spec-drafters: error: "), message
    assert fragment in message, message
