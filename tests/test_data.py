"""Bad input fails with the place named; the shipped corpus is disjoint from the evaluation prompts."""

import gzip
import json

import pytest

from spec_drafters.data.corpus import humaneval_overlap
from spec_drafters.data.records import collate, read_jsonl, tokenize
from spec_drafters.target.tokenizers import ByteTokenizer

CORPUS = "data/stdlib_smollm2.jsonl.gz"


def test_malformed_line_is_named(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "ok"}\n{"text": broken\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_jsonl(p)


def test_record_without_text_is_named(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "only a prompt"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a record needs 'text', both 'prompt' and 'resp"):
        read_jsonl(p)


def test_prompt_is_unsupervised_and_truncation_keeps_alignment():
    ex = tokenize({"prompt": "ab", "response": "cdef"}, ByteTokenizer(), max_length=5)
    assert ex.input_ids == [97, 98, 99, 100, 101] and ex.loss_mask == [0, 0, 1, 1, 1]
    assert tokenize({"prompt": "abcdef", "response": "g"}, ByteTokenizer(), max_length=8) is None
    batch = collate([ex, tokenize({"text": "xy"}, ByteTokenizer(), 5)])
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert batch["loss_mask"][1].tolist() == [1, 1, 0, 0, 0]


def test_shipped_corpus_is_disjoint_from_humaneval_and_split():
    with gzip.open(CORPUS, "rt") as fh:
        records = [json.loads(line) for line in fh]
    assert len(records) >= 500
    assert humaneval_overlap(records) == []
    splits = {r["split"] for r in records}
    assert splits == {"train", "val"}
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids)
    assert all(r["response"].strip() for r in records[:50])


def test_prompt_files_name_the_bad_line(tmp_path):
    from spec_drafters.data.prompts import JsonlPrompts

    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "a"}\n\n{"text": "b"}\n{"prompt": "c"}\n')
    assert JsonlPrompts(str(good)).prompts() == ["a", "b", "c"]
    assert JsonlPrompts(str(good), limit=2).prompts() == ["a", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"response": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: a prompt record needs"):
        JsonlPrompts(str(bad)).prompts()


def test_humaneval_parts_cut_the_chosen_prompts_in_order():
    from spec_drafters.data.prompts import HumanEvalPrompts

    whole = HumanEvalPrompts(10).prompts()
    pieces = [HumanEvalPrompts(10, part=i, parts=3) for i in range(3)]
    assert [p.count for p in pieces] == [3, 3, 4] and [p.first for p in pieces] == [0, 3, 6]
    assert [t for p in pieces for t in p.prompts()] == whole
    for part, parts in ((3, 3), (-1, 2), (0, 11)):
        with pytest.raises(ValueError, match="part < parts <= num_prompts"):
            HumanEvalPrompts(10, part=part, parts=parts)
