"""Bad input to the commands that do not train (generate, cost-model, calibrate, draft-vocab, cache,
validate --drafters) and to the files their components read (harness: tests/bad_input.py). Every
row is refused before the work starts; the plain tests below check that nothing a user already had,
or a run had finished, is overwritten or lost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bad_input import TINY, check_row, write
from spec_drafters.cli.main import main

CKPT = "tests/fixtures/main_b8dab2d/tiny.ckpt"  # a tiny fit's checkpoint, committed


def generate(tmp: Path, *extra: str) -> list[str]:
    return ["generate", "--config", TINY, "--max_new_tokens", "4", *extra]


def cost(tmp: Path, *extra: str) -> list[str]:
    return ["cost-model", "--config", TINY, "--out", str(tmp / "cost.json"), "--tokens", "1", "2", *extra]


def calibrate(tmp: Path, *extra: str) -> list[str]:
    return ["calibrate", "--config", TINY, "--ckpt_path", CKPT, *extra]


def draft_vocab(tmp: Path, *extra: str) -> list[str]:
    return ["draft-vocab", "--config", TINY, *extra]


def _train_only(tmp: Path) -> str:
    lines = Path("tests/data/tiny.jsonl").read_text().splitlines(keepends=True)
    return write(tmp / "train_only.jsonl", "".join(x for x in lines if '"split": "val"' not in x))


def _calibration_file(tmp: Path) -> str:
    return write(tmp / "calibration.json", json.dumps({"slot_temperatures": [1.0, 1.0, 1.0]}))


def _cost_file(tmp: Path) -> str:
    return write(tmp / "cost.json", json.dumps({"tokens": [1, 2], "verify": [1.0, 1.1], "draft": 0.1}))


def _verifier(tmp: Path, name: str, argument: str, file: str) -> list[str]:
    flag = f"--model.verifier.init_args.{argument}"
    return generate(tmp, "--prompt", "x", "--model.verifier", name, flag, file)


ROWS = [
    # (id, input -> command line, exit status, message fragment)
    ("generate-empty-prompt", lambda tmp: generate(tmp, "--prompt", ""), 1, "--prompt: prompt 0 is empty"),
    (
        "generate-empty-prompts-file",
        lambda tmp: generate(tmp, "--prompts", write(tmp / "p.jsonl", "")),
        1,
        "p.jsonl: no prompt records in the file",
    ),
    (
        "generate-empty-prompt-in-file",
        lambda tmp: generate(tmp, "--prompts", write(tmp / "p.jsonl", '{"prompt": "x"}\n{"prompt": ""}\n')),
        1,
        "p.jsonl:2: the prompt is empty",
    ),
    ("generate-humaneval-0", lambda tmp: generate(tmp, "--humaneval", "0"), 1, "--humaneval 0: num_prompts"),
    ("generate-humaneval-negative", lambda tmp: generate(tmp, "--humaneval", "-3"), 1, "--humaneval -3:"),
    ("generate-humaneval-past-164", lambda tmp: generate(tmp, "--humaneval", "165"), 1, "must be in 1..164"),
    (
        "generate-max-new-tokens-0",
        lambda tmp: generate(tmp, "--prompt", "x", "--max_new_tokens", "0"),
        1,
        "--max_new_tokens must be >= 1",
    ),
    (
        "generate-out-is-a-folder",
        lambda tmp: generate(tmp, "--prompt", "def f():", "--out", str(tmp)),
        1,
        "is a folder; give the path of a file to write",
    ),
    (
        "generate-out-under-a-file",
        lambda tmp: generate(tmp, "--prompt", "x", "--out", str(Path(write(tmp / "f", "x")) / "o.jsonl")),
        1,
        "is a file, so no folder can be made under it",
    ),
    ("cost-model-repeats-0", lambda tmp: cost(tmp, "--repeats", "0"), 1, "--repeats must be >= 1"),
    (
        "cost-model-context-past-the-target",
        lambda tmp: cost(tmp, "--context", "100000"),
        1,
        "--context 100000: with the largest tree of --tokens (2) that is 100002 positions, more than the "
        "target's context of 4096",
    ),
    ("cost-model-context-negative", lambda tmp: cost(tmp, "--context", "-5"), 1, "--context must be >= 1"),
    ("cost-model-context-0", lambda tmp: cost(tmp, "--context", "0"), 1, "--context must be >= 1"),
    (
        "cost-model-out-is-a-folder",
        lambda tmp: ["cost-model", "--config", TINY, "--out", str(tmp)],
        1,
        "is a folder",
    ),
    (
        "calibrate-data-without-validation-records",
        lambda tmp: calibrate(tmp, "--data.path", _train_only(tmp), "--out", str(tmp / "c.json")),
        1,
        "it fits and measures on the validation records",
    ),
    (
        "calibrate-fit-fraction-1",
        lambda tmp: calibrate(tmp, "--fit_fraction", "1", "--out", str(tmp / "c.json")),
        1,
        "--fit_fraction must be in (0, 1)",
    ),
    (
        "calibrate-out-under-a-file",
        lambda tmp: calibrate(tmp, "--out", str(Path(write(tmp / "f", "x")) / "c.json")),
        1,
        "is a file, so no folder can be made under it",
    ),
    (
        "ddtree-calibration-of-another-kind",  # a cost model where a calibration goes: refused when built
        lambda tmp: _verifier(tmp, "DDTree", "calibration", _cost_file(tmp)),
        1,
        "cost.json: not a calibration file (no 'slot_temperatures'",
    ),
    (
        "adaptive-cost-model-of-another-kind",
        lambda tmp: _verifier(tmp, "AdaptiveDDTree", "cost_model", _calibration_file(tmp)),
        1,
        "calibration.json: not a cost file (spec-drafters cost-model writes one",
    ),
    (
        "draft-vocab-sizes-0",
        lambda tmp: draft_vocab(tmp, "--out", str(tmp / "c.json"), "--sizes", "2048", "0"),
        1,
        "--sizes: a draft vocabulary needs at least 1 token, got 0",
    ),
    ("draft-vocab-out-is-a-folder", lambda tmp: draft_vocab(tmp, "--out", str(tmp)), 1, "is a folder"),
    (
        "cache-out-is-a-file",
        lambda tmp: ["cache", "--config", TINY, "--out", write(tmp / "cache", "not a folder")],
        1,
        "cache: is a file, not a folder",
    ),
    (
        "cache-shard-records-0",
        lambda tmp: ["cache", "--config", TINY, "--out", str(tmp / "c"), "--shard_records", "0"],
        1,
        "--shard_records must be >= 1",
    ),
]


@pytest.mark.parametrize("make, status, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_to_a_command_ends_as_one_line_before_the_work(make, status, fragment, tmp_path, capsys):
    check_row(make(tmp_path), status, fragment, capsys)


# --- nothing overwritten or lost ---------------------------------------------------------------------


def test_generate_out_folder_is_refused_before_decoding_and_left_as_it_was(tmp_path, capsys):
    (tmp_path / "earlier.jsonl").write_text("kept\n")
    check_row(generate(tmp_path, "--prompt", "def f():", "--out", str(tmp_path)), 1, "is a folder", capsys)
    assert "tokens" not in capsys.readouterr().out  # no prompt was decoded
    assert [p.name for p in tmp_path.iterdir()] == ["earlier.jsonl"]
    assert (tmp_path / "earlier.jsonl").read_text() == "kept\n"


def test_generate_keeps_finished_prompts_when_a_later_one_fails(tmp_path, monkeypatch, capsys):
    """Rows go to OUT.partial as each prompt finishes; OUT (here a previous run's) is replaced only
    when all are done, so a failure on prompt 2 keeps prompt 1 and the previous OUT whole."""
    import spec_drafters.cli.generate as command

    out = tmp_path / "gen.jsonl"
    main([*generate(tmp_path, "--prompt", "def f():", "--prompt", "x = 1", "--no_greedy"), "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [0, 1] and not (tmp_path / "gen.jsonl.partial").exists()
    before = out.read_text()
    decode = command._decode

    def fail_on_the_second(module, i, *args):
        if i == 1:
            raise RuntimeError("the machine went away")
        return decode(module, i, *args)

    monkeypatch.setattr(command, "_decode", fail_on_the_second)
    with pytest.raises(RuntimeError):
        main([*generate(tmp_path, "--prompt", "a", "--prompt", "b", "--no_greedy"), "--out", str(out)])
    assert out.read_text() == before
    partial = (tmp_path / "gen.jsonl.partial").read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in partial] == [0]
    assert "the 1 finished prompts are in" in capsys.readouterr().err


def _validate_untrained(tmp: Path, *extra: str) -> list[str]:
    return ["validate", "--config", TINY, "--trainer.logger", "false", "--trainer.default_root_dir",
            str(tmp / "run"), "--data.max_val_records", "2", "--drafters", "untrained", *extra]  # fmt: skip


def test_validate_drafters_twice_keeps_both_runs(tmp_path, monkeypatch, capsys):
    """Without --results each run writes into a folder of its own (they once shared
    runs/validate_many, and the second run overwrote the first); with --results DIR, a folder that
    already holds the files is refused before anything runs."""
    import spec_drafters.cli.results as results

    monkeypatch.setattr(results, "VALIDATE_MANY", tmp_path / "validate_many")
    main(_validate_untrained(tmp_path))
    main(_validate_untrained(tmp_path))
    runs = sorted((tmp_path / "validate_many").iterdir())
    assert len(runs) == 2 and all((r / "untrained.json").is_file() for r in runs)
    assert f"written to {runs[-1]}" in capsys.readouterr().out

    given = tmp_path / "mine"
    main(_validate_untrained(tmp_path, "--results", str(given)))
    first = (given / "untrained.json").read_text()
    check_row(_validate_untrained(tmp_path, "--results", str(given)), 1,
              "mine: already holds untrained.json from an earlier run", capsys)  # fmt: skip
    assert (given / "untrained.json").read_text() == first


def test_cache_shards_follow_the_umask(tmp_path):
    """safetensors' save_file creates a file 0600; a cache's shards get the mode of any new file."""
    old = os.umask(0o022)
    try:
        main(["cache", "--config", TINY, "--out", str(tmp_path / "cache"), "--shard_records", "16"])
    finally:
        os.umask(old)
    shards = sorted((tmp_path / "cache").glob("shard-*.safetensors"))
    assert len(shards) == 2
    assert {oct(p.stat().st_mode & 0o777) for p in [*shards, tmp_path / "cache" / "index.json"]} == {"0o644"}


def test_calibrate_that_makes_ece_worse_writes_and_warns(tmp_path, monkeypatch, capsys):
    """A legitimate run whose temperatures made the held-out ECE worse: written (the file's report
    has both figures), with a warning naming them (docs/tools.md, calibrate)."""
    import spec_drafters.decode.calibration as calibration

    monkeypatch.setattr(calibration, "fit_temperatures", lambda logits, labels: [0.25] * logits.shape[1])
    out = tmp_path / "c.json"
    check_row(calibrate(tmp_path, "--out", str(out)), 0, "made the held-out prefix ECE worse", capsys)
    written = json.loads(out.read_text())
    assert written["slot_temperatures"] == [0.25] * 3 and written["ece_after"] > written["ece_before"]
