"""Training and validation text: JSONL records tokenized by the target's tokenizer.

A record is one of:

- ``{"prompt": ..., "response": ...}`` (only the response is supervised) or ``{"text": ...}`` (all of it
  is supervised): plain text, encoded so that no text can produce a special token;
- a conversation, ``{"messages": [...]}`` or ``{"conversations": [...]}``, optionally with
  ``"enable_thinking"``: rendered by the target's chat template, its chat markup as the single special
  ids the served model sees, the assistant's tokens supervised (data/chat.py);
- ``{"input_ids": [...], "loss_mask": [...]}``: tokens exactly, read as they are (what a generation
  engine returned), never re-tokenized.
 With one file, each record's ``"split"`` field ("train" or "val") decides
where it goes; with ``val_path`` set, the two files are the two splits. Either way a validation record
that shares text with a training record trains instead (:mod:`spec_drafters.data.heldout`). Files may be
gzipped.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DistributedSampler

from spec_drafters.data.chat import conversation, is_chat, render
from spec_drafters.data.heldout import split_by_content
from spec_drafters.errors import InputError, MissingFile
from spec_drafters.rng import derived_seed


def iter_jsonl(path: str | Path, flag: str = "--data.path"):
    """(line number, parsed value) for every non-empty line of a .jsonl or .jsonl.gz file.

    A missing file or a malformed line is an error that names the flag, the file and the line.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"{flag}: no file {path} (run from the repository root, or give an absolute path)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:  # bytes, decoded line by line: a bad byte names its line
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{path}:{lineno}: not UTF-8 text (byte {e.start} of the line: {raw[e.start : e.end]!r})"
                ) from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None


#: The values of a record's "split" field.
SPLITS = ("train", "val")

#: The text fields of a training record; each must be a string when present.
TEXT_FIELDS = ("text", "prompt", "response")


#: The record kinds, by the fields that make one.
KINDS = ({"text"}, {"prompt", "response"}, {"messages"}, {"conversations"}, {"input_ids", "loss_mask"})


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, record) pairs of a training file; each record is one of :data:`KINDS`."""
    records = []
    for lineno, rec in iter_jsonl(path):
        if not isinstance(rec, dict) or not any(kind <= rec.keys() for kind in KINDS):
            raise InputError(
                f"{path}:{lineno}: a record needs 'text', both 'prompt' and 'response', 'messages', "
                "'conversations', or both 'input_ids' and 'loss_mask'"
            )
        for key in TEXT_FIELDS:
            if key in rec and not isinstance(rec[key], str):
                raise InputError(f"{path}:{lineno}: '{key}' must be a string, got {type(rec[key]).__name__}")
        records.append((lineno, rec))
    return records


def stored_splits(path: str | Path, records: list[tuple[int, dict]]) -> list[str]:
    """Each record's "split" field, which must be "train" or "val" (one file, no --data.val_path)."""
    for lineno, rec in records:
        if rec.get("split") not in SPLITS:
            raise InputError(
                f"{path}:{lineno}: 'split' must be 'train' or 'val' when --data.val_path is unset"
            )
    return [rec["split"] for _, rec in records]


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool = False  # the record was longer than max_length


def tokenize(
    rec: dict, tokenizer, max_length: int, where: str = "record", thinking: bool | None = None
) -> Example | None:
    """A record's ids and loss mask (1: supervised), truncated; None if nothing to learn. ``where``
    (file:line) names the record in errors; ``thinking``: enable_thinking for a conversation that does
    not set its own (None: the template's default)."""
    ids, mask = record_ids(rec, tokenizer, where, thinking)
    if sum(mask[:max_length]) < 2:  # an anchor needs itself and one label
        return None
    return Example(ids[:max_length], mask[:max_length], truncated=len(ids) > max_length)


