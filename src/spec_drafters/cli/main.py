"""``spec-drafters``: one command line to train, evaluate, inspect and ship DFlash drafters.

``fit`` and ``validate`` are LightningCLI's (cli/lightning_cli.py); every other command is
this project's own and parses its arguments with argparse. ``spec-drafters --help`` lists them all,
``spec-drafters COMMAND --help`` explains one. Bad input ends as one line naming the flag, file and
line or field (``spec-drafters: error: ...``), exit status 1, without a traceback (errors.py).

A command's module is imported when the command runs, so that ``--help`` does not wait for Lightning.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

from spec_drafters.errors import ArgumentError, InputError


@dataclass(frozen=True)
class Command:
    target: str  # "module:function" in spec_drafters.cli, called with the arguments after the command
    summary: str  # its line in ``spec-drafters --help``

    def run(self, argv: list[str]) -> None:
        module, _, function = self.target.partition(":")
        getattr(importlib.import_module(f"spec_drafters.cli.{module}"), function)(argv)


#: Every command, in the order ``spec-drafters --help`` lists them.
COMMANDS: dict[str, Command] = {
    "fit": Command(
        "lightning_cli:run_fit", "train a drafter (LightningCLI: --config, --model.*, --data.*, --trainer.*)"
    ),
    "validate": Command(
        "results:run_validate",
        "offline metrics of a drafter (--ckpt_path); several side by side with --drafters A B ...",
    ),
    "generate": Command(
        "generate:generate", "decode prompts with the drafter and a verifier: tau, speed, lossless"
    ),
    "calibrate": Command(
        "calibrate:calibrate", "fit per-slot temperatures on held-out blocks for DDTree's ranking; prefix ECE"
    ),
    "cost-model": Command(
        "cost:cost_model", "time a round's parts on this machine for the adaptive tree verifier's budget"
    ),
    "cache": Command(
        "data_commands:cache_cmd", "run the target once over the training data into an offline feature cache"
    ),
    "draft-vocab": Command(
        "data_commands:draft_vocab_cmd",
        "count the training labels for a frequent_tokens draft vocabulary; its held-out coverage",
    ),
    "corpus": Command(
        "data_commands:corpus_cmd", "build the offline training corpus: stdlib prompts answered by the target"
    ),
    "reference-corpus": Command(
        "data_commands:reference_corpus_cmd",
        "build the reference drafter's corpus from the stdlib's docstrings (or mix it with source)",
    ),
    "regenerate": Command(
        "regenerate:regenerate",
        "answer prompts with the target (chat template, thinking, engine) into token-exact training records",
    ),
    "serve-eval": Command(
        "serve_eval:serve_eval",
        "serve the drafter in vLLM: the engine's acceptance counters and speed, outputs against plain greedy",
    ),
    "export": Command(
        "tools:export",
        "write a checkpoint or drafter folder in the spec_drafters, zlab or speculators layout",
    ),
    "inspect": Command(
        "tools:inspect_cmd", "what a drafter folder, checkpoint or config is, read from its weights' shapes"
    ),
    "diff": Command(
        "tools:diff_cmd", "every choice that differs between two configs, drafter folders or checkpoints"
    ),
    "lint": Command(
        "tools:lint_cmd", "known pitfalls of a config before a long run (--strict fails on warnings too)"
    ),
    "compare": Command("results:compare", "the metrics of several --results files side by side"),
    "registry": Command(
        "results:print_registry", "every registered component: its name, class path and parameters"
    ),
}


def usage() -> str:
    width = max(map(len, COMMANDS)) + 2
    return "\n".join(
        [
            "usage: spec-drafters COMMAND [ARGS ...]",
            "",
            "Train, evaluate, inspect and ship DFlash speculative-decoding drafters.",
            "",
            "commands:",
            *(f"  {name:<{width}}{command.summary}" for name, command in COMMANDS.items()),
            "",
            "'spec-drafters COMMAND --help' describes a command's arguments.",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(usage(), file=sys.stderr)
        sys.exit(2)
    if argv[0] in ("-h", "--help"):
        print(usage())
        return
    if argv[0] not in COMMANDS and not argv[0].startswith("-"):
        sys.exit(f"spec-drafters: error: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}")
    try:
        if argv[0] in COMMANDS:
            COMMANDS[argv[0]].run(argv[1:])
        else:  # options before the command are LightningCLI's (-c CONFIG fit)
            from spec_drafters.cli.lightning_cli import run_lightning

            run_lightning(argv)
    except ArgumentError as e:  # a component's error, tagged with the argument it came through
        sys.exit(f"spec-drafters: error: {e.flagged()}")
    except InputError as e:  # the message names the flag, file and line or field: no traceback
        sys.exit(f"spec-drafters: error: {e}")


if __name__ == "__main__":
    main()
