"""Generation engines for ``spec-drafters regenerate`` (docs/regenerate.md), registered as ``engine``.

- ``transformers``: in process, on this project's own target path (decode/generate.py: the prepacked
  target, greedy or sampled with a seed per prompt), one prompt at a time. Works offline with nothing
  else installed; its greedy answers are exactly what the lossless checks compare against.
- ``openai``: an OpenAI-compatible server (vLLM, SGLang): token-id prompts to ``/v1/completions``, the
  answer's token ids read back (vLLM's ``return_token_ids``, or its ``return_tokens_as_token_ids``
  logprobs), concurrent requests, retries with backoff, and a check before any work that the server is
  reachable, serves the named model and tokenizes as the target does.

Both take prompts as token ids (the target's chat template rendered here, data/chat.py), so the ids in
a record are the ids the model saw and wrote, whichever engine wrote them.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from spec_drafters.decode.generate import sample_generate
from spec_drafters.decode.sampling import Sampling
from spec_drafters.errors import InputError
from spec_drafters.registry import register
from spec_drafters.rng import derived_seed


@dataclass(frozen=True)
class Settings:
    """How every prompt is answered."""

    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.max_tokens < 1:
            raise InputError(f"--max_tokens must be >= 1, got {self.max_tokens}")
        Sampling(self.temperature, self.top_p, self.seed)  # the same checks as a sampling verifier

    def seed_for(self, item_id: str) -> int:
        """A prompt's own seed: the run's seed and the prompt's id, so a resumed or reordered run draws
        the same answer for it."""
        return derived_seed(self.seed, int(item_id[:12], 16)) % 2**63  # manual_seed's range


class Engine:
    """Base class of the ``engine`` kind: answers token-id prompts."""

    component_kind = "engine"

    def start(self, target, tokenizer, card) -> dict:
        """Checks before any work (the frozen target, its tokenizer and card); returns what identifies
        the engine for the manifest."""
        raise NotImplementedError

    def generate(
        self, prompts: list[list[int]], ids: list[str], settings: Settings
    ) -> list[tuple[list[int], str]]:
        """(answer ids, finish reason) per prompt; ``ids`` are the prompts' item ids (per-prompt seeds)."""
        raise NotImplementedError


@register("engine", "transformers")
class InProcess(Engine):
    """The target in this process: one prompt at a time on this project's decoding path, or, greedy
    with ``batch_size`` > 1, transformers' batched ``generate`` over left-padded prompts (faster on a
    CPU; padding may flip a near-tie, which tests/test_regenerate.py and the engine benchmark check).

    Args:
        batch_size: prompts per forward; above 1 for greedy decoding of attention-only targets.
    """

    def __init__(self, batch_size: int = 1):
        if batch_size < 1:
            raise InputError(f"--batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size

    def start(self, target, tokenizer, card) -> dict:
        self.target, self.eos = target, list(card.eos_token_ids)
        recurrent = any(getattr(layer, "linear_attn", None) is not None for layer in target.base.layers)
        if self.batch_size > 1 and recurrent:
            raise InputError(
                "--batch_size > 1 pads prompts, which a Gated-DeltaNet layer's state would read: use 1 on "
                f"this hybrid target ({card.name})"
            )
        return {"engine": "transformers", "target": card.name, "batch_size": self.batch_size}

    def generate(self, prompts, ids, settings):
        if self.batch_size > 1:
            if settings.temperature > 0:
                raise InputError("--batch_size > 1 is for greedy answers (a sampled prompt has its own seed)")
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding
            answers: dict[int, tuple[list[int], str]] = {}
            for b in range(0, len(order), self.batch_size):
                chunk = order[b : b + self.batch_size]
                batch = self._batch([prompts[i] for i in chunk], settings.max_tokens)
                answers.update(zip(chunk, batch, strict=True))
            return [answers[i] for i in range(len(prompts))]
        out = []
        for prompt, item_id in zip(prompts, ids, strict=True):
            sampling = Sampling(settings.temperature, settings.top_p, settings.seed_for(item_id))
            result = sample_generate(self.target, prompt, settings.max_tokens, self.eos, sampling)
            stop = bool(result.tokens) and result.tokens[-1] in self.eos
            out.append((result.tokens, "stop" if stop else "length"))
        return out

    @torch.no_grad()
    def _batch(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], str]]:
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self.eos[0])
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
        device = self.target.embed_tokens.weight.device
        rows = self.target.model.generate(
            ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_tokens, do_sample=False,
            eos_token_id=self.eos, pad_token_id=self.eos[0],
        )[:, width:].tolist()  # fmt: skip
        out = []
        for row in rows:
            stop = next((i for i, t in enumerate(row) if t in self.eos), None)
            out.append((row[: stop + 1], "stop") if stop is not None else (row[:max_tokens], "length"))
        return out


