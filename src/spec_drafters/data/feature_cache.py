"""Offline cache of what training needs from the frozen target: run it once, train many times.

Per training record the cache keeps the tokens, the loss mask, the tapped features that feed ``fc``
(n*H per token) and, for logit-based target sources, the hidden state the labels are read from (H per
token, already through the final norm) instead of vocabulary-wide logits: labels are recomputed from
it with the frozen head at train time (docs/method.md section 6: caches of many TB came from storing logits).

Hard labels are computed once at build time and stored as token ids (``labels``, -1 where no
label exists): a hard loss then never runs the vocabulary head over every position of every step,
which on a small target cost more than the drafter itself. The label hidden state is stored only
when the loss needs the target's distribution (soft losses).

Layout: ``index.json`` + ``shard-NNNNN.safetensors``; each shard holds flat ``input_ids``,
``loss_mask``, ``features``, ``labels`` (and ``label_hidden`` for soft losses) over its records'
tokens and ``offsets`` (records + 1). Shards are read through memory maps, record by record, so a
cache larger than memory trains without loading it whole.
The index lists every finished shard with its sha256, so an interrupted build resumes where it
stopped and a corrupt or truncated shard is reported and skipped at load time, never used.

The index's ``meta`` records what the cache was built from (the CHECKED keys: target, fc layers,
target source, tokenizer, the data file's sha256, max_length, record count); a run whose own values
differ is refused with both named, since it would otherwise train on the cache's sequences, not its
own. Format-1 caches recorded only the first three; they are used only when their records equal the
run's token for token.
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from spec_drafters.errors import InputError, MissingFile
from spec_drafters.files import file_lock, sha256_file, write_json
from spec_drafters.target.features import FeatureSpec

#: 2: meta records the tokenizer, the data file's sha256, max_length and the record count; hard labels
#: are stored; the label hidden state only for soft losses.
FORMAT = 2

#: What a cache must share with the run training from it, and what sets each in that run.
CHECKED = {
    "target": "--model.target",
    "fc_ids": "--model.injection",
    "label_source": "--model.target_source",  # the stored key's name: caches written so keep loading
    "tokenizer": "the target's tokenizer",
    "data_sha256": "--data.path",
    "max_length": "--data.max_length",
    "records": "training records of --data.path, --data.max_train_records",
    "label_hidden": "--model.loss (a soft loss needs the cached label hidden state)",
}
#: The CHECKED keys a format-1 cache recorded.
CHECKED_V1 = ("target", "fc_ids", "label_source")
REBUILD = "rebuild it for this run with spec-drafters cache (same --config and --data.* as the run)"


def run_meta(spec: FeatureSpec, data, examples: list) -> dict:
    """The CHECKED values of this run (and its data path, for messages): ``spec`` its target side,
    ``data`` its TextRecords, ``examples`` its training records."""
    return {
        "target": spec.identity["target"],
        "fc_ids": list(spec.fc_ids),
        "label_source": spec.identity["label_source"],
        "tokenizer": spec.identity["tokenizer"],
        "data_sha256": sha256_file(Path(data.path)),
        "max_length": data.max_length,
        "records": len(examples),
        "data_path": str(data.path),  # for messages only: the sha256 is what is compared
    }


@torch.no_grad()
def build_cache(
    spec: FeatureSpec,
    data,
    out: str | Path,
    dtype: str = "float32",
    shard_records: int = 64,
    batch_size: int = 4,
    progress: bool = True,
    reverse: bool = False,
) -> dict:
    """Runs the target over the training records of ``data`` (TextRecords) and writes the cache;
    returns the index. Run again after an interruption, it keeps the shards whose checksum holds.

    ``reverse`` builds the shards from the last one back, so that a second process can share the
    folder with a forward one: each re-reads the index (under a lock) before every shard and skips
    what the other finished; where they meet, at most one shard is built twice (identically)."""
    store = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if store is None:
        raise ValueError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    examples, _ = data.examples(spec.tokenizer)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        **run_meta(spec, data, examples),
        "label_layers": spec.identity["label_layers"],
        "dtype": dtype,
        "label_hidden": spec.soft,
        "shard_records": shard_records,
    }
    starts = list(range(0, len(examples), shard_records))
    with _locked(out):
        write_json(out / "index.json", _open_index(out, meta))
    order = list(enumerate(starts))
    bar = _bar(len(starts)) if progress else None
    for shard_id, start in reversed(order) if reverse else order:
        name = f"shard-{shard_id:05d}.safetensors"
        with _locked(out):
            done = {s["file"]: s for s in _read_index(out)["shards"]}
        finished = name in done and (out / name).is_file()  # before an interruption, or by the other
        if not (finished and sha256_file(out / name) == done[name]["sha256"]):
            entry = _write_shard(spec, examples[start : start + shard_records], out / name, store, batch_size)
            with _locked(out):
                index = _read_index(out)
                index["shards"] = sorted(
                    [s for s in index["shards"] if s["file"] != name] + [entry], key=lambda s: s["file"]
                )
                write_json(out / "index.json", index)
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    with _locked(out):
        index = _read_index(out)
        index["bytes"] = sum((out / s["file"]).stat().st_size for s in index["shards"])
        index["tokens"] = sum(s["tokens"] for s in index["shards"])
        write_json(out / "index.json", index)
    return index


def _locked(out: Path):
    """An exclusive lock on the folder's index (two builders may share a folder: ``reverse``)."""
    return file_lock(out / ".index.lock")


