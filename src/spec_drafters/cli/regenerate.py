"""``regenerate``: a user's prompts answered by the target, as training records exact in tokens
(docs/regenerate.md).

    spec-drafters regenerate --prompts FILE [FILE ...] --out DIR [--config CONFIG] [--engine openai ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from spec_drafters.errors import InputError

ENGINE_FLAGS = ("base_url", "served_model", "concurrency", "retries", "timeout", "api_key")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="spec-drafters regenerate",
        description="Answer prompts with the target (its chat template, thinking on or off, greedy or "
        "sampled) into token-exact training records, in resumable parts. The target comes from "
        "--config / --model.target (LightningCLI's arguments), as for fit.",
        allow_abbrev=False,
    )
    ap.add_argument("--prompts", nargs="+", required=True,
                    help="JSONL(.gz), JSON or Parquet files, or folders of them: 'messages' (OpenAI), "
                    "'conversations' (ShareGPT) or 'prompt' records")  # fmt: skip
    ap.add_argument("--out", required=True, help="a folder: parts/, corpus.jsonl.gz, manifest.json")
    ap.add_argument("--engine", choices=("transformers", "openai"), default="transformers")
    ap.add_argument("--batch_size", type=int, default=1,
                    help="transformers, greedy: prompts per batched generate (1: our path)")  # fmt: skip
    ap.add_argument("--base_url", default="http://localhost:8000", help="openai: the server")
    ap.add_argument("--served_model", help="openai: the served model's name (default: the only one)")
    ap.add_argument("--concurrency", type=int, default=8, help="openai: requests in flight")
    ap.add_argument("--retries", type=int, default=3, help="openai: retries per request")
    ap.add_argument("--timeout", type=float, default=600.0, help="openai: seconds per request")
    ap.add_argument("--api_key", help="openai: bearer token")
    ap.add_argument("--max_tokens", type=int, default=512, help="answer tokens at most")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--top_p", type=float, default=1.0)
    ap.add_argument(
        "--seed", type=int, default=0, help="with --temperature > 0: each prompt's seed derives from it"
    )
    ap.add_argument("--thinking", choices=("on", "off"), help="enable_thinking for the chat template "
                    "(default: the template's own default)")  # fmt: skip
    ap.add_argument("--raw", action="store_true", help="no chat template: a prompt's text is the model's "
                    "input as it is (completion prompts, as the embedded corpus)")  # fmt: skip
    ap.add_argument("--limit", type=int, help="the first N prompts (after reading, before dedupe)")
    ap.add_argument("--part_size", type=int, default=64)
    ap.add_argument("--val_fraction", type=float, default=0.05, help="share of prompts held out (by id hash)")
    ap.add_argument("--decontaminate", nargs="*", default=["humaneval"], metavar="SET",
                    help="drop prompts sharing a 13-word n-gram with these evaluation sets: 'humaneval' "
                    "and/or JSONL files (none: --decontaminate with no value)")  # fmt: skip
    ap.add_argument("--no_progress", action="store_true")
    return ap


def regenerate(argv: list[str]) -> None:
    from spec_drafters.cli.setup_args import load_setup
    from spec_drafters.data import regenerate as rg

    args, rest = parser().parse_known_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; regenerate writes a folder")
    if args.part_size < 1 or not 0 <= args.val_fraction < 1:
        raise InputError("--part_size must be >= 1 and --val_fraction in [0, 1)")
    settings = _settings(args)  # checked before any file is read
    items, run = _prompts(args, settings)
    engine = _engine(args)
    before = _resumable(out / "manifest.json", run, items)
    counted = run["prompts"]
    removed, gone = counted["decontaminated"], sum(counted["decontaminated"].values())
    print(f"regenerate: {counted['read']} prompts read, {counted['duplicates_removed']} duplicates and "
          f"{gone} contaminated removed ({removed}), {len(items)} to answer", file=sys.stderr)  # fmt: skip
    setup = load_setup(rest, quiet=True)
    run["engine"] = engine.start(setup.target, setup.tokenizer, setup.card)
    run["target"] = setup.card.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(
        json.dumps({**run, "items": [i.id for i in items], "status": "running"}) + "\n"
    )
    t0 = time.time()
    answer = _answerer(args, settings, engine, setup.tokenizer, set(setup.card.eos_token_ids))
    counts = rg.answer_parts(
        items, answer, out, args.part_size, args.val_fraction, not args.no_progress, args.raw
    )
    corpus = rg.assemble_corpus(out / "parts", counts["parts"], out / "corpus.jsonl.gz")
    this_call = {**counts, "tokens_per_s": round(counts["tokens"] / max(counts["seconds"], 1e-9), 2),
                 "wall_s": round(time.time() - t0, 1), "command": ["spec-drafters", "regenerate", *argv],
                 "git": _git(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
    calls = [*(before or {}).get("calls", []), this_call]
    manifest = {**run, "corpus": corpus, "calls": calls, "items": [i.id for i in items], "status": "done"}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps({"records": corpus["records"], "finished": corpus["finished"], **this_call,
                      "command": None}))  # fmt: skip


def _settings(args: argparse.Namespace):
    from spec_drafters.decode.engines import Settings

    return Settings(args.max_tokens, args.temperature, args.top_p, args.seed)


def _prompts(args: argparse.Namespace, settings) -> tuple[list, dict]:
    """The prompts to answer (read, deduplicated, decontaminated) and the run's record of them."""
    from spec_drafters.data import regenerate as rg

    items = rg.read_prompts(args.prompts, args.limit)
    read = len(items)
    items, duplicates = rg.dedupe(items)
    items, removed = rg.decontaminate(items, {name: _eval_set(name) for name in args.decontaminate})
    if args.raw and any(len(it.turns) != 1 for it in items):
        raise InputError("--raw takes single prompts; these records hold conversations (drop --raw)")
    run = {
        "settings": {**vars(settings), "thinking": args.thinking, "raw": args.raw,
                     "batch_size": args.batch_size, "val_fraction": args.val_fraction,
                     "part_size": args.part_size},
        "prompts": {"files": args.prompts, "read": read, "duplicates_removed": duplicates,
                    "decontaminated": removed, "kept": len(items)},
    }  # fmt: skip
    return items, run


