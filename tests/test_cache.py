"""The offline cache: online and offline training give the same loss on the same batch; an
interrupted build resumes; a corrupt shard is reported and skipped, never used; a cache built from
other data, max_length, tokenizer or records is refused with both values named."""

import json
import re
from pathlib import Path

import pytest
import torch

from spec_drafters.data.feature_cache import CachedRecords, build_cache, collate_cached, run_meta
from spec_drafters.data.records import TextRecords, collate
from spec_drafters.lightning.module import DFlashModule
from spec_drafters.model.drafter import DrafterConfig
from spec_drafters.target.injection import AllButLast
from spec_drafters.target.labels import LayerLogits
from spec_drafters.target.loaders import TinyRandom
from spec_drafters.train.anchors import UniformAnchors
from spec_drafters.train.losses import CEKLBlend


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    module = DFlashModule(
        target=TinyRandom(num_layers=6),
        drafter=DrafterConfig(num_layers=1, block_size=4),
        injection=AllButLast(num_taps=3),
        target_source=LayerLogits(3),  # a label layer outside fc: the cache must carry its hidden state
        loss=CEKLBlend(alpha=0.15),  # a soft loss: target logits are recomputed from the cached state
    ).eval()
    data = TextRecords(path="tests/data/tiny.jsonl", max_length=64)
    train, _ = data.examples(module.tokenizer)
    return module, data, train


def loss_of(module, batch):
    rows = range(batch["input_ids"].shape[0])
    inp = module.step_builder(
        batch, UniformAnchors(max_anchors=8), module.target_source, 5, rows, noisy=False
    )
    with torch.no_grad():
        return module.loss_fn(module.step_builder.slot_batch(module.step_builder.draft_hidden(inp), inp))[
            "loss"
        ]


def test_online_and_offline_losses_match(setup, tmp_path):
    module, data, train = setup
    index = build_cache(module.feature_spec(), data, tmp_path, shard_records=7, batch_size=3, progress=False)
    assert len(index["shards"]) == 3 and index["meta"]["label_layers"] == [3]
    cached = CachedRecords(tmp_path)
    assert len(cached) == len(train)
    lengths = [len(ex.input_ids) for ex in train]
    assert lengths[:7] != sorted(lengths[:7])  # the builder batches a shard by length...
    for i, ex in enumerate(train):  # ...and stores every record in the data's order, with its features
        assert cached[i]["input_ids"].tolist() == ex.input_ids
        solo = module.feature_spec()(collate([ex])["input_ids"], collate([ex])["attention_mask"])
        torch.testing.assert_close(cached[i]["features"], solo.clean[0], rtol=1e-5, atol=1e-5)
    online = loss_of(module, collate(train[:4]))
    offline = loss_of(module, collate_cached([cached[i] for i in range(4)]))
    torch.testing.assert_close(offline, online, rtol=1e-5, atol=1e-5)
    assert offline.item() > 0


def test_bf16_cache_is_half_the_features(setup, tmp_path):
    module, data, train = setup
    f32 = build_cache(module.feature_spec(), data, tmp_path / "f32", progress=False)
    bf16 = build_cache(module.feature_spec(), data, tmp_path / "bf16", dtype="bfloat16", progress=False)
    assert bf16["bytes"] < 0.6 * f32["bytes"]
    assert abs(loss_of(module, collate_cached([CachedRecords(tmp_path / "bf16")[i] for i in range(4)]))
               - loss_of(module, collate(train[:4]))) < 0.05  # fmt: skip


def test_interrupted_build_resumes_and_corrupt_shards_are_skipped(setup, tmp_path):
    module, data, train = setup
    build_cache(module.feature_spec(), data, tmp_path, shard_records=7, progress=False)
    first = (tmp_path / "shard-00000.safetensors").stat().st_mtime_ns
    (tmp_path / "shard-00002.safetensors").unlink()  # as if killed before the last shard
    index = build_cache(module.feature_spec(), data, tmp_path, shard_records=7, progress=False)
    assert (tmp_path / "shard-00000.safetensors").stat().st_mtime_ns == first  # kept, not rebuilt
    assert (tmp_path / "shard-00002.safetensors").is_file() and len(index["shards"]) == 3
    with open(tmp_path / "shard-00001.safetensors", "r+b") as fh:  # flip bytes in the middle
        fh.seek(200)
        fh.write(b"\x00\x01\x02\x03")
    with pytest.warns(UserWarning, match="shard-00001"):
        cached = CachedRecords(tmp_path)
    assert cached.skipped == ["shard-00001.safetensors"] and len(cached) == len(train) - 7
    with pytest.raises(ValueError, match="fc_ids"):
        CachedRecords(tmp_path, expect={"fc_ids": [1, 2, 3]})
    assert json.loads((tmp_path / "index.json").read_text())["meta"]["fc_ids"] == [1, 2]


