"""The harness of the bad-input tables (tests/test_bad_input_*.py): one row is one input that must end as
``spec-drafters: error: ...`` with the expected exit status and a message naming the file (and line
or field), never a traceback. Rows with exit status 0 are inputs that run but must say something:
their fragment is a warning.

A row is (id, a function writing its input under tmp_path and returning the command line, exit
status, fragment of the message). ``made`` holds the tiny artefacts rows start from (a drafter
folder, a checkpoint, an offline cache), built once per module; tests/conftest.py gives it to every test
as the ``made`` fixture, and a table calls :func:`check_row`.
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


def fit(tmp: Path, *extra: str) -> list[str]:
    """A one-step fit whose outputs (config.yaml, checkpoints) go under tmp, not the working folder."""
    return [*FIT, "--trainer.default_root_dir", str(tmp), *extra]


GOOD = Path("tests/data/tiny.jsonl").read_bytes()


class Made:
    """Valid artefacts of the tiny config, built on first use."""

    def __init__(self, root: Path):
        self.root = root

    @functools.cached_property
    def drafter(self) -> Path:
        from spec_drafters.artefacts.folders import write_folder
        from spec_drafters.cli.setup_args import load_setup

        setup = load_setup(["--config", TINY], quiet=True)
        return write_folder(setup.folder(), self.root / "drafter")

    @functools.cached_property
    def checkpoint(self) -> Path:
        main([*FIT, "--trainer.default_root_dir", str(self.root / "fit"),
              "--trainer.callbacks.dirpath", str(self.root / "fit")])  # fmt: skip
        return self.root / "fit" / "last.ckpt"

    @functools.cached_property
    def cache(self) -> Path:
        main(["cache", "--config", TINY, "--out", str(self.root / "cache")])
        return self.root / "cache"


def write(path: Path, content: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def config(tmp: Path, text: str) -> list[str]:
    return fit(tmp, "--config", write(tmp / "bad.yaml", text))


def data(tmp: Path, first_line: bytes) -> list[str]:
    return fit(tmp, "--data.path", write(tmp / "d.jsonl", first_line + b"\n" + GOOD))


def init_from(tmp: Path, made: Made, file: str, content: bytes) -> list[str]:
    folder = shutil.copytree(made.drafter, tmp / "drafter")
    (folder / file).write_bytes(content)
    return fit(tmp, "--model.init_from", str(folder))


def validate(tmp: Path, ckpt: str, *extra: str) -> list[str]:
    return ["validate", "--config", TINY, "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp), "--ckpt_path", ckpt, *extra]  # fmt: skip


def check_row(argv: list[str], status: int, fragment: str, capsys) -> None:
    """``main(argv)`` ends as the row says: exit ``status`` with ``fragment`` in its one line, or (status
    0) runs to the end with ``fragment`` in a warning."""
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
    assert "\n" not in message.strip(), message  # one line
    assert fragment in message, message