def _resumable(manifest_path: Path, run: dict, items: list) -> dict | None:
    """The manifest of the run this one continues (None for a new one); another run's is refused."""
    before = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
    if before is not None and (
        before.get("settings") != run["settings"] or before.get("items") != [i.id for i in items]
    ):
        raise InputError(
            f"--out {manifest_path.parent} holds a regeneration with other settings or prompts "
            f"({manifest_path}); give another --out, or the same arguments to continue it"
        )
    return before


def _engine(args: argparse.Namespace):
    from spec_drafters.decode.engines import InProcess, OpenAICompatible

    if args.engine == "transformers":
        return InProcess(args.batch_size)
    return OpenAICompatible(
        args.base_url, args.served_model, args.concurrency, args.retries, args.timeout, args.api_key
    )


def _answerer(args: argparse.Namespace, settings, engine, tokenizer, end: set[int]):
    """part of prompts -> their answers: each prompt's ids (raw text, or the chat template with
    thinking on or off), the engine's reply ids and the text without the final EOS."""
    from spec_drafters.data import regenerate as rg

    thinking = None if args.thinking is None else args.thinking == "on"

    def prompt_ids(item) -> list[int]:
        if args.raw:
            return tokenizer.encode(item.turns[0]["content"])
        return tokenizer.chat_ids(item.turns, add_generation_prompt=True, enable_thinking=thinking)

    def answer(part):
        prompts = [prompt_ids(it) for it in part]
        replies = engine.generate(prompts, [it.id for it in part], settings)
        answers = []
        for p, (ids, reason) in zip(prompts, replies, strict=True):
            body = ids[:-1] if ids and ids[-1] in end else ids
            answers.append(rg.Answer(p, ids, tokenizer.decode(body), reason))
        return answers

    return answer


def _eval_set(name: str) -> list[str]:
    if name == "humaneval":
        from spec_drafters.data.prompts import HumanEvalPrompts

        return HumanEvalPrompts().prompts()
    from spec_drafters.data.regenerate import eval_texts

    if not Path(name).is_file():
        raise InputError(f"--decontaminate: {name} is neither 'humaneval' nor a file")
    return eval_texts(name)


def _git() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