@register("engine", "openai")
class OpenAICompatible(Engine):
    """An OpenAI-compatible server (vLLM or SGLang) given by its base URL.

    Args:
        base_url: e.g. ``http://localhost:8000`` (``/v1`` is added when missing).
        model: the served model's name (``--served-model-name``); checked against ``/v1/models``.
        concurrency: requests in flight at once (the server batches them).
        retries: attempts per request after the first, on a connection error or a 5xx answer.
        timeout: seconds per request.
        api_key: sent as a bearer token when set.
    """

    def __init__(
        self,
        base_url: str = "http://localhost:8000",
        model: str | None = None,
        concurrency: int = 8,
        retries: int = 3,
        timeout: float = 600.0,
        api_key: str | None = None,
    ):
        if concurrency < 1 or retries < 0 or timeout <= 0:
            raise InputError("--engine openai: concurrency >= 1, retries >= 0 and timeout > 0 are needed")
        base = base_url.rstrip("/")
        self.base = base if base.endswith("/v1") else base + "/v1"
        self.model, self.concurrency, self.retries = model, concurrency, retries
        self.timeout, self.api_key = timeout, api_key

    def _call(self, path: str, body: dict | None = None, attempts: int | None = None) -> dict:
        url = f"{self.base}{path}" if path.startswith("/") else path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempts = self.retries + 1 if attempts is None else attempts
        for attempt in range(attempts):
            request = urllib.request.Request(
                url, data=data, headers=headers, method="POST" if data else "GET"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:300]
                if e.code < 500 or attempt == attempts - 1:
                    raise InputError(f"{url}: the server answered {e.code}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                if attempt == attempts - 1:
                    raise InputError(
                        f"{url}: no answer after {attempts} attempt(s) ({getattr(e, 'reason', e)}): is "
                        "the server running there? (docs/regenerate.md: serving the target with vLLM)"
                    ) from None
            time.sleep(min(2**attempt, 30))  # back off, then try again
        raise AssertionError("unreachable")

    def start(self, target, tokenizer, card) -> dict:
        served = [m.get("id") for m in self._call("/models").get("data", [])]
        if self.model is None:
            if len(served) != 1:
                raise InputError(f"{self.base}: serves {served}; name one with --engine.model")
            self.model = served[0]
        elif self.model not in served:
            raise InputError(f"{self.base} serves {served}, not {self.model!r}: another model?")
        probe = "def add(a, b):\n    return a + b  # <probe> héllo"
        body = {"model": self.model, "prompt": probe, "add_special_tokens": False}
        theirs = self._call(self.base.removesuffix("/v1") + "/tokenize", body)
        ours = tokenizer.encode(probe)
        if theirs.get("tokens") != ours:
            raise InputError(
                f"{self.base}: the served {self.model!r} tokenizes a probe text as "
                f"{theirs.get('tokens')!r:.80}, the target {card.name} as {ours!r:.80}: it serves another "
                "model or tokenizer"
            )
        return {"engine": "openai", "base_url": self.base, "model": self.model}

    def _one(self, prompt: list[int], item_id: str, settings: Settings) -> tuple[list[int], str]:
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": settings.max_tokens,
            "temperature": settings.temperature, "top_p": settings.top_p,
            "seed": settings.seed_for(item_id) % 2**31,
            "skip_special_tokens": False, "spaces_between_special_tokens": False,
            "return_token_ids": True, "logprobs": 0, "return_tokens_as_token_ids": True,
        }  # fmt: skip
        choice = self._call("/completions", body)["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:  # an older vLLM: the ids from the logprobs' "token_id:N" strings
            tokens = (choice.get("logprobs") or {}).get("tokens") or []
            if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                raise InputError(
                    f"{self.base}: the server returns no token ids (needs vLLM's return_token_ids)"
                )
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        reason = choice.get("finish_reason") or "length"
        return list(ids), "stop" if reason == "stop" else "length"

    def generate(self, prompts, ids, settings):
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda p: self._one(p[0], p[1], settings), zip(prompts, ids, strict=True)))
