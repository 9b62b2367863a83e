"""Held out by content: records that share text never sit on both sides of the train/val split.

A corpus builder gives each record a split from a hash of its id (``corpus.split_of``), but the
standard library repeats code under other names (shutil and distutils, abc and _py_abc, bz2 and lzma,
mailbox's five mailbox classes, tkinter and tix), and the target answers a repeated prompt with the
same text: 16 of the 215 held-out records of the reference corpus were byte-identical to training
records. So every reader of a split (``records.TextRecords``, ``reference_corpus.mix``) first groups
records by content and then puts each group on one side:

- two records are one group when they share a *key*: the normalised prompt (the response is the
  target's greedy answer to it: the same prompt gives the same record), or the normalised supervised
  text (the response, or all of a ``text`` record) when it has at least :data:`MIN_SUPERVISED`
  characters (near-identical prompts get the same answer: a re-wrapped docstring, a method and its
  module-level twin); groups are closed under shared keys (A shares with B, B with C: one group);
- normalised: full-line ``#`` comments dropped and all whitespace removed, so a re-indented or
  re-wrapped copy keys like the original;
- a group is held out only when *every* member's own split is ``val``: one training member puts the
  whole group in training. The rule depends on the records' splits and texts, never on their order,
  and it only ever moves records from val to train, so a held-out record under it never shares text
  with any record a run trained on under the id split: drafters trained before the rule are measured
  cleanly on it without retraining.

The builders still write the id split; the records' own ``split`` fields stay as written (the
committed answer parts keep their bytes and sha256) and readers regroup on every read.
"""

from __future__ import annotations

import hashlib
import re

from spec_drafters.data.chat import texts

#: Shorter supervised texts ("pass", "return None") are too common to mean a copied record.
MIN_SUPERVISED = 32

_COMMENT_LINE = re.compile(r"^[ \t]*#[^\n]*$", re.MULTILINE)
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """``text`` without full-line comments and without whitespace."""
    return _SPACE.sub("", _COMMENT_LINE.sub("", text))


def _digest(kind: str, text: str) -> str:
    return kind + hashlib.sha1(text.encode("utf-8")).hexdigest()


def content_keys(rec: dict) -> list[str]:
    """The keys a record shares with its duplicates: its normalised prompt, and its normalised
    supervised text when that is long enough to mean a copy."""
    keys = []
    prompt_text, supervised_text = record_texts(rec)
    prompt = normalise(prompt_text)
    if prompt:
        keys.append(_digest("p:", prompt))
    supervised = normalise(supervised_text)
    if len(supervised) >= MIN_SUPERVISED:
        keys.append(_digest("s:", supervised))
    return keys


def record_texts(rec: dict) -> tuple[str, str]:
    """(prompt, supervised text) of any record kind (data/records.py); a token-exact record's ids,
    written out, stand for its texts."""
    if "messages" in rec or "conversations" in rec:
        return texts(rec)
    if "input_ids" in rec and isinstance(rec["input_ids"], list) and isinstance(rec.get("loss_mask"), list):
        pairs = list(zip(rec["input_ids"], rec["loss_mask"], strict=False))
        return (" ".join(str(i) for i, m in pairs if not m), " ".join(str(i) for i, m in pairs if m))
    return rec.get("prompt", ""), rec["text"] if "text" in rec else rec.get("response", "")


def groups(records: list[dict]) -> list[int]:
    """The group of every record (the index of its group's first record): records sharing a key,
    directly or through others, are one group."""
    parent = list(range(len(records)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving: near-flat trees on long chains
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, rec in enumerate(records):
        for key in content_keys(rec):
            j = owner.setdefault(key, i)
            a, b = root(i), root(j)
            if a != b:
                parent[max(a, b)] = min(a, b)  # the smaller index is the root: a group's first record
    return [root(i) for i in range(len(records))]


def split_by_content(records: list[dict], splits: list[str]) -> list[str]:
    """Each record's split under the rule: ``val`` only when every record of its group is ``val``."""
    if len(records) != len(splits):
        raise ValueError(f"{len(records)} records but {len(splits)} splits")
    group = groups(records)
    trains = {g for g, s in zip(group, splits, strict=True) if s == "train"}
    return ["train" if g in trains else s for g, s in zip(group, splits, strict=True)]


def shared_keys(train: list[dict], val: list[dict]) -> list[int]:
    """Indexes of the ``val`` records that share a key with some ``train`` record (none, once split
    by content)."""
    seen = {key for rec in train for key in content_keys(rec)}
    return [i for i, rec in enumerate(val) if seen.intersection(content_keys(rec))]
