"""Held out by content (spec_drafters.data.heldout): duplicate records never straddle the split.

The rule's cases (exact, re-indented/commented and same-answer duplicates grouped, groups closed under
shared text, a group held out only when all of it is, order-independent), the reader that applies it
(one file and --data.val_path), and every corpus the repository ships: no held-out record's normalised
text is a training record's after the rule, and how many were before."""

import gzip
import json
import random
from pathlib import Path

import pytest

from spec_drafters.data.heldout import MIN_SUPERVISED, content_keys, normalise, shared_keys, split_by_content
from spec_drafters.data.records import TextRecords

ANSWER = "    return sorted(items, key=len)  # the shortest first, then by length\n"
assert len(normalise(ANSWER)) >= MIN_SUPERVISED


def rec(prompt: str, response: str = ANSWER, split: str = "val") -> dict:
    return {"prompt": prompt, "response": response, "split": split}


def splits(records: list[dict]) -> list[str]:
    return split_by_content(records, [r["split"] for r in records])


def test_normalise_drops_whitespace_and_comment_lines_only():
    assert normalise("def f(x):\n    # why\n    return x  # kept\n") == "deff(x):returnx#kept"
    assert normalise("a = '#'\n\t# gone\n") == normalise("a='#'")


def test_exact_and_near_duplicates_go_to_training_with_their_twin():
    records = [
        rec('def f(x):\n    """Doc."""\n', split="train"),
        rec('def f(x):\n    """Doc."""\n'),  # byte-identical
        rec('def f( x ):\n        # a comment\n        """Doc."""\n', response="other " * 8),  # re-indented
        rec('def g(x):\n    """Doc, rewrapped."""\n'),  # another prompt, the same answer
        rec('def h(x):\n    """Something else."""\n', response="    return x * 2 if x else None\n" * 2),
    ]
    assert splits(records) == ["train", "train", "train", "train", "val"]


def test_groups_close_over_shared_text_and_stay_held_out_when_all_held_out():
    chain = [
        rec("def a(): ...\n", split="train"),
        rec("def a(): ...\n", response="x = 1; " * 8),  # shares the prompt with the training record
        rec("def b(): ...\n", response="x = 1; " * 8),  # shares only the second one's answer
    ]
    assert splits(chain) == ["train"] * 3
    twins = [rec("def c(): ...\n"), rec("def c(): ...\n")]  # duplicates, but none trains
    assert splits(twins) == ["val", "val"]


def test_short_answers_and_empty_prompts_do_not_group():
    records = [rec("def a(): ...\n", "pass", "train"), rec("def b(): ...\n", "pass")]
    assert splits(records) == ["train", "val"]
    assert content_keys({"text": "", "split": "val"}) == []


def test_the_rule_is_deterministic_and_independent_of_order():
    rng = random.Random(0)
    prompts = [f"def f{i % 7}(x):\n" for i in range(40)]
    answers = [f"    return {i % 5} + x * {i % 5} + len(str(x))\n" for i in range(40)]
    records = [
        {**rec(p, a, rng.choice(["train", "val", "val"])), "n": n}
        for n, (p, a) in enumerate(zip(prompts, answers, strict=True))
    ]
    first = dict(zip((r["n"] for r in records), splits(records), strict=True))
    for _ in range(5):
        rng.shuffle(records)
        assert dict(zip((r["n"] for r in records), splits(records), strict=True)) == first
    train = [r for r in records if first[r["n"]] == "train"]
    assert shared_keys(train, [r for r in records if first[r["n"]] == "val"]) == []


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("two_files", [False, True])
def test_the_reader_moves_shared_validation_records_to_training_and_says_so(tmp_path, two_files):
    records = [rec("def a(): ...\n", split="train"), rec("def a(): ...\n"), rec("def b(): ...\n", "y\n" * 9)]
    if two_files:
        train = write_jsonl(tmp_path / "train.jsonl", records[:1])
        data = TextRecords(path=str(train), val_path=str(write_jsonl(tmp_path / "val.jsonl", records[1:])))
    else:
        data = TextRecords(path=str(write_jsonl(tmp_path / "all.jsonl", records)))
    train, val = data._split()
    assert [r["prompt"] for _, r in train] == ["def a(): ...\n"] * 2
    assert [r["prompt"] for _, r in val] == ["def b(): ...\n"]
    assert data.notes == [
        "held out by content: 1 of 2 validation records share text with training records and train "
        "instead (docs/data.md)"
    ]


def read(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def text(r: dict) -> tuple:
    return r.get("prompt"), r.get("response"), r.get("text")


def reference_answers(tmp_path: Path) -> Path:
    """The committed answer parts joined as `make reference` joins them (its sha256 unchanged)."""
    from spec_drafters.data.reference_corpus import assemble

    folder = Path("data/reference/answers")
    joined = assemble(sorted(folder.glob("part-*.jsonl.gz")), tmp_path / "corpus.jsonl.gz")
    assert joined["sha256"] == json.loads((folder / "manifest.json").read_text())["sha256"]
    return tmp_path / "corpus.jsonl.gz"


# Every corpus the repository ships (the source windows are built from the local standard library,
# their split not committed): validation records sharing text with training ones by the id split
# alone (byte-identical ones, then all the rule finds), 0 after. The first 128 held-out records of the
# reference corpus, its checkpoints' selection set, held 9 byte-identical ones.
SHIPPED = [
    ("tests/data/tiny.jsonl", 0, 0),
    ("data/stdlib_smollm2.jsonl.gz", 2, 2),
    ("data/reference/answers/corpus.jsonl.gz", 16, 19),  # the committed join, validated on
    ("reference answers", 16, 19),  # the committed parts, joined here
]


@pytest.mark.parametrize(("name", "identical", "shared"), SHIPPED)
def test_no_shipped_corpus_holds_out_text_it_trains_on(tmp_path, name, identical, shared):
    path = reference_answers(tmp_path) if name == "reference answers" else Path(name)
    records = read(path)
    by_id = {s: [r for r in records if r["split"] == s] for s in ("train", "val")}
    trained = {text(r) for r in by_id["train"]}
    assert sum(text(r) in trained for r in by_id["val"]) == identical
    assert len(shared_keys(by_id["train"], by_id["val"])) == shared
    train, val = TextRecords(path=str(path))._split()
    assert shared_keys([r for _, r in train], [r for _, r in val]) == []
    assert len(train) + len(val) == len(records) and len(val) == len(by_id["val"]) - shared
