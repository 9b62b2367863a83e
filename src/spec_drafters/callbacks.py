"""Real speculative decoding as a validation callback: tau, tokens/s and losslessness on real prompts.

Teacher-forced metrics (module.py) say how well the drafter predicts the target's labels; this says
what actually happens when the drafter drives the target: each prompt is decoded twice, by the
target alone (plain greedy) and with the drafter and the verifier, and the two outputs must match.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
from jsonargparse import lazy_instance
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from spec_drafters.prompts import HumanEvalPrompts, PromptSet


class SpeculativeDecodingEval(pl.Callback):
    """Decodes a prompt set at the end of validation and logs ``decode/*`` metrics.

    Args:
        prompts: the evaluation prompts (HumanEval by default).
        max_new_tokens: tokens generated per prompt.
        during_fit: also run at the end of every validation inside ``fit`` (slow on CPU).
        output: per-prompt results (JSONL) written into the logger's folder; null to skip.
    """

    def __init__(
        self,
        prompts: PromptSet = lazy_instance(HumanEvalPrompts, num_prompts=10),
        max_new_tokens: int = 64,
        during_fit: bool = False,
        output: str | None = "decode.jsonl",
    ):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.prompts, self.max_new_tokens, self.during_fit, self.output = (
            prompts,
            max_new_tokens,
            during_fit,
            output,
        )
        self.last: dict[str, float] = {}

    def on_validation_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.state.fn == TrainerFn.FITTING and not self.during_fit):
            return
        rows = []
        for i, text in enumerate(self.prompts.prompts()):
            prompt = module.tokenizer.encode(text)
            plain = module.greedy(prompt, self.max_new_tokens)
            spec = module.speculate(prompt, self.max_new_tokens)
            rows.append(
                {
                    "prompt": i,
                    "prompt_tokens": len(prompt),
                    "new_tokens": len(spec.tokens),
                    "rounds": spec.rounds,
                    "tau": spec.tau,
                    "tokens_per_s": spec.tokens_per_s,
                    "greedy_tokens_per_s": plain.tokens_per_s,
                    "lossless": spec.tokens == plain.tokens,
                    "accept_lengths": spec.accept_lengths,
                }
            )
        n = len(rows)
        spec_tokens = sum(r["new_tokens"] for r in rows)
        spec_time = sum(r["new_tokens"] / r["tokens_per_s"] for r in rows)
        plain_time = sum(r["new_tokens"] / r["greedy_tokens_per_s"] for r in rows)
        self.last = {
            "decode/tau": sum(r["tau"] for r in rows) / n,
            "decode/tau_pooled": sum(sum(r["accept_lengths"]) for r in rows) / sum(r["rounds"] for r in rows),
            "decode/tokens_per_s": spec_tokens / spec_time,
            "decode/greedy_tokens_per_s": spec_tokens / plain_time,
            "decode/speedup": plain_time / spec_time,
            "decode/lossless": sum(r["lossless"] for r in rows) / n,
            "decode/prompts": float(n),
        }
        for key, value in self.last.items():
            module.log(key, value, rank_zero_only=True)
        if self.output and trainer.log_dir:
            path = Path(trainer.log_dir) / self.output
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            rank_zero_info(f"per-prompt decoding results: {path}")
        broken = [r["prompt"] for r in rows if not r["lossless"]]
        if broken:
            # Greedy speculative decoding is lossless by construction; a mismatch means a bug or a
            # near-tie flipped by the different float summation order of a K-token verify forward.
            rank_zero_warn(f"speculative output differs from the target's greedy output on prompts {broken}")
