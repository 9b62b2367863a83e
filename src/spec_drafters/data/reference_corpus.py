"""The reference drafter's corpus: every docstring of the standard library, answered by the target.

Two kinds of training text, both from the Python standard library so that they exist offline on every
machine (experiments/data_source.py compares them per CPU-hour; docs/reference_drafter.md):

- ``answers``: a prompt for every function, method and class that has a docstring (all modules,
  private names included), cut from its ``def``/``class`` line to the end of the docstring and
  dedented, the shape of a HumanEval prompt; the response is the target's own greedy continuation.
  On this text the target's argmax *is* the next token, so block labels are exactly what chain
  verification accepts.
- ``source``: the library's real source files in windows of whole lines, no generation; training
  labels are the target's argmax at every position (teacher-forced). Cheap (one forward per token,
  no decoding loop), but from slot 2 on a block's later labels follow the real text rather than the
  target's own choices.

Both keep the HumanEval overlap filter (:func:`spec_drafters.data.corpus.humaneval_overlap`): no item that
shares a function name or a 10-word shingle with a HumanEval prompt, so HumanEval stays a clean exam.

Generation is a resumable stage: items are cut into fixed parts of ``part_size`` in a deterministic
order; each part is answered in left-padded greedy batches (HF ``generate``: KV cache, sorted by length
to limit padding) and written atomically as ``part-NNNNN.jsonl.gz``. An interrupted run keeps its
finished parts and continues with the next one; ``assemble`` joins the parts into one file whose
sha256 over the *uncompressed* lines is the corpus's identity (gzip headers carry a time stamp).
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from spec_drafters.data.corpus import answer_batch, humaneval_overlap, split_of, stdlib_files
from spec_drafters.data.parts import assemble, part_ids, write_part

#: Test suites are not code a user asks a model to write; site-packages is not the standard library.
SKIP_DIRS = {"test", "tests", "site-packages", "__pycache__"}

#: Docstring-bearing definitions whose prompt is longer than this are skipped (a few giant classes).
MAX_PROMPT_CHARS = 3000


def docstring_items(root: Path | None = None) -> Iterator[dict]:
    """One prompt per function, method or class with a docstring (``ast.walk`` order per module)."""
    kinds = {ast.FunctionDef: "function", ast.AsyncFunctionDef: "function", ast.ClassDef: "class"}
    for rel, source in stdlib_files(root, SKIP_DIRS):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            kind = kinds.get(type(node))
            doc = ast.get_docstring(node, clean=True) if kind else None
            if not doc or len(doc) < 20:
                continue
            # From the def/class line (decorators excluded, as in HumanEval) to the docstring's end.
            text = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.body[0].end_lineno])) + "\n"
            if len(text) > MAX_PROMPT_CHARS:
                continue
            yield {
                "id": f"{rel.as_posix()}:{node.lineno}:{node.name}",
                "name": node.name,
                "kind": kind,
                "prompt": text,
            }


def source_windows(root: Path | None = None, max_chars: int = 1200) -> Iterator[dict]:
    """Real source in windows of whole lines of at most ``max_chars`` (about 300-400 tokens)."""
    for rel, source in stdlib_files(root, SKIP_DIRS):
        window: list[str] = []
        size, first = 0, 1
        for lineno, line in enumerate(source.splitlines(keepends=True), 1):
            if window and size + len(line) > max_chars:
                yield {"id": f"{rel.as_posix()}#{first}", "name": "", "text": "".join(window)}
                window, size, first = [], 0, lineno
            window.append(line)
            size += len(line)
        if window and "".join(window).strip():
            yield {"id": f"{rel.as_posix()}#{first}", "name": "", "text": "".join(window)}


def select_items(items: list[dict], val_fraction: float) -> list[dict]:
    """Drops HumanEval overlaps, orders by a hash of the id (spread over the library), adds ``split`` by
    the id (readers regroup duplicates by content, data/heldout.py: the committed parts keep their bytes)."""
    field = "prompt" if items and "prompt" in items[0] else "text"
    bad = set(humaneval_overlap([{**it, "prompt": it[field]} for it in items]))
    kept = [it for it in items if it["id"] not in bad]
    kept.sort(key=lambda it: hashlib.sha1(it["id"].encode()).hexdigest())
    return [{**it, "split": split_of(it["id"], val_fraction)} for it in kept]


def generate_parts(
    items: list[dict],
    target,
    out: Path,
    part_size: int,
    batch_size: int,
    max_new_tokens: int,
    reverse: bool = False,
) -> int:
    """Answers ``items`` part by part into ``out``; returns how many prompts this call answered.
    A finished part is kept when it holds exactly the items this run would put there (another
    Python's standard library gives other items: then the part is answered again, never mixed in).
    Each part is checked again just before it is answered, so two processes can share ``out``, one
    of them going from the last part back (``reverse``)."""
    from tqdm import tqdm

    out.mkdir(parents=True, exist_ok=True)
    starts = list(range(0, len(items), part_size))

    def finished(s: int) -> bool:
        path = out / f"part-{s // part_size:05d}.jsonl.gz"
        return part_ids(path) == [it["id"] for it in items[s : s + part_size]]

    done = {s for s in starts if finished(s)}
    bar = tqdm(total=len(items), initial=sum(len(items[s : s + part_size]) for s in done), unit="prompt")
    bar.set_description("answering")
    answered_here = 0
    for s in reversed(starts) if reverse else starts:
        if s in done or finished(s):  # answered before, or meanwhile by the other process
            continue
        part = items[s : s + part_size]
        lengths = [len(target.tokenizer.encode(it["prompt"])) for it in part]
        order = sorted(range(len(part)), key=lambda i: (lengths[i], part[i]["id"]))  # less padding
        answered: dict[int, dict] = {}
        for b in range(0, len(order), batch_size):
            idx = order[b : b + batch_size]
            for i, rec in zip(idx, answer_batch([part[i] for i in idx], target, max_new_tokens), strict=True):
                answered[i] = rec
            bar.update(len(idx))
        write_part(out / f"part-{s // part_size:05d}.jsonl.gz", [answered[i] for i in range(len(part))])
        answered_here += len(part)
    bar.close()
    return answered_here


def finish(parts: list[Path], out: Path, answered: int, **meta) -> dict:
    """Assembles ``parts`` into ``out/corpus.jsonl.gz`` and writes ``out/manifest.json`` (counts, sha256
    and ``meta``: the run's threads and seconds). A run that answered nothing (``answered == 0``) and
    assembled the same content keeps the manifest that is there: rewriting it would record this
    run's seconds of joining parts as the corpus's generation cost."""
    manifest = assemble(parts, out / "corpus.jsonl.gz")
    path = out / "manifest.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    if not answered and kept.get("sha256") == manifest["sha256"]:
        return kept
    manifest.update(meta)
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def mix(answers: Path, source: Path | None, source_records: int, out: Path) -> dict:
    """The training file: every answer record (its split kept: validation is held-out answers only;
    the reader holds out by content, data/heldout.py) and the first ``source_records`` teacher-forced
    source windows of the train split."""
    from spec_drafters.data.records import iter_jsonl

    records = [rec for _, rec in iter_jsonl(answers, flag="--answers")]
    windows = []
    if source is not None and source_records:
        windows = [r for _, r in iter_jsonl(source, flag="--source") if r["split"] == "train"]
        windows = windows[:source_records]
    digest = hashlib.sha256()
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh:
        for rec in records + windows:
            line = (json.dumps(rec) + "\n").encode()
            digest.update(line)
            fh.write(line)
    os.replace(tmp, out)
    return {"answers": len(records), "source_windows": len(windows), "sha256": digest.hexdigest()}


def mix_main(argv: list[str]) -> None:
    """``spec-drafters reference-corpus mix``: one training file from the answers and source windows."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="spec-drafters reference-corpus mix",
        description="Join the answers corpus and some source windows into one training file.",
    )
    ap.add_argument("--answers", required=True, type=Path)
    ap.add_argument("--source", type=Path)
    ap.add_argument("--source_records", type=int, default=0)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    print(json.dumps(mix(args.answers, args.source, args.source_records, args.out)))


def _parser():
    import argparse

    ap = argparse.ArgumentParser(
        prog="spec-drafters reference-corpus",
        description="Stage 1 of the reference recipe: answer every stdlib docstring prompt with the "
        "embedded target (resumable), or cut the stdlib's source into teacher-forced windows "
        "(`spec-drafters reference-corpus mix --help` joins them).",
    )
    ap.add_argument("--out", required=True, help="a folder: parts, then corpus.jsonl.gz and manifest.json")
    ap.add_argument("--kind", choices=["answers", "source"], default="answers")
    ap.add_argument("--limit", type=int, help="only the first N items of the deterministic order")
    ap.add_argument("--part_size", type=int, default=256)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--max_new_tokens", type=int, default=128)
    ap.add_argument("--val_fraction", type=float, default=0.03)
    ap.add_argument(
        "--reverse",
        action="store_true",
        help="answer the parts from the last one back: a second process sharing --out meets the first",
    )
    ap.add_argument(
        "--threads",
        type=int,
        help="torch threads (on a shared machine 1 thread beats 2 that spin-wait for a busy core)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    if argv and argv[0] == "mix":
        mix_main(argv[1:])
        return
    ap = _parser()
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    t0 = time.time()
    source = docstring_items() if args.kind == "answers" else source_windows()
    items = select_items(list(source), args.val_fraction)[: args.limit]
    print(f"{len(items)} {args.kind} items after the HumanEval filter ({time.time() - t0:.0f}s)")
    out.mkdir(parents=True, exist_ok=True)
    if args.kind == "answers":
        from spec_drafters.target.loaders import EmbeddedSmolLM2

        target = EmbeddedSmolLM2().load()
        answered = generate_parts(
            items, target, out, args.part_size, args.batch_size, args.max_new_tokens, args.reverse
        )
        parts = [out / f"part-{i:05d}.jsonl.gz" for i in range(-(-len(items) // args.part_size))]
        missing = [p.name for p in parts if not p.is_file()]
        if missing:  # another process is still answering them: the last one to finish assembles
            print(f"{len(missing)} parts still being answered elsewhere ({missing[0]}...); run again")
            return
    else:
        answered = len(items)
        parts = [out / "part-00000.jsonl.gz"]
        write_part(parts[0], items)
    manifest = finish(
        parts,
        out,
        answered,
        kind=args.kind,
        items=len(items),
        max_new_tokens=args.max_new_tokens,
        val_fraction=args.val_fraction,
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        seconds=round(time.time() - t0, 1),
    )
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