def test_two_builders_share_a_folder_and_an_unfinished_cache_is_refused(setup, tmp_path, monkeypatch):
    """A forward and a --reverse build split the shards; until every record is in, training refuses."""
    import spec_drafters.data.feature_cache as fc

    module, data, train = setup
    whole = build_cache(module.feature_spec(), data, tmp_path / "one", shard_records=7, progress=False)
    real, built = fc._write_shard, []

    def stop_after_two(spec, chunk, file, *a):
        if len(built) == 2:
            raise KeyboardInterrupt  # the forward builder killed after two shards
        built.append(file.name)
        return real(spec, chunk, file, *a)

    monkeypatch.setattr(fc, "_write_shard", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        build_cache(module.feature_spec(), data, tmp_path / "two", shard_records=7, progress=False)
    assert built == ["shard-00000.safetensors", "shard-00001.safetensors"]
    with pytest.raises(ValueError, match="unfinished: its shards hold 14 of the 20 records"):
        CachedRecords(tmp_path / "two")
    monkeypatch.setattr(fc, "_write_shard", real)
    reverse_built = []
    monkeypatch.setattr(fc, "_write_shard", lambda spec, chunk, file, *a: reverse_built.append(file.name)
                        or real(spec, chunk, file, *a))  # fmt: skip
    index = build_cache(module.feature_spec(), data, tmp_path / "two", shard_records=7, progress=False,
                        reverse=True)  # fmt: skip
    assert reverse_built == ["shard-00002.safetensors"]  # the other's two shards are taken as they are
    assert [s["sha256"] for s in index["shards"]] == [s["sha256"] for s in whole["shards"]]
    assert index["tokens"] == whole["tokens"] and len(CachedRecords(tmp_path / "two")) == len(train)
    with pytest.raises(ValueError, match=re.escape("shard_records=7 (this build: 5)")):
        build_cache(module.feature_spec(), data, tmp_path / "two", shard_records=5, progress=False)


def test_hard_loss_cache_stores_labels_not_hidden_states(tmp_path):
    """A hard loss needs only the label ids: stored once, equal to what the online step computes, and
    the (S, H) label hidden state is left out (the step never runs the head over every position)."""
    torch.manual_seed(0)
    module = DFlashModule(
        target=TinyRandom(num_layers=6),
        drafter=DrafterConfig(num_layers=1, block_size=4),
        injection=AllButLast(num_taps=3),
        target_source=LayerLogits(3),
    ).eval()
    data = TextRecords(path="tests/data/tiny.jsonl", max_length=64)
    train, _ = data.examples(module.tokenizer)
    index = build_cache(module.feature_spec(), data, tmp_path, shard_records=5, progress=False)
    assert index["meta"]["label_hidden"] is False
    cached = CachedRecords(tmp_path)
    assert "label_hidden" not in cached[0] and cached[0]["labels"][0] == -1  # nothing predicts position 0
    online_batch, offline_batch = collate(train[:4]), collate_cached([cached[i] for i in range(4)])
    out = module.target(online_batch["input_ids"], attention_mask=online_batch["attention_mask"])
    want, ok = module.target_source.hard_labels(module.target, out, online_batch["input_ids"])
    real = online_batch["attention_mask"].bool()
    assert torch.equal(offline_batch["labels"][real & ok], want[real & ok])
    torch.testing.assert_close(loss_of(module, offline_batch), loss_of(module, online_batch))
    with pytest.raises(ValueError, match="label_hidden"):  # a soft loss cannot train from it
        CachedRecords(tmp_path, expect={"label_hidden": True})


def test_records_are_read_lazily_and_survive_pickling(setup, tmp_path):
    """DataLoader workers receive the dataset pickled: no open memory map travels with it."""
    import pickle

    module, data, _ = setup
    build_cache(module.feature_spec(), data, tmp_path, shard_records=7, progress=False)
    cached = CachedRecords(tmp_path)
    first = cached[8]
    again = pickle.loads(pickle.dumps(cached))[8]
    assert cached._open and all(torch.equal(first[k], again[k]) for k in first)


def _run(module, path, max_length=64, **kw):
    """This run's expectations and training records for ``path`` at ``max_length``."""
    data = TextRecords(path=path, max_length=max_length, **kw)
    train, _ = data.examples(module.tokenizer)
    return run_meta(module.feature_spec(), data, train), train


def test_a_cache_from_other_data_length_tokenizer_or_records_is_refused(setup, tmp_path):
    module, data, train = setup
    build_cache(module.feature_spec(), data, tmp_path / "c", progress=False)
    expect, _ = _run(module, "tests/data/tiny.jsonl")
    assert len(CachedRecords(tmp_path / "c", expect, train)) == len(train)  # this run's own cache
    with pytest.raises(ValueError, match=r"max_length=64, this run has 32 \(--data.max_length\)"):
        CachedRecords(tmp_path / "c", _run(module, "tests/data/tiny.jsonl", max_length=32)[0])
    other = tmp_path / "other.jsonl"  # same records, one character changed
    other.write_text(Path("tests/data/tiny.jsonl").read_text().replace("a + b", "b + a", 1))
    with pytest.raises(ValueError, match=r"data_sha256='\w+' \(from tests/data/tiny.jsonl\), this run has "):
        CachedRecords(tmp_path / "c", _run(module, str(other))[0])
    with pytest.raises(ValueError, match=r"records=\d+, this run has 5 "):
        CachedRecords(tmp_path / "c", _run(module, "tests/data/tiny.jsonl", max_train_records=5)[0])
    with pytest.raises(ValueError, match=r"tokenizer=\{'name': 'ByteTokenizer', 'vocab_size': 259\}, this"):
        CachedRecords(tmp_path / "c", {**expect, "tokenizer": {"name": "Other", "vocab_size": 259}})


def _as_format_1(path):
    """The index a cache had before it recorded its data, max_length and tokenizer."""
    index = json.loads((path / "index.json").read_text())
    index["meta"] = {k: index["meta"][k] for k in ("target", "fc_ids", "label_source", "records", "dtype")}
    index["meta"]["format"] = 1
    (path / "index.json").write_text(json.dumps(index))


def test_a_format_1_cache_is_used_only_when_its_records_are_this_runs(setup, tmp_path):
    module, data, train = setup
    build_cache(module.feature_spec(), data, tmp_path, shard_records=7, progress=False)
    _as_format_1(tmp_path)
    expect, _ = _run(module, "tests/data/tiny.jsonl")
    assert len(CachedRecords(tmp_path, expect, train)) == len(train)  # checked token by token
    expect32, train32 = _run(module, "tests/data/tiny.jsonl", max_length=32)
    with pytest.raises(
        ValueError, match=r"format-1 cache .* its record \d+ differs from this run's; rebuild"
    ):
        CachedRecords(tmp_path, expect32, train32)
    with open(tmp_path / "shard-00001.safetensors", "r+b") as fh:  # a shard lost: nothing to compare
        fh.seek(200)
        fh.write(b"\x00\x01")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=r"cannot be checked .*; rebuild"):
        CachedRecords(tmp_path, expect, train)


def test_tokenizer_identity_is_its_vocabulary_not_its_folder():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from spec_drafters.target.tokenizers import TextTokenizer

    def tok(vocab):
        return TextTokenizer(PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, "u"))))

    a, b = {"u": 0, "x": 1, "y": 2}, {"u": 0, "x": 2, "y": 1}  # same size, two ids swapped
    assert tok(a).identity() == tok(dict(a)).identity()
    assert tok(a).identity()["vocab_size"] == tok(b).identity()["vocab_size"] == 3
    assert tok(a).identity() != tok(b).identity()