def record_ids(rec: dict, tokenizer, where: str, thinking: bool | None) -> tuple[list[int], list[int]]:
    if "input_ids" in rec:
        return exact_ids(rec, len(tokenizer), where)
    if is_chat(rec):
        return render(tokenizer, conversation(rec, where), rec.get("enable_thinking", thinking), where)
    if "text" in rec:
        prompt, response = [], tokenizer.encode(rec["text"])
    else:
        prompt, response = tokenizer.encode(rec["prompt"]), tokenizer.encode(rec["response"])
    return prompt + response, [0] * len(prompt) + [1] * len(response)


def exact_ids(rec: dict, vocab_size: int, where: str) -> tuple[list[int], list[int]]:
    """A token-exact record's ids and mask, checked."""
    ids, mask = rec["input_ids"], rec["loss_mask"]
    if not (isinstance(ids, list) and isinstance(mask, list) and len(ids) == len(mask)):
        raise InputError(f"{where}: 'input_ids' and 'loss_mask' must be lists of the same length")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids):
        raise InputError(f"{where}: 'input_ids' holds ids outside the tokenizer's 0..{vocab_size - 1}")
    if not all(m in (0, 1) for m in mask):
        raise InputError(f"{where}: 'loss_mask' must hold 0 and 1 only")
    return list(ids), [int(m) for m in mask]


