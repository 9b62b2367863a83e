"""Training data for any target: its own answers to a user's prompts (docs/regenerate.md).

A drafter learns the target's behaviour, so its training text is the target's answers, generated the
way the target is served (its chat template, thinking on or off, greedy or sampled). This module is the
data side of ``spec-drafters regenerate``: prompts read from the common formats, de-duplicated and
decontaminated against evaluation sets, cut into parts that are answered (by an engine,
decode/engines.py) and written atomically, a manifest that lets a rerun continue, and the final corpus
assembled deterministically. The answering is a callable, so this module needs no engine.

A prompt record is OpenAI style (``messages``), ShareGPT style (``conversations``) or plain
(``prompt``, or ``text``). A trailing assistant turn is the dataset's own answer and is dropped: the
target answers the last user turn, with any earlier turns as context. The written record is
token-exact (data/records.py): ``input_ids`` (the rendered prompt and the target's answer, as the
engine returned its ids), ``loss_mask`` (the answer), plus ``messages`` (the turns with the answer, for
people, the held-out rule and decontamination), ``id``, ``split`` and ``finish_reason``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from spec_drafters.data import chat
from spec_drafters.data.chat import conversation
from spec_drafters.data.parts import assemble, part_ids, write_part
from spec_drafters.data.records import iter_jsonl
from spec_drafters.errors import InputError, MissingFile


@dataclass
class Item:
    """One prompt to answer: its turns (ending with a user turn) and where it came from."""

    id: str
    turns: list[dict]
    source: str  # file:line


@dataclass
class Answer:
    """What an engine returned for one prompt."""

    prompt_ids: list[int]
    ids: list[int]  # the answer's token ids, end-of-turn included when it was generated
    text: str
    finish_reason: str  # "stop" (end of turn) or "length"


# --------------------------------------------------------------------------------------------- reading


def read_prompts(paths: list[str], limit: int | None = None) -> list[Item]:
    """Every prompt of ``paths`` (JSONL, JSONL.gz, Parquet, or a folder of them), in file order."""
    items = []
    for path in _files(paths):
        for where, rec in _records(path):
            items.append(_item(rec, where))
            if limit is not None and len(items) >= limit:
                return items
    if not items:
        raise InputError(f"--prompts: no prompt records in {', '.join(paths)}")
    return items


def _files(paths: list[str]) -> Iterator[Path]:
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if _readable(f))
            if not found:
                raise InputError(f"--prompts: no .jsonl, .jsonl.gz or .parquet file in {p}")
            yield from found
        elif p.is_file():
            if not _readable(p):
                raise InputError(f"--prompts: {p} is not .jsonl, .jsonl.gz, .json or .parquet")
            yield p
        else:
            raise MissingFile(f"--prompts: no file or folder {p}")


def _readable(p: Path) -> bool:
    return p.is_file() and (p.name.endswith((".jsonl", ".jsonl.gz", ".parquet", ".json")))


def _records(path: Path) -> Iterator[tuple[str, dict]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError(f"--prompts: reading {path} needs pyarrow (pip install pyarrow)") from None
        for i, rec in enumerate(pq.read_table(path).to_pylist(), 1):  # a column a row lacks reads None
            yield f"{path}:row {i}", {k: v for k, v in rec.items() if v is not None}
    elif path.suffix == ".json":  # one JSON list of records
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: not a JSON file ({e})") from None
        if not isinstance(data, list):
            raise InputError(f"{path}: a .json prompt file must hold a list of records")
        for i, rec in enumerate(data, 1):
            yield f"{path}:record {i}", rec
    else:
        for lineno, rec in iter_jsonl(path, flag="--prompts"):
            yield f"{path}:{lineno}", rec


def _item(rec, where: str) -> Item:
    if not isinstance(rec, dict):
        raise InputError(f"{where}: a prompt record must be a JSON object")
    if "messages" in rec or "conversations" in rec:
        turns = _without_answer(rec, where)
    else:
        text = rec.get("prompt", rec.get("text"))
        if not isinstance(text, str) or not text.strip():
            raise InputError(
                f"{where}: a prompt record needs 'messages', 'conversations', or a non-empty 'prompt' "
                "(or 'text')"
            )
        turns = [{"role": "user", "content": text}]
    key = json.dumps(turns, sort_keys=True, ensure_ascii=False)
    return Item(hashlib.sha1(key.encode()).hexdigest()[:16], turns, where)


def _without_answer(rec: dict, where: str) -> list[dict]:
    """The record's turns without a trailing assistant turn; the last must then be the user's."""
    turns = conversation(rec, where, answered=False)
    if turns[-1]["role"] == "assistant":
        turns = turns[:-1]
    if not turns or turns[-1]["role"] != "user":
        last = turns[-1]["role"] if turns else "nothing"
        raise InputError(f"{where}: the last turn to answer is {last!r}, not the user's")
    return turns


# ------------------------------------------------------------------------ dedupe and decontamination


def normalise(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def dedupe(items: list[Item]) -> tuple[list[Item], int]:
    """The first of every set of items whose turns are equal after normalisation; (kept, removed)."""
    seen, kept = set(), []
    for it in items:
        key = normalise(" ".join(t["content"] for t in it.turns))
        if key not in seen:
            seen.add(key)
            kept.append(it)
    return kept, len(items) - len(kept)


#: Words in an n-gram shared with an evaluation text that makes a prompt contaminated (GPT-3's rule,
#: arXiv:2005.14165, appendix C).
NGRAM = 13


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def decontaminate(items: list[Item], sets: dict[str, list[str]]) -> tuple[list[Item], dict[str, int]]:
    """Items sharing a word 13-gram with a text of an evaluation set (or, for a text shorter than 13
    words, holding all of it) removed; (kept, removed per set). A prompt that merely mentions the
    benchmark's topic stays; one that pastes a problem goes."""
    grams: dict[str, set] = {}
    short: dict[str, list[str]] = {}
    for name, texts in sets.items():
        grams[name], short[name] = set(), []
        for text in texts:
            words = normalise(text).split()
            if len(words) >= NGRAM:
                grams[name] |= _ngrams(words, NGRAM)
            elif words:
                short[name].append(" ".join(words))
    removed = dict.fromkeys(sets, 0)
    kept = []
    for it in items:
        text = normalise(" ".join(t["content"] for t in it.turns))
        mine = _ngrams(text.split(), NGRAM)
        hit = next(
            (n for n in sets if mine & grams[n] or any(f" {s} " in f" {text} " for s in short[n])), None
        )
        if hit is None:
            kept.append(it)
        else:
            removed[hit] += 1
    return kept, removed


