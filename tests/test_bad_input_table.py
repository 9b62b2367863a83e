"""Bad input through the real CLI, the first table (harness: tests/bad_input.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bad_input import GOOD, TINY, Made, check_row, config, data, fit, init_from, validate, write


def _truncated_weights(tmp: Path, made: Made) -> list[str]:
    whole = (made.drafter / "model.safetensors").read_bytes()
    return init_from(tmp, made, "model.safetensors", whole[: len(whole) // 2])


def _other_data(tmp: Path, made: Made) -> list[str]:
    other = write(tmp / "other.jsonl", GOOD.replace(b"return a + b", b"return b + a"))
    return fit(tmp, "--data.cache", str(made.cache), "--data.path", other)


ROWS = [
    # (id, input -> command line, exit status, message fragment)
    (
        "ckpt-other-target",
        lambda tmp, made: validate(tmp, str(made.checkpoint), "--model.target.init_args.num_layers", "2"),
        1,
        "trained for target 'tiny-qwen3-6x32-s0', --model.target loads 'tiny-qwen3-2x32-s0'",
    ),
    (
        "ckpt-overrides-a-shape-flag",  # runs with the checkpoint's shape, and says so
        lambda tmp, made: validate(tmp, str(made.checkpoint), "--model.drafter.block_size", "8"),
        0,
        "--model.drafter.block_size 8 is overridden by the checkpoint's 4",
    ),
    (
        "export-garbage-checkpoint",
        lambda tmp, made: [
            "export",
            write(tmp / "junk.ckpt", bytes(range(256)) * 4),
            "--out",
            str(tmp / "o"),
        ],
        1,
        "junk.ckpt: not a readable checkpoint",
    ),
    (
        "inspect-truncated-checkpoint",
        lambda tmp, made: ["inspect", write(tmp / "cut.ckpt", made.checkpoint.read_bytes()[:5000])],
        1,
        "cut.ckpt: not a readable checkpoint",
    ),
    (
        "lint-malformed-yaml",
        lambda tmp, made: ["lint", "--config", write(tmp / "bad.yaml", "model:\n  lr: [1\n")],
        1,
        "bad.yaml:3:1: not valid YAML",
    ),
    (
        "ckpt-missing-file",
        lambda tmp, made: validate(tmp, str(tmp / "missing.ckpt")),
        1,
        "missing.ckpt: no such file",
    ),
    (
        "ckpt-remote-url",  # refused before anything is fetched: port 9 (discard) is never contacted
        lambda tmp, made: validate(tmp, "http://127.0.0.1:9/last.ckpt"),
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
        lambda tmp, made: config(tmp, "model:\n  lr: 0.003\n  drafter: {num_layers: 1\ndata:\n  x: 1\n"),
        1,
        "bad.yaml:4:5: not valid YAML",
    ),
    (
        "yaml-top-level-list",
        lambda tmp, made: config(tmp, "- model\n- data\n"),
        1,
        "bad.yaml: the top level must be a mapping",
    ),
    (
        "yaml-model-scalar",
        lambda tmp, made: config(tmp, "model: 3\n"),
        1,
        "bad.yaml: 'model:' must be a mapping",
    ),
    (
        "data-not-utf8",
        lambda tmp, made: data(tmp, b'{"prompt": "caf\xe9", "response": "x", "split": "train"}'),
        1,
        "d.jsonl:1: not UTF-8 text",
    ),
    (
        "data-prompt-not-a-string",
        lambda tmp, made: data(tmp, b'{"prompt": 5, "response": "x", "split": "train"}'),
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
        lambda tmp, made: init_from(tmp, made, "config.json", b'{\n  "block_size": 4,\n'),
        1,
        "drafter/config.json:3: not valid JSON",
    ),
    (
        "generate-prompt-not-a-string",
        lambda tmp, made: ["generate", "--prompts", write(tmp / "p.jsonl", '{"prompt": ["a"]}\n')],
        1,
        "p.jsonl:1: a prompt record needs a 'prompt' or 'text' string",
    ),
    (
        "compare-missing-file",
        lambda tmp, made: ["compare", write(tmp / "a.json", '{"metrics": {}}'), str(tmp / "nope.json")],
        1,
        "nope.json: no such file",
    ),
    (
        "compare-malformed-file",
        lambda tmp, made: ["compare", write(tmp / "r.json", '{"metrics": {"val/tau": 1.0,\n')],
        1,
        "r.json:2: not valid JSON",
    ),
    (
        "compare-no-metrics",
        lambda tmp, made: ["compare", write(tmp / "r.json", '{"subcommand": "fit"}')],
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
        lambda tmp, made: fit(tmp, "--data.cache", str(made.cache), "--data.max_length", "64"),
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
    check_row(make(tmp_path, made), status, fragment, capsys)
