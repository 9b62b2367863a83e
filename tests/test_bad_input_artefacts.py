"""Bad input to the commands that read drafter folders and checkpoints (harness: tests/bad_input.py):
empty or incomplete checkpoints, a drafter folder made for another target, export onto what it must
not overwrite, and a frequent_tokens drafter evaluated without its counts file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bad_input import TINY, Made, check_row, fit, validate, write
from spec_drafters.cli.main import main

ZERO = "zero.ckpt: an empty file (0 bytes), not a checkpoint"
OTHER_TARGET = "the drafter folder was trained for target 'tiny-qwen3-6x32-s0', --model.target loads "


def _zero(tmp: Path) -> str:
    return write(tmp / "zero.ckpt", b"")


def _command(name: str, tmp: Path) -> list[str]:
    """Command ``name`` reading a 0-byte checkpoint."""
    zero, cli = _zero(tmp), ["--config", TINY, "--ckpt_path", str(tmp / "zero.ckpt")]
    return {
        "validate": validate(tmp, zero),
        "validate-drafters": [*validate(tmp, zero)[:-2], "--drafters", zero, "--results", str(tmp / "r")],
        "fit-resume": fit(tmp, "--ckpt_path", zero),
        "generate": ["generate", *cli, "--prompt", "x"],
        "calibrate": ["calibrate", *cli, "--out", str(tmp / "cal.json")],
        "cost-model": ["cost-model", *cli, "--out", str(tmp / "cost.json")],
        "export": ["export", zero, "--out", str(tmp / "out")],
        "inspect": ["inspect", zero],
        "diff": ["diff", zero, TINY],
    }[name]


#: Every command that reads a checkpoint.
READS_CHECKPOINT = ["validate", "validate-drafters", "fit-resume", "generate", "calibrate", "cost-model",
                    "export", "inspect", "diff"]  # fmt: skip


def _no_state_dict(tmp: Path) -> list[str]:
    torch.save({"epoch": 1}, tmp / "plain.ckpt")
    return ["inspect", str(tmp / "plain.ckpt")]


def _without(tmp: Path, made: Made, drop) -> str:
    """made.checkpoint with the state_dict keys ``drop`` selects removed."""
    ckpt = torch.load(made.checkpoint, weights_only=True)
    ckpt["state_dict"] = {k: v for k, v in ckpt["state_dict"].items() if not drop(k)}
    torch.save(ckpt, tmp / "partial.ckpt")
    return str(tmp / "partial.ckpt")


def _zlab(tmp: Path, made: Made) -> str:
    main(["export", str(made.drafter), "--out", str(tmp / "zlab"), "--layout", "zlab"])
    return str(tmp / "zlab")


def _drafters(tmp: Path, *extra: str) -> list[str]:
    """``validate --drafters`` over a checkpoint-less command line, results under tmp."""
    return ["validate", "--config", TINY, "--trainer.logger", "false", "--trainer.default_root_dir",
            str(tmp), *extra, "--results", str(tmp / "many")]  # fmt: skip


ROWS = [
    # (id, input -> command line, exit status, message fragment)
    *(
        (f"zero-byte-checkpoint-{name}", lambda tmp, made, name=name: _command(name, tmp), 1, ZERO)
        for name in READS_CHECKPOINT
    ),
    (
        "checkpoint-missing-fc",
        lambda tmp, made: validate(tmp, _without(tmp, made, lambda k: k == "drafter.fc.weight")),
        1,
        "partial.ckpt: lacks drafter tensors ['drafter.fc.weight'] (1 of the",
    ),
    (
        "checkpoint-without-drafter-export",
        lambda tmp, made: [
            "export",
            _without(tmp, made, lambda k: k.startswith("drafter.")),
            "--out",
            str(tmp / "o"),
        ],
        1,
        "partial.ckpt: lacks drafter tensors ['drafter.fc.weight', 'drafter.hidden_norm.weight'",
    ),
    (
        "checkpoint-without-drafter-inspect",
        lambda tmp, made: ["inspect", _without(tmp, made, lambda k: k.startswith("drafter."))],
        1,
        "partial.ckpt: lacks drafter tensors",
    ),
    (
        "checkpoint-without-state-dict",
        lambda tmp, made: _no_state_dict(tmp),
        1,
        "plain.ckpt: not a Lightning checkpoint (no state_dict)",
    ),
    (
        "init-from-folder-of-another-target",
        lambda tmp, made: fit(
            tmp, "--model.init_from", str(made.drafter), "--model.target.init_args.seed", "1"
        ),
        1,
        OTHER_TARGET + "'tiny-qwen3-6x32-s1'",
    ),
    (
        "validate-drafters-folder-of-another-target",
        lambda tmp, made: _drafters(
            tmp, "--model.target.init_args.seed", "1", "--drafters", str(made.drafter)
        ),
        1,
        OTHER_TARGET + "'tiny-qwen3-6x32-s1'",
    ),
    (
        "init-from-zlab-folder-of-another-shape",
        lambda tmp, made: fit(
            tmp, "--model.init_from", _zlab(tmp, made), "--model.target.init_args.num_layers", "8"
        ),
        1,
        "made for a target of (layers, vocabulary, hidden) (6, 259, 32) (its zlab config names no target), "
        "--model.target loads 'tiny-qwen3-8x32-s0' (8, 259, 32)",
    ),
    (
        "init-from-zlab-folder-names-no-target",  # runs: the shape fits; says what was not checked
        lambda tmp, made: fit(tmp, "--model.init_from", _zlab(tmp, made)),
        0,
        "a zlab folder does not say which target it was trained for; its shape fits --model.target "
        "'tiny-qwen3-6x32-s0'",
    ),
    (
        "init-from-fc-ids-name-the-folders-target",
        lambda tmp, made: fit(
            tmp, "--model.init_from", str(made.drafter), "--model.injection.init_args.num_taps", "2"
        ),
        1,
        "(the folder was made for target 'tiny-qwen3-6x32-s0')",
    ),
    (
        "export-out-is-a-file",
        lambda tmp, made: ["export", str(made.drafter), "--out", write(tmp / "notes.txt", "mine\n")],
        1,
        "--out " + "{tmp}/notes.txt: is a file, not a folder",
    ),
    (
        "export-onto-non-empty-folder",
        lambda tmp, made: [
            "export",
            str(made.drafter),
            "--out",
            str(Path(write(tmp / "o" / "config.json", "{}")).parent),
        ],
        1,
        "o: not empty (config.json); pass --force to replace",
    ),
    (
        "export-onto-its-source-forced",
        lambda tmp, made: [
            "export",
            str(made.drafter),
            "--out",
            str(made.drafter),
            "--force",
            "--layout",
            "zlab",
        ],
        1,
        "drafter: is the source",
    ),
    (
        "export-into-its-source",
        lambda tmp, made: ["export", str(made.drafter), "--out", str(made.drafter / "zlab")],
        1,
        "drafter/zlab: is inside the source",
    ),
    (
        "export-around-its-checkpoint",
        lambda tmp, made: ["export", str(made.checkpoint), "--out", str(made.checkpoint.parent), "--force"],
        1,
        "fit: holds the source",
    ),
    (
        "export-onto-the-shipped-registry-drafter",  # the repository's own: refused, nothing touched
        lambda tmp, made: [
            "export",
            str(made.drafter),
            "--out",
            "registry/drafters/smollm2-reference",
            "--force",
        ],
        1,
        "registry/drafters/smollm2-reference: a shipped drafter of the registry (README.md, config.json, "
        "model.safetensors); replacing it takes --force --overwrite_registry",
    ),
    (
        "lint-missing-config-path",
        lambda tmp, made: ["lint", str(tmp / "nope.yaml")],
        1,
        "nope.yaml",
    ),
]


@pytest.mark.parametrize("make, status, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_ends_as_one_line_naming_the_place(make, status, fragment, made, tmp_path, capsys):
    check_row(make(tmp_path, made), status, fragment.replace("{tmp}", str(tmp_path)), capsys)


# --- frequent_tokens without its counts file --------------------------------------------------------


def _counts(path: Path, ranked_first: int) -> str:
    """A counts file over the tiny byte vocabulary (259) ranking ids from ``ranked_first`` up first."""
    counts = {str(t): 1000 - ((t - ranked_first) % 259) for t in range(259)}
    return write(path, json.dumps({"counts": counts}))


def _vocab_run(tmp: Path, counts: str) -> Path:
    """A one-step fit drafting over 64 frequent tokens; its last.ckpt."""
    vocab = ["--model.draft_vocab", "FrequentTokens", "--model.draft_vocab.counts", counts]
    main(fit(tmp, *vocab, "--model.draft_vocab.size", "64", "--trainer.callbacks.dirpath", str(tmp / "ckpt")))
    return tmp / "ckpt" / "last.ckpt"


def test_a_frequent_tokens_checkpoint_evaluates_without_its_counts_file(tmp_path, capsys):
    counts = _counts(tmp_path / "counts.json", 0)
    ckpt = _vocab_run(tmp_path, counts)
    trained = torch.load(ckpt, weights_only=True)["state_dict"]["drafter.draft_ids"]
    Path(counts).unlink()
    out = tmp_path / "v.json"
    main([*validate(tmp_path, str(ckpt)), "--results", str(out)])  # returns: status 0
    assert "val/tau" in json.loads(out.read_text())["metrics"]
    # the folder export of it starts a drafter with the same config and no counts file either
    main(["export", str(ckpt), "--out", str(tmp_path / "folder")])
    vocab = ["--model.draft_vocab", "FrequentTokens", "--model.draft_vocab.counts", counts]
    from spec_drafters.cli.setup_args import load_setup

    module = load_setup(["--config", TINY, *vocab, "--model.draft_vocab.size", "64",
                          "--model.init_from", str(tmp_path / "folder")], quiet=True)  # fmt: skip
    assert torch.equal(module.drafter.draft_ids, trained)


def test_a_counts_file_that_disagrees_with_the_stored_ids_is_said(tmp_path, capsys):
    counts = _counts(tmp_path / "counts.json", 0)
    ckpt = _vocab_run(tmp_path, counts)
    _counts(tmp_path / "counts.json", 100)  # recounted on other data: other tokens rank first
    with pytest.warns(UserWarning, match=r"counts.json ranks other draft tokens than .*last.ckpt stores"):
        main(validate(tmp_path, str(ckpt)))


# --- lint takes paths, as inspect and diff do ---------------------------------------------------------


def test_lint_takes_config_paths_and_still_takes_config(capsys):
    capsys.readouterr()
    main(["lint", TINY])
    by_path = capsys.readouterr().out
    main(["lint", "--config", TINY])
    assert capsys.readouterr().out == by_path and by_path.strip()
    main(["lint", TINY, "--model.lr", "0.001", "--strict"])  # a flag's value is not a path
    with pytest.raises(SystemExit):
        main(["lint", "--strict"])
    assert "a config is required" in capsys.readouterr().err


def test_the_registry_row_changed_nothing_in_the_repository():
    import subprocess

    status = subprocess.run(["git", "status", "--porcelain", "registry/"], capture_output=True, text=True)
    assert status.stdout == ""