def _read_index(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())


def _open_index(out: Path, meta: dict) -> dict:
    """The folder's index (new, or the one an interrupted build of the same run left)."""
    path = out / "index.json"
    index = json.loads(path.read_text()) if path.is_file() else {"meta": meta, "shards": []}
    built = index["meta"]
    differ = [
        k
        for k in meta.keys() | built.keys()
        if k != "data_path" and built.get(k) != meta.get(k) and not (k == "shard_records" and k not in built)
    ]
    if differ:
        raise InputError(
            f"{out}: an existing cache was built with "
            + ", ".join(f"{k}={built.get(k)!r} (this build: {meta.get(k)!r})" for k in sorted(differ))
            + "; use a new --out folder"
        )
    index["meta"] = {**index["meta"], **meta}
    return index


def _bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="cache shards", unit="shard")


def _write_shard(spec: FeatureSpec, chunk: list, file: Path, store: torch.dtype, batch_size: int) -> dict:
    """Runs the target over one shard's records and writes it atomically; returns its index entry."""
    from spec_drafters.data.records import collate

    # Batches of records of similar length (the shard's records stay in their order on disk): padded
    # to each batch's longest, the corpus's own order wasted ~1.66x the tokens on padding, sorted ~1.11x.
    order = sorted(range(len(chunk)), key=lambda i: (len(chunk[i].input_ids), i))
    rows: dict[int, dict[str, torch.Tensor]] = {}
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        group = [chunk[i] for i in idx]
        batch = collate(group)
        feats = spec(batch["input_ids"], batch["attention_mask"])  # what online training computes
        labels = feats.labels.masked_fill(~feats.label_ok, -1).to(torch.int32)  # (b, S)
        for j, (i, ex) in enumerate(zip(idx, group, strict=True)):
            n = len(ex.input_ids)
            rows[i] = {
                "input_ids": torch.tensor(ex.input_ids),
                "loss_mask": torch.tensor(ex.loss_mask),
                "features": feats.clean[j, :n].to(store),
                "labels": labels[j, :n],
            }
            if spec.soft:
                rows[i]["label_hidden"] = feats.hidden[j, :n].to(store)
    parts = {k: [rows[i][k] for i in range(len(chunk))] for k in CachedRecords.FIELDS if k in rows[0]}
    lengths = torch.tensor([len(ex.input_ids) for ex in chunk])
    tensors = {k: torch.cat(v).contiguous() for k, v in parts.items() if v}
    tensors["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    tmp = file.with_name(file.name + ".tmp")
    save_file(tensors, str(tmp))
    _follow_umask(tmp)
    os.replace(tmp, file)
    return {
        "file": file.name,
        "records": len(chunk),
        "tokens": int(lengths.sum()),
        "sha256": sha256_file(file),
    }


def _follow_umask(file: Path) -> None:
    """Gives ``file`` the mode any new file gets (0644 under umask 022): ``save_file`` creates its
    files 0600, so a cache built for a team would be readable by its builder only."""
    mask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    os.chmod(file, 0o666 & ~mask)


class CachedRecords(torch.utils.data.Dataset):
    """The records of a cache, read lazily through memory maps; shards failing their checksum are
    reported and skipped, never used."""

    FIELDS = ("input_ids", "loss_mask", "features", "labels", "label_hidden")

    def __init__(self, path: str | Path, expect: dict | None = None, examples: list | None = None):
        """``expect``: this run's CHECKED values (run_meta); ``examples``: its training records, which
        a format-1 cache must equal token for token (it did not record what it was built from)."""
        path = Path(path)
        if not (path / "index.json").is_file():
            raise MissingFile(f"--data.cache: no index.json in {path} (build it with spec-drafters cache)")
        index = json.loads((path / "index.json").read_text())
        meta = index["meta"]
        legacy = meta.get("format", 1) < 2
        for key in [k for k in CHECKED if k in (expect or {})]:  # in CHECKED's order: the first that differs
            if legacy and key not in CHECKED_V1:
                continue  # not recorded: the records themselves are compared below
            if meta.get(key) != expect[key]:
                raise InputError(_mismatch(path, meta, expect, key))
        self.files: list[Path] = []
        self.records: list[tuple[int, int, int]] = []  # (shard, first token, end token)
        self.skipped: list[str] = []
        self.notes: list[str] = []  # for the run's log
        for shard in index["shards"]:
            file = path / shard["file"]
            if not file.is_file() or sha256_file(file) != shard["sha256"]:
                self.skipped.append(shard["file"])
                continue
            with safe_open(str(file), framework="pt") as f:
                off = f.get_tensor("offsets").tolist()
            self.records += [(len(self.files), a, b) for a, b in itertools.pairwise(off)]
            self.files.append(file)
        self._open: dict[int, object] = {}
        indexed = sum(s["records"] for s in index["shards"])
        if not legacy and indexed < meta["records"]:  # silently training on part of the data: refused
            raise InputError(
                f"--data.cache {path} is unfinished: its shards hold {indexed} of the "
                f"{meta['records']} records it was built for; run the same spec-drafters cache "
                "command again to finish it"
            )
        if self.skipped:
            warnings.warn(
                f"--data.cache: skipped shards failing their checksum or missing: {self.skipped}",
                stacklevel=2,
            )
        if not self.records:
            raise ValueError(f"--data.cache {path}: no usable shard")
        if legacy and expect is not None:
            _check_records(path, [self[i] for i in range(len(self))], self.skipped, examples)
            self.notes.append(f"--data.cache {path}: a format-1 cache; its records equal this run's")

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        shard, a, b = self.records[i]
        if shard not in self._open:  # opened on first use in each (worker) process
            self._open[shard] = safe_open(str(self.files[shard]), framework="pt")
        f = self._open[shard]
        present = set(f.keys())
        return {k: f.get_slice(k)[a:b] for k in self.FIELDS if k in present}

    def __getstate__(self) -> dict:  # memory maps do not cross process boundaries; reopen there
        return {**self.__dict__, "_open": {}}


def _mismatch(path: Path, meta: dict, expect: dict, key: str) -> str:
    built, have = repr(meta.get(key)), repr(expect[key])
    if key == "data_sha256":  # hashes alone do not say which files
        built, have = f"{built} (from {meta.get('data_path')})", f"{have} (from {expect.get('data_path')})"
    return (
        f"--data.cache {path} was built with {key}={built}, this run has {have} ({CHECKED[key]}); {REBUILD}"
    )


def _check_records(path: Path, items: list[dict], skipped: list[str], examples: list | None) -> None:
    """A format-1 cache is used only if its records are this run's: same count, ids and loss masks."""
    old = (
        f"--data.cache {path} is a format-1 cache (it did not record its data file, max_length or tokenizer)"
    )
    if skipped or examples is None:
        raise InputError(f"{old} and its records cannot be checked against this run's; {REBUILD}")
    if len(items) != len(examples):
        raise InputError(f"{old}: it has {len(items)} records, this run {len(examples)}; {REBUILD}")
    for i, (item, ex) in enumerate(zip(items, examples, strict=True)):
        if item["input_ids"].tolist() != ex.input_ids or item["loss_mask"].tolist() != ex.loss_mask:
            raise InputError(f"{old}: its record {i} differs from this run's; {REBUILD}")


def collate_cached(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pads a batch of cached records: ids, masks, features (b, S, n*H), labels (b, S) with -1
    where none exists, label hidden (b, S, H) for soft losses."""
    width = max(len(it["input_ids"]) for it in items)
    b = len(items)
    out = {
        "input_ids": torch.zeros((b, width), dtype=torch.long),
        "attention_mask": torch.zeros((b, width), dtype=torch.long),
        "loss_mask": torch.zeros((b, width), dtype=torch.long),
        "features": torch.zeros((b, width, items[0]["features"].shape[-1]), dtype=torch.float32),
    }
    if "labels" in items[0]:
        out["labels"] = torch.full((b, width), -1, dtype=torch.long)
    if "label_hidden" in items[0]:
        out["label_hidden"] = torch.zeros((b, width, items[0]["label_hidden"].shape[-1]), dtype=torch.float32)
    for i, it in enumerate(items):
        n = len(it["input_ids"])
        out["input_ids"][i, :n] = it["input_ids"]
        out["attention_mask"][i, :n] = 1
        out["loss_mask"][i, :n] = it["loss_mask"]
        out["features"][i, :n] = it["features"].float()
        if "labels" in out:
            out["labels"][i, :n] = it["labels"]
        if "label_hidden" in out:
            out["label_hidden"][i, :n] = it["label_hidden"].float()
    return out
