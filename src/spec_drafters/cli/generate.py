"""``generate``: prompts through the target with the drafter and a chosen verifier; tau, speed and
whether the output equals the target's own greedy decoding (docs/method.md section 3). A verifier that
samples (``--model.verifier.init_args.temperature`` > 0) is compared with plain sampling at the same
settings, and its rows have no ``lossless`` (docs/sampling.md).

    spec-drafters generate --config CONFIG --ckpt_path CKPT (--prompt TEXT | --prompts FILE | --humaneval N)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from spec_drafters.artefacts.setup import DrafterSetup
from spec_drafters.cli.checks import out_file
from spec_drafters.cli.setup_args import load_setup
from spec_drafters.errors import InputError
from spec_drafters.registry import name_of


def generate_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="spec-drafters generate",
        description="Decode prompts with the target, the drafter and the configured verifier "
        "(--model.verifier); every other argument (--config, --ckpt_path, --model.*) is LightningCLI's.",
        allow_abbrev=False,
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts", help="a JSONL file of records with a 'prompt' (or 'text') field")
    src.add_argument("--humaneval", type=int, metavar="N", help="N HumanEval problems, evenly spaced")
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--out", help="write outputs and per-prompt statistics to this JSONL file")
    ap.add_argument(
        "--no_greedy",
        action="store_true",
        help="skip the plain run, greedy or sampled as the verifier decodes (no speedup, no check)",
    )
    return ap


def generate(argv: list[str]) -> None:
    """``spec-drafters generate``: prompts through the target with the drafter and a chosen verifier."""
    from spec_drafters.decode.summary import check_prompts

    ap = generate_parser()
    args, rest = ap.parse_known_args(argv)
    if args.max_new_tokens < 1:
        raise InputError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}")
    out = out_file(args.out) if args.out else None  # before decoding: a late failure would lose it all
    texts = _texts(args)
    setup = load_setup(rest)
    prompts = [setup.tokenizer.encode(text) for text in texts]
    try:
        check_prompts(setup.target, prompts, args.max_new_tokens, "generate")
    except ValueError as e:
        raise InputError(str(e)) from None
    verifier = name_of(setup.verifier)
    with _Rows(out) as rows:
        for i, prompt in enumerate(prompts):
            rows.add(_decode(setup, i, prompt, verifier, args))
    print(json.dumps(_summary(rows.rows, verifier)))


class _Rows:
    """The per-prompt rows; with ``--out``, each is also appended to ``<out>.partial`` as it is done,
    and that file becomes ``--out`` once every prompt is: an interrupted run keeps what it finished
    there, and never leaves a half-written ``--out`` (or loses the previous one)."""

    def __init__(self, out: Path | None):
        self.out, self.rows = out, []
        self.partial = out.with_name(out.name + ".partial") if out else None

    def __enter__(self) -> _Rows:
        if self.partial:
            self.partial.parent.mkdir(parents=True, exist_ok=True)
            self.file = self.partial.open("w", encoding="utf-8")
        return self

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.partial:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

    def __exit__(self, kind, error, tb) -> None:
        if not self.partial:
            return
        self.file.close()
        if error is None:
            os.replace(self.partial, self.out)
            print(f"per-prompt results written to {self.out}")
        elif self.rows:
            done = len(self.rows)
            print(f"generate: stopped; the {done} finished prompts are in {self.partial}", file=sys.stderr)
        else:
            self.partial.unlink()


def _texts(args: argparse.Namespace) -> list[str]:
    """The prompts' texts, each checked before anything is loaded."""
    if args.prompt:
        for i, text in enumerate(args.prompt):
            if not text:
                raise InputError(f"--prompt: prompt {i} is empty; decoding needs a prompt")
        return args.prompt
    return prompt_texts(args.humaneval, args.prompts)


def prompt_texts(humaneval: int | None, prompts: str | None) -> list[str]:
    """``--prompts FILE`` (JSONL) or ``--humaneval N`` (evenly spaced problems), read before any load."""
    from spec_drafters.data.prompts import HumanEvalPrompts, JsonlPrompts

    if prompts:
        return JsonlPrompts(prompts).prompts()
    try:
        chosen = HumanEvalPrompts(humaneval)
    except ValueError as e:
        raise InputError(f"--humaneval {humaneval}: {e}") from None
    return chosen.prompts()


def _decode(setup: DrafterSetup, i: int, prompt: list[int], verifier: str, args: argparse.Namespace) -> dict:
    """One prompt's row: the speculative decode and, unless --no_greedy, the plain one that chooses
    tokens the same way (decode/summary.py: one rule with the validation callback)."""
    from spec_drafters.decode.generate import sample_generate
    from spec_drafters.decode.summary import decode_prompt

    eos, sampling = setup.card.eos_token_ids, setup.verifier.sampling

    def plain(p: list[int], s) -> object:
        return sample_generate(setup.target, p, args.max_new_tokens, eos, s)

    decoders = {"": (lambda p: setup.speculate(p, args.max_new_tokens), sampling)}
    one, spec = decode_prompt(prompt, decoders, None if args.no_greedy else plain)[""]
    row = {"prompt": i, "verifier": verifier, "prompt_tokens": len(prompt)}
    row |= {"output": setup.tokenizer.decode(spec.tokens), **one}
    stats = f"tau {row['tau']:.2f}, {row['tokens_per_s']:.1f} tok/s"
    if "speedup" in row:
        stats += f", speedup {row['speedup']:.2f}"
        stats += f", lossless {row['lossless']}" if row["lossless"] is not None else " (sampled)"
    print(f"[{i}] {row['new_tokens']} tokens, {row['rounds']} rounds, {stats}")
    return row


def _summary(rows: list[dict], verifier: str) -> dict:
    """decode/summary.py's summary, with the verifier's name."""
    from spec_drafters.decode.summary import summarize

    return {"verifier": verifier, **summarize(rows)}
