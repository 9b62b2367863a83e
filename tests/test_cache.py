"""The offline cache: online and offline training give the same loss on the same batch; an
interrupted build resumes; a corrupt shard is reported and skipped, never used."""

import json

import pytest
import torch

from spec_drafters.anchors import UniformAnchors
from spec_drafters.cache import CachedRecords, build_cache, collate_cached
from spec_drafters.data import TextDataModule, collate
from spec_drafters.drafter import DrafterConfig
from spec_drafters.injection import AllButLast
from spec_drafters.losses import CEKLBlend
from spec_drafters.module import DFlashModule
from spec_drafters.target_source import LayerLogits
from spec_drafters.targets import TinyRandom


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
    train, _ = TextDataModule(path="tests/data/tiny.jsonl", max_length=64).examples(module.tokenizer)
    return module, train


def loss_of(module, batch):
    inp = module.prepare(batch, UniformAnchors(max_anchors=8), seed=5, noisy=False)
    with torch.no_grad():
        return module.loss_fn(module.slot_batch(module.draft_hidden(inp), inp))["loss"]


def test_online_and_offline_losses_match(setup, tmp_path):
    module, train = setup
    index = build_cache(module, train, tmp_path, shard_records=7, batch_size=3, progress=False)
    assert len(index["shards"]) == 3 and index["meta"]["label_layers"] == [3]
    cached = CachedRecords(tmp_path)
    assert len(cached) == len(train)
    online = loss_of(module, collate(train[:4]))
    offline = loss_of(module, collate_cached([cached[i] for i in range(4)]))
    torch.testing.assert_close(offline, online, rtol=1e-5, atol=1e-5)
    assert offline.item() > 0


def test_bf16_cache_is_half_the_features(setup, tmp_path):
    module, train = setup
    f32 = build_cache(module, train, tmp_path / "f32", progress=False)
    bf16 = build_cache(module, train, tmp_path / "bf16", dtype="bfloat16", progress=False)
    assert bf16["bytes"] < 0.6 * f32["bytes"]
    assert abs(loss_of(module, collate_cached([CachedRecords(tmp_path / "bf16")[i] for i in range(4)]))
               - loss_of(module, collate(train[:4]))) < 0.05  # fmt: skip


def test_interrupted_build_resumes_and_corrupt_shards_are_skipped(setup, tmp_path):
    module, train = setup
    build_cache(module, train, tmp_path, shard_records=7, progress=False)
    first = (tmp_path / "shard-00000.safetensors").stat().st_mtime_ns
    (tmp_path / "shard-00002.safetensors").unlink()  # as if killed before the last shard
    index = build_cache(module, train, tmp_path, shard_records=7, progress=False)
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
    train, _ = TextDataModule(path="tests/data/tiny.jsonl", max_length=64).examples(module.tokenizer)
    index = build_cache(module, train, tmp_path, shard_records=5, progress=False)
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

    module, train = setup
    build_cache(module, train, tmp_path, shard_records=7, progress=False)
    cached = CachedRecords(tmp_path)
    first = cached[8]
    again = pickle.loads(pickle.dumps(cached))[8]
    assert cached._open and all(torch.equal(first[k], again[k]) for k in first)
