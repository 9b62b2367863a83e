"""The reference corpus: every docstring (functions, methods, classes) becomes a HumanEval-shaped prompt;
HumanEval overlaps are dropped; batched left-padded greedy answers equal one-at-a-time greedy decoding;
an interrupted generation keeps its finished parts and never mixes in parts of another item list."""

import gzip
import json

from spec_drafters.data.corpus import answer_batch
from spec_drafters.data.reference_corpus import (
    assemble,
    docstring_items,
    finish,
    generate_parts,
    mix,
    select_items,
    source_windows,
)
from spec_drafters.decode.generate import greedy_generate
from spec_drafters.target.frozen import FrozenTarget
from spec_drafters.target.loaders import TinyRandom

MODULE = '''"""Module docstring."""


@decorator
def top(a, b=1):
    """Adds things together, carefully and well."""
    return a + b


class Box:
    """A box that holds one value for later use."""

    def put(self, value):
        """Stores a value inside the box for later."""
        self.value = value

    def _hidden(self):
        """A private helper that is documented too."""


def has_close_elements(numbers, threshold):
    """HumanEval's first problem name: must never reach the corpus."""


def short():
    """Too short."""
'''


def _fake_stdlib(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(MODULE)
    (tmp_path / "test").mkdir()  # test suites are skipped
    (tmp_path / "test" / "helpers.py").write_text(MODULE)
    return tmp_path


def test_every_documented_definition_is_a_prompt_cut_at_its_docstring(tmp_path):
    items = {it["name"]: it for it in docstring_items(_fake_stdlib(tmp_path))}
    assert set(items) == {"top", "Box", "put", "_hidden", "has_close_elements"}  # "short" doc < 20 chars
    assert items["top"]["prompt"] == 'def top(a, b=1):\n    """Adds things together, carefully and well."""\n'
    assert items["put"]["prompt"].startswith('def put(self, value):\n    """Stores')  # dedented method
    assert items["Box"]["kind"] == "class" and items["Box"]["prompt"].endswith('later use."""\n')
    kept = select_items(list(items.values()), val_fraction=0.5)
    assert "has_close_elements" not in {it["name"] for it in kept} and len(kept) == 4
    assert {it["split"] for it in kept} <= {"train", "val"}
    windows = list(source_windows(tmp_path, max_chars=120))
    assert "".join(w["text"] for w in windows) == MODULE  # whole lines, nothing lost
    assert all(len(w["text"]) <= 120 for w in windows)


def _target():
    loaded = TinyRandom(num_layers=2, dtype="float64", seed=3).load()
    loaded.card.eos_token_ids = [257]  # never produced by this target's greedy runs below
    return loaded


def test_batched_left_padded_answers_equal_one_at_a_time_greedy():
    loaded = _target()
    items = [{"id": str(i), "prompt": p} for i, p in enumerate(["def f(x):", "a", "class Q:\n    pass"])]
    got = answer_batch(items, loaded, max_new_tokens=12)
    frozen = FrozenTarget(loaded.model, [0])
    for it, rec in zip(items, got, strict=True):
        want = greedy_generate(frozen, loaded.tokenizer.encode(it["prompt"]), 12, eos_ids=[257]).tokens
        assert rec["response"] == loaded.tokenizer.decode(want)


def test_generation_resumes_by_part_and_never_mixes_item_lists(tmp_path):
    loaded = _target()
    items = [{"id": f"m:{i}", "prompt": f"def f{i}(x):"} for i in range(5)]
    assert generate_parts(items, loaded, tmp_path, part_size=2, batch_size=2, max_new_tokens=4) == 5
    parts = sorted(tmp_path.glob("part-*.jsonl.gz"))
    assert len(parts) == 3
    first = parts[0].read_bytes()
    stamp = parts[0].stat().st_mtime_ns
    parts[2].unlink()  # as if killed before the last part
    assert generate_parts(items, loaded, tmp_path, part_size=2, batch_size=2, max_new_tokens=4) == 1
    assert parts[0].stat().st_mtime_ns == stamp and parts[2].is_file()  # kept, the missing one redone
    other = [{"id": f"other:{i}", "prompt": it["prompt"]} for i, it in enumerate(items)]
    generate_parts(other, loaded, tmp_path, part_size=2, batch_size=2, max_new_tokens=4)
    with gzip.open(parts[0], "rt") as fh:
        assert json.loads(fh.readline())["id"] == "other:0"  # another item list: answered again
    generate_parts(items, loaded, tmp_path, part_size=2, batch_size=2, max_new_tokens=4)
    assert parts[0].read_bytes() == first  # deterministic bytes (gzip without a time stamp)
    a = assemble(parts, tmp_path / "all.jsonl.gz")
    b = assemble(parts, tmp_path / "again.jsonl.gz")
    assert a["records"] == 5 and a["sha256"] == b["sha256"]
    assert (tmp_path / "all.jsonl.gz").read_bytes() == (tmp_path / "again.jsonl.gz").read_bytes()


def test_a_run_that_only_assembles_keeps_the_generation_manifest(tmp_path):
    part = tmp_path / "part-00000.jsonl.gz"
    part.write_bytes(gzip.compress(b'{"id": "a"}\n', mtime=0))
    first = finish([part], tmp_path, answered=1, threads=1, seconds=2440.8)
    assert first["records"] == 1 and first["seconds"] == 2440.8
    again = finish([part], tmp_path, answered=0, threads=2, seconds=23.9)  # nothing answered: kept
    assert again == first == json.loads((tmp_path / "manifest.json").read_text())
    part.write_bytes(gzip.compress(b'{"id": "a"}\n{"id": "b"}\n', mtime=0))  # other content: rewritten
    assert finish([part], tmp_path, answered=0, threads=2, seconds=1.0)["seconds"] == 1.0
    assert finish([part], tmp_path, answered=3, threads=2, seconds=5.0)["seconds"] == 5.0


def test_mix_keeps_answer_splits_and_adds_train_windows_only(tmp_path):
    answers, source = tmp_path / "a.jsonl", tmp_path / "s.jsonl"
    answers.write_text('{"id": "1", "prompt": "p", "response": "r", "split": "val"}\n')
    source.write_text(
        '{"id": "s1", "text": "x", "split": "val"}\n{"id": "s2", "text": "y", "split": "train"}\n'
    )
    out = mix(answers, source, 5, tmp_path / "train.jsonl.gz")
    assert out["answers"] == 1 and out["source_windows"] == 1
    with gzip.open(tmp_path / "train.jsonl.gz", "rt") as fh:
        assert [json.loads(line)["id"] for line in fh] == ["1", "s2"]


def test_two_processes_share_the_parts_folder_one_in_reverse(tmp_path, monkeypatch):
    """Reverse order gives the same bytes, and a part another process finished meanwhile is skipped."""
    from spec_drafters.data import reference_corpus

    loaded = _target()
    items = [{"id": f"m:{i}", "prompt": f"def f{i}(x):"} for i in range(5)]
    generate_parts(items, loaded, tmp_path / "fwd", part_size=2, batch_size=2, max_new_tokens=4)
    written, real_write = [], reference_corpus.write_part

    def write(path, records):  # as the other process: part 0 appears while this one answers part 2
        real_write(path, records)
        written.append(path.name)
        if path.name == "part-00002.jsonl.gz":
            (tmp_path / "rev" / "part-00000.jsonl.gz").write_bytes(
                (tmp_path / "fwd" / "part-00000.jsonl.gz").read_bytes()
            )

    monkeypatch.setattr(reference_corpus, "write_part", write)
    generate_parts(items, loaded, tmp_path / "rev", part_size=2, batch_size=2, max_new_tokens=4, reverse=True)
    assert written == ["part-00002.jsonl.gz", "part-00001.jsonl.gz"]  # part 0 was not answered again
    for name in ("part-00000.jsonl.gz", "part-00001.jsonl.gz", "part-00002.jsonl.gz"):
        assert (tmp_path / "rev" / name).read_bytes() == (tmp_path / "fwd" / name).read_bytes()
