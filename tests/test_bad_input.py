"""Bad input fails with the place named, or is counted and reported; never silently wrong data."""

import logging

import pytest

from spec_drafters.cli.main import main

TINY = ["fit", "--config", "tests/configs/tiny.yaml", "--trainer.max_steps", "1", "--trainer.logger", "false"]


def test_bad_records_and_long_or_empty_ones(tmp_path, caplog):
    data = tmp_path / "d.jsonl"
    long_text = "x = 1\n" * 200  # far beyond max_length 96
    data.write_text(
        '{"prompt": "def f():\\n", "response": "    return 1\\n", "split": "train"}\n'
        '{"prompt": "only a prompt", "response": "", "split": "train"}\n'  # nothing to learn: skipped
        + f'{{"text": {long_text!r}, "split": "train"}}\n'.replace("'", '"')
        + '{"prompt": "a", "response": "bcd efg", "split": "val"}\n'
    )
    with caplog.at_level(logging.INFO):
        main([*TINY, "--data.path", str(data), "--trainer.default_root_dir", str(tmp_path)])
    out = caplog.text
    assert (
        "train: 2 sequences, 1 skipped (fewer than 2 supervised tokens), 1 truncated to --data.max_length 96"
        in out
    )
    data.write_text('{"prompt": "a", "response": "b", "split": "train"}\n{"prompt": oops}\n')
    with pytest.raises(SystemExit, match=r"^spec-drafters: error: .*d.jsonl:2: not valid JSON"):
        main([*TINY, "--data.path", str(data), "--trainer.default_root_dir", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"^spec-drafters: error: --data.path: no file .*missing.jsonl"):
        main([*TINY, "--data.path", str(tmp_path / "missing.jsonl")])


def test_missing_files_are_one_line_errors_naming_the_flag(tmp_path):
    """A path that is not there: one line naming the flag, no traceback (it was a bare traceback)."""
    from spec_drafters.data.records import iter_jsonl
    from spec_drafters.errors import MissingFile

    error = r"^spec-drafters: error: "
    with pytest.raises(SystemExit, match=error + r"--data.cache: no index.json in .*nocache"):
        main([*TINY, "--data.cache", str(tmp_path / "nocache")])
    counts = ["--model.draft_vocab", "FrequentTokens", "--model.draft_vocab.init_args.counts"]
    with pytest.raises(SystemExit, match=error + r"--model.draft_vocab: no token counts file .*none.json"):
        main([*TINY, *counts, str(tmp_path / "none.json"), "--model.draft_vocab.init_args.size", "16"])
    with pytest.raises(FileNotFoundError):  # library callers catching FileNotFoundError keep working
        next(iter_jsonl(tmp_path / "missing.jsonl"))
    assert issubclass(MissingFile, ValueError)


def test_bad_target_layers_and_mask_tokens_name_the_flag_and_field(tmp_path):
    error = r"^spec-drafters: error: "
    with pytest.raises(SystemExit, match=error + r"--model.injection: layer_ids has layer ids \[6\] outside"):
        main(
            [
                *TINY,
                "--model.injection.init_args.num_taps",
                "null",
                "--model.injection.init_args.layer_ids",
                "[1, 6]",
            ]
        )
    with pytest.raises(SystemExit, match=error + r"--model.target_source: layer_id 9 is outside"):
        main([*TINY, "--model.target_source", "LayerLogits", "--model.target_source.init_args.layer_id", "9"])
    with pytest.raises(SystemExit, match=error + r"--model.target: mask token id 400 is outside"):
        main([*TINY, "--model.target.init_args.mask_token_id", "400"])