def collate(batch: list[Example]) -> dict[str, torch.Tensor]:
    width = max(len(e.input_ids) for e in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    loss = torch.zeros((len(batch), width), dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        attn[i, :n] = 1
        loss[i, :n] = torch.tensor(e.loss_mask)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


class EpochShuffle(DistributedSampler):
    """A fresh permutation each epoch from (seed, epoch) alone, never from the global RNG, cut in
    global batches of ``batch_size * num_replicas``; rank r takes the r-th ``batch_size`` of each.

    So a run on W data-parallel ranks trains step for step on the same sequences as one process
    with a W times larger batch (the rows in rank order), and a resumed run sees the same order as
    an uninterrupted one: ``resume_at`` drops the global batches it already trained on in the
    interrupted epoch (Lightning restores its loop counters but restarts the data iterator). With
    W > 1 an incomplete last global batch is dropped (ranks must take the same number of steps).
    A DistributedSampler subclass, so Lightning keeps it instead of wrapping it in its own.
    """

    def __init__(
        self, num_samples: int, seed: int, batch_size: int = 1, num_replicas: int = 1, rank: int = 0
    ):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside 0..{num_replicas - 1}")
        self.total, self.seed, self.epoch = num_samples, seed, 0
        self.batch_size, self.num_replicas, self.rank = batch_size, num_replicas, rank
        self.skip_epoch, self.skip_batches = None, 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this before every epoch
        self.epoch = epoch

    def resume_at(self, epoch: int, batches: int) -> None:
        """Skip the first ``batches`` global batches of ``epoch``, if that epoch is iterated next.

        Tied to the epoch: a checkpoint written after an epoch's last batch restores into that epoch,
        but Lightning finishes it on restore and iterates the next one, which must start at its first
        batch (skipping there would drop a whole epoch).
        """
        self.skip_epoch, self.skip_batches = epoch, batches

    def _global_batches(self) -> list[list[int]]:
        g = torch.Generator().manual_seed(derived_seed(self.seed, self.epoch))
        order = torch.randperm(self.total, generator=g).tolist()
        width = self.batch_size * self.num_replicas
        batches = [order[i : i + width] for i in range(0, self.total, width)]
        if self.num_replicas > 1 and batches and len(batches[-1]) < width:
            batches.pop()
        return batches

    def __iter__(self):
        skip = self.skip_batches if self.epoch == self.skip_epoch else 0
        self.skip_epoch, self.skip_batches = None, 0  # only the first epoch after a resume is cut
        lo, hi = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        return iter([i for batch in self._global_batches()[skip:] for i in batch[lo:hi]])

    def __len__(self) -> int:  # one process takes everything; W ranks a batch of every full global batch
        if self.num_replicas == 1:
            return self.total
        return self.total // (self.batch_size * self.num_replicas) * self.batch_size


class TextRecords:
    """A run's training and validation records, tokenized by the target's tokenizer.

    Args:
        path: JSONL(.gz) file; default is the shipped stdlib corpus answered by the embedded target.
        val_path: a separate validation file; if unset, records are split by their "split" field.
        max_length: tokens per sequence (prompt + response), longer ones are truncated.
        batch_size: sequences per training step.
        val_batch_size: sequences per validation step (default: batch_size).
        max_train_records: use only the first this many training records.
        max_val_records: use only the first this many validation records.
        seed: the training order of every epoch (resumed runs continue it exactly).
        cache: train from this offline cache (``spec-drafters cache``) instead of running the target
            over the training text; validation stays online.
        thinking: for conversation records that do not set ``enable_thinking`` themselves, render
            with thinking on (true) or off (false); null: the chat template's default.
    """

    def __init__(
        self,
        path: str = "data/stdlib_smollm2.jsonl.gz",
        val_path: str | None = None,
        max_length: int = 512,
        batch_size: int = 4,
        val_batch_size: int | None = None,
        max_train_records: int | None = None,
        max_val_records: int | None = None,
        seed: int = 0,
        cache: str | None = None,
        thinking: bool | None = None,
    ):
        super().__init__()  # under TextDataModule: LightningDataModule's
        if max_length < 4:
            raise ValueError(f"--data.max_length must be >= 4, got {max_length}")
        if batch_size < 1:
            raise ValueError(f"--data.batch_size must be >= 1, got {batch_size}")
        self.path, self.val_path, self.max_length = path, val_path, max_length
        self.batch_size, self.val_batch_size = batch_size, val_batch_size or batch_size
        self.max_train_records, self.max_val_records = max_train_records, max_val_records
        self.seed, self.cache, self.thinking = seed, cache, thinking
        self.train: list = []
        self.val: list[Example] = []
        self.notes: list[str] = []  # what reading the records found, for the run's log

    def _split(self) -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
        """(train, val) (file:line, record) pairs after the content rule (data/heldout.py): a validation
        record that shares text with a training record trains instead, so held-out is held out however
        the file split it."""
        if self.val_path:
            train, val = read_jsonl(self.path), read_jsonl(self.val_path)
            given = ["train"] * len(train) + ["val"] * len(val)
            records = [(f"{self.path}:{n}", r) for n, r in train]
            records += [(f"{self.val_path}:{n}", r) for n, r in val]
        else:
            read = read_jsonl(self.path)
            given = stored_splits(self.path, read)
            records = [(f"{self.path}:{n}", r) for n, r in read]
        splits = split_by_content([rec for _, rec in records], given)
        moved = sum(a != b for a, b in zip(given, splits, strict=True))
        if moved:
            self.notes.append(
                f"held out by content: {moved} of {given.count('val')} validation records share text with "
                "training records and train instead (docs/data.md)"
            )
        return [r for r, s in zip(records, splits, strict=True) if s == "train"], [
            r for r, s in zip(records, splits, strict=True) if s == "val"
        ]

    def _tokenize(self, records, limit, name, tokenizer) -> list[Example]:
        examples, skipped = [], 0
        for where, rec in records[:limit]:
            ex = tokenize(rec, tokenizer, self.max_length, where, self.thinking)
            if ex is None:
                skipped += 1
            else:
                examples.append(ex)
        truncated = sum(e.truncated for e in examples)
        self.notes.append(
            f"{name}: {len(examples)} sequences, {skipped} skipped (fewer than 2 supervised tokens), "
            f"{truncated} truncated to --data.max_length {self.max_length}"
        )
        if not examples:
            raise ValueError(f"{name}: no usable sequences in {self.path}")
        return examples

    def examples(self, tokenizer) -> tuple[list[Example], list[Example]]:
        """The tokenized training and validation records."""
        train, val = self._split()
        return (
            self._tokenize(train, self.max_train_records, "train", tokenizer),
            self._tokenize(val, self.max_val_records, "val", tokenizer),
        )
