"""``cache``, ``draft-vocab``, ``corpus`` and ``reference-corpus``: the commands that prepare training data.

spec-drafters cache --config CONFIG --out DIR
spec-drafters draft-vocab --config CONFIG --out counts.json [--sizes 2048 4096]
spec-drafters corpus --out data/stdlib_smollm2.jsonl.gz
spec-drafters reference-corpus --out DIR [--kind answers|source]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spec_drafters.cli.checks import out_file, out_folder
from spec_drafters.cli.setup_args import load_setup
from spec_drafters.errors import InputError


def cache_cmd(argv: list[str]) -> None:
    """``spec-drafters cache``: run the target once over the training data and write an offline cache."""
    from spec_drafters.data.feature_cache import build_cache

    ap = argparse.ArgumentParser(
        prog="spec-drafters cache",
        description="Write the tapped features and label hidden states of the training records "
        "(train with --data.cache DIR). Other arguments (--config, --model.*, --data.*) are LightningCLI's.",
        allow_abbrev=False,
    )
    ap.add_argument("--out", required=True, help="the cache folder (an interrupted build resumes there)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--shard_records", type=int, default=64)
    ap.add_argument(
        "--reverse",
        action="store_true",
        help="build from the last shard back: a second process with the same arguments and --reverse "
        "shares the folder with a forward one, and the two meet in the middle",
    )
    args, rest = ap.parse_known_args(argv)
    if args.shard_records < 1:
        raise InputError(f"--shard_records must be >= 1, got {args.shard_records}")
    out_folder(args.out)  # before the target runs
    setup, data = load_setup(rest, quiet=True, with_data=True)
    index = build_cache(
        setup.feature_spec(),
        data,
        args.out,
        args.dtype,
        args.shard_records,
        batch_size=data.batch_size,
        reverse=args.reverse,
    )
    per_k = index["bytes"] / max(1, index["tokens"]) * 1000
    have, want = sum(s["records"] for s in index["shards"]), index["meta"]["records"]
    if have < want:
        print(f"cache {args.out}: {have} of {want} records so far (the other builder is still running)")
    print(
        f"cache {args.out}: {len(index['shards'])} shards, {have} records, "
        f"{index['tokens']} tokens, {index['bytes'] / 2**20:.1f} MiB "
        f"({per_k / 2**20:.2f} MiB per 1k tokens, {args.dtype})"
    )


def draft_vocab_cmd(argv: list[str]) -> None:
    """``spec-drafters draft-vocab``: count the training labels for a ``frequent_tokens`` vocabulary."""
    from spec_drafters.data.records import collate
    from spec_drafters.model.vocab import count_labels

    ap = argparse.ArgumentParser(
        prog="spec-drafters draft-vocab",
        description="Count the target's outputs on the training data (the cache's labels with "
        "--data.cache, else the supervised tokens of the text) and print the held-out coverage of the "
        "V_d most frequent. Other arguments (--config, --data.*) are LightningCLI's.",
        allow_abbrev=False,
    )
    ap.add_argument("--out", required=True, help="the counts file (JSON) for FrequentTokens(counts=...)")
    ap.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[2048, 4096, 8192, 16384],
        help="the V_d to report coverage for (sizes not below the target's vocabulary are skipped)",
    )
    args, rest = ap.parse_known_args(argv)
    bad = [size for size in args.sizes if size < 1]
    if bad:
        raise InputError(f"--sizes: a draft vocabulary needs at least 1 token, got {bad[0]}")
    out = out_file(args.out)  # before the counting
    setup, data = load_setup(rest, quiet=True, with_data=True)
    train, val = data.examples(setup.tokenizer)
    if data.cache:
        from spec_drafters.data.feature_cache import CachedRecords

        records = CachedRecords(data.cache)
        counts = count_labels(records[i] for i in range(len(records)))
    else:
        counts = count_labels(collate([ex]) for ex in train)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"source": data.cache or data.path, "tokens": sum(counts.values()), "counts": dict(counts)}
    out.write_text(json.dumps(payload) + "\n")
    print(f"{out}: {len(counts)} distinct tokens in {payload['tokens']} training labels")
    held_out = count_labels(collate([ex]) for ex in val)
    print_coverage(out, args.sizes, setup.target.vocab_size, held_out)


def print_coverage(counts: Path, sizes: list[int], vocab: int, held_out) -> None:
    """The held-out coverage of the ``size`` most frequent tokens, for each size below ``vocab`` (a
    draft vocabulary as large as the target's is the full vocabulary: nothing to report)."""
    from spec_drafters.model.vocab import FrequentTokens, coverage

    for size in sizes:
        if size >= vocab:
            print(f"V_d {size:>6}: skipped, not below the target's vocabulary of {vocab}")
            continue
        share = coverage(FrequentTokens(str(counts), size).token_ids(vocab), held_out)
        print(f"V_d {size:>6}: held-out coverage {share:.4f}, head rows {size / vocab:.3f}x")


def corpus_cmd(argv: list[str]) -> None:
    from spec_drafters.data import corpus

    corpus.main(argv)


def reference_corpus_cmd(argv: list[str]) -> None:
    from spec_drafters.data import reference_corpus

    reference_corpus.main(argv)