def eval_texts(path: str) -> list[str]:
    """The texts of an evaluation JSONL file: each record's prompt, text, or turns' contents."""
    out = []
    for where, rec in _records(Path(path)):
        if not isinstance(rec, dict):
            raise InputError(f"{where}: an evaluation record must be a JSON object")
        if "messages" in rec or "conversations" in rec:
            out.append(" ".join(chat.texts(rec)))
        else:
            out.append(
                " ".join(
                    str(rec[k]) for k in ("prompt", "text", "question", "canonical_solution") if k in rec
                )
            )
    return out


# ----------------------------------------------------------------------------------- parts and manifest


def split_of(item_id: str, val_fraction: float) -> str:
    """'val' for a fixed share of ids (a hash of the id, so adding prompts never moves an old one)."""
    return "val" if int(item_id[:8], 16) / 16**8 < val_fraction else "train"


def record(item: Item, answer: Answer, split: str, raw: bool = False) -> dict:
    """The written record; ``raw`` (a completion prompt, no chat template): ``prompt`` and ``response``
    instead of ``messages``."""
    if raw:
        text = {"prompt": item.turns[0]["content"], "response": answer.text}
    else:
        text = {"messages": [*item.turns, {"role": "assistant", "content": answer.text}]}
    return {
        "id": item.id,
        **text,
        "input_ids": answer.prompt_ids + answer.ids,
        "loss_mask": [0] * len(answer.prompt_ids) + [1] * len(answer.ids),
        "finish_reason": answer.finish_reason,
        "split": split,
        "source": item.source,
    }


def answer_parts(
    items: list[Item],
    answer: Callable[[list[Item]], list[Answer]],
    out: Path,
    part_size: int,
    val_fraction: float,
    progress: bool = True,
    raw: bool = False,
) -> dict:
    """Answers ``items`` part by part into ``out/parts``; a part already there with exactly its items
    is kept (a rerun continues). Returns this call's counts: parts answered, tokens, seconds."""
    from tqdm import tqdm

    parts_dir = out / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    starts = range(0, len(items), part_size)
    name = {s: parts_dir / f"part-{s // part_size:05d}.jsonl.gz" for s in starts}
    done = {s for s in starts if part_ids(name[s]) == [it.id for it in items[s : s + part_size]]}
    todo = sum(len(items[s : s + part_size]) for s in starts if s not in done)
    bar = tqdm(total=todo, unit="prompt", desc="regenerating", disable=not progress)
    tokens, seconds, answered = 0, 0.0, 0
    for s in starts:
        if s in done:
            continue
        part = items[s : s + part_size]
        t0 = time.perf_counter()
        answers = answer(part)
        seconds += time.perf_counter() - t0
        tokens += sum(len(a.ids) for a in answers)
        records = [
            record(it, a, split_of(it.id, val_fraction), raw) for it, a in zip(part, answers, strict=True)
        ]
        write_part(name[s], records, ensure_ascii=False)
        answered += 1
        bar.update(len(part))
        bar.set_postfix(tok_s=f"{tokens / max(seconds, 1e-9):.1f}")
    bar.close()
    return {"parts": len(starts), "parts_answered": answered, "tokens": tokens, "seconds": round(seconds, 3)}


def assemble_corpus(parts_dir: Path, n_parts: int, out: Path) -> dict:
    """The parts joined in order into ``out`` (data/parts.py); counts (with the answers that ended by
    themselves) and the content sha256."""
    finished = 0

    def count(line: bytes) -> None:
        nonlocal finished
        finished += json.loads(line)["finish_reason"] == "stop"

    parts = [parts_dir / f"part-{i:05d}.jsonl.gz" for i in range(n_parts)]
    return {**assemble(parts, out, count), "finished": finished}
