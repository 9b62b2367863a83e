"""Real speculative decoding as a validation callback: tau, tokens/s and losslessness on real prompts.

Teacher-forced metrics (module.py) say how well the drafter predicts the target's labels; this says
what actually happens when the drafter drives the target: each prompt is decoded by the target alone
(plain greedy), then with the drafter under each verifier (the module's, plus any listed here), and
optionally by prompt-lookup decoding, the drafter-free baseline users would otherwise pick, run on the
same target path as greedy and the drafters (decode/generate.py ``prompt_lookup_generate``, the
candidate rule of transformers' ``prompt_lookup_num_tokens``). Every output must equal the plain
greedy one. A verifier that samples (temperature > 0) is timed against plain sampling at its own
settings instead, and has no ``lossless`` (decode/summary.py).

Metrics: ``decode/<metric>`` for the module's verifier, ``decode/<metric>_<label>`` for the others
(label: registry name, plus ``_b<budget>`` for DDTree), ``decode/<metric>_prompt_lookup``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Literal

import lightning.pytorch as pl
from jsonargparse import lazy_instance
from lightning.pytorch.callbacks import RichProgressBar, ThroughputMonitor
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from spec_drafters.data.prompts import HumanEvalPrompts, PromptSet
from spec_drafters.decode.generate import prompt_lookup_generate, sample_generate
from spec_drafters.decode.sampling import GREEDY, Sampling
from spec_drafters.decode.summary import Decoder, check_prompts, decode_prompt, summarize
from spec_drafters.decode.verifiers import Verifier

PROMPT_LOOKUP_IMPL = "fast_path"  # prompt lookup on the drafters' target path (decode/generate.py)


class SpeculativeDecodingEval(pl.Callback):
    """Decodes a prompt set at the end of validation and logs ``decode/*`` metrics.

    Args:
        prompts: the evaluation prompts (HumanEval by default).
        max_new_tokens: tokens generated per prompt.
        verifiers: more verifiers to decode with besides the module's (e.g. DDTree at several budgets).
        prompt_lookup_tokens: also run prompt-lookup decoding with at most this many draft tokens a
            round (null: skip); per-prompt rows then say ``prompt_lookup_impl: fast_path`` (rows
            without it came from transformers' ``generate`` on stock kernels).
        during_fit: also run at the end of every validation inside ``fit`` (slow on CPU).
        output: per-prompt results (JSONL): a path relative to the logger's folder (skipped without a
            logger), or an absolute path (written with or without one); null to skip.
    """

    def __init__(
        self,
        prompts: PromptSet = lazy_instance(HumanEvalPrompts, num_prompts=10),
        max_new_tokens: int = 64,
        verifiers: list[Verifier] | None = None,
        prompt_lookup_tokens: int | None = None,
        during_fit: bool = False,
        output: str | None = "decode.jsonl",
    ):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if prompt_lookup_tokens is not None and prompt_lookup_tokens < 1:
            raise ValueError(f"prompt_lookup_tokens must be >= 1 or null, got {prompt_lookup_tokens}")
        self.prompts, self.max_new_tokens = prompts, max_new_tokens
        self.verifiers = list(verifiers or [])
        self.prompt_lookup_tokens = prompt_lookup_tokens
        self.during_fit, self.output = during_fit, output
        self.last: dict[str, float] = {}

    def _decoders(self, module) -> dict[str, Decoder]:
        """suffix -> (a function prompt -> DecodeResult, how it chooses tokens)."""
        setup, n = module.built, self.max_new_tokens
        out = {"": (lambda p: setup.speculate(p, n), setup.verifier.sampling)}
        for v in self.verifiers:
            out["_" + v.label()] = (lambda p, v=v: setup.speculate(p, n, v), v.sampling)
        if self.prompt_lookup_tokens:
            eos, k = setup.card.eos_token_ids, self.prompt_lookup_tokens
            out["_prompt_lookup"] = (
                lambda p: prompt_lookup_generate(setup.target, p, n, eos, num_tokens=k),
                GREEDY,
            )
        return out

    def on_validation_epoch_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.state.fn == TrainerFn.FITTING and not self.during_fit):
            return
        if trainer.world_size > 1:
            # Decoding runs the drafter outside its forward, one prompt at a time: with weights
            # sharded over ranks (FSDP2) that is neither possible nor useful. Teacher-forced metrics
            # are still computed; decode on one device with `spec-drafters validate` or `generate`.
            rank_zero_warn("SpeculativeDecodingEval: skipped with more than one process (sharded drafter)")
            return
        decoders, setup = self._decoders(module), module.built
        prompts = [setup.tokenizer.encode(text) for text in self.prompts.prompts()]
        check_prompts(setup.target, prompts, self.max_new_tokens, type(self).__name__)
        eos = setup.card.eos_token_ids

        def plain(p: list[int], s: Sampling):
            return sample_generate(setup.target, p, self.max_new_tokens, eos, s)

        per_decoder: dict[str, list[dict]] = {suffix: [] for suffix in decoders}
        rows = []
        for i, prompt in enumerate(prompts):
            row = {"prompt": i, "prompt_tokens": len(prompt)}
            if "_prompt_lookup" in decoders:  # which prompt lookup ran: older rows timed transformers'
                row["prompt_lookup_impl"] = PROMPT_LOOKUP_IMPL
            for suffix, (one, _) in decode_prompt(prompt, decoders, plain).items():
                per_decoder[suffix].append(one)
                shared = decoders[suffix][
                    1
                ].greedy  # the greedy baseline's keys are shared by every greedy decoder
                row.update(
                    {k if shared and k.startswith("greedy_") else f"{k}{suffix}": v for k, v in one.items()}
                )
            rows.append(row)
        self.last = {"decode/prompts": float(len(rows))}
        for suffix, decoded in per_decoder.items():
            summary = summarize(decoded)
            if decoders[suffix][1].greedy:  # the same for every greedy decoder
                self.last["decode/greedy_tokens_per_s"] = summary["greedy_tokens_per_s"]
            for key in ("tau", "tau_pooled", "tokens_per_s", "speedup", "lossless"):
                if summary[key] is not None:  # a sampled decoder has no lossless
                    self.last[f"decode/{key}{suffix}"] = summary[key]
        for key, value in self.last.items():
            module.log(key, value, rank_zero_only=True)
        log_dir = trainer.log_dir
        path = None if not self.output else Path(self.output)
        if path is not None and not path.is_absolute():
            path = Path(log_dir) / path if log_dir else None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            rank_zero_info(f"per-prompt decoding results: {path}")
        broken = sorted(
            {(s or "_verifier")[1:] for r in rows for s in decoders if r[f"lossless{s}"] is False}
        )
        if broken:
            # Greedy speculative decoding is lossless by construction; a mismatch means a bug or a
            # near-tie flipped by the different float summation order of a K-token verify forward.
            rank_zero_warn(f"outputs differ from the target's greedy output for: {', '.join(broken)}")


class ExportDrafter(pl.Callback):
    """Writes the trained drafter as a folder (config.json + model.safetensors) when ``fit`` ends.

    Lightning checkpoints stay the way to resume; this folder is what other tools load.

    Args:
        dirpath: the folder to write.
        layout: spec_drafters (everything), zlab or speculators (see artefacts/folders.py).
    """

    def __init__(
        self, dirpath: str, layout: Literal["spec_drafters", "zlab", "speculators"] = "spec_drafters"
    ):
        from spec_drafters.artefacts.folders import LAYOUTS

        if layout not in LAYOUTS:  # jsonargparse checks the Literal; plain Python callers get this
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.dirpath, self.layout = dirpath, layout

    def on_fit_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        from spec_drafters.artefacts.folders import write_folder

        if trainer.is_global_zero:
            out = write_folder(module.built.folder(), self.dirpath, self.layout)
            rank_zero_info(f"drafter written to {out} ({self.layout} layout)")


def count_sequences(batch: dict) -> int:
    """ThroughputMonitor's ``batch_size_fn``: the sequences in one of this project's batches."""
    return int(batch["input_ids"].shape[0])


def count_tokens(batch: dict) -> int:
    """ThroughputMonitor's ``length_fn``: the batch's real tokens, padding excluded."""
    return int(batch["attention_mask"].sum())


class TrainingThroughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor over this project's batches, plus the run's training tokens/s.

    Counts sequences and real (non-padding) tokens. Lightning's metrics go to the loggers:
    ``train/device/items_per_sec`` (tokens/s over the last ``window_size`` steps), ``train/lengths``,
    ``train/time`` and the like, and ``validate/...`` for validation. ``train/tokens_per_s`` is every
    rank's tokens since training started over the training wall time (validation excluded; data
    loading included), logged with ``module.log`` so that it also reaches ``--results``, where the
    last value is the whole run's.

    Lightning's callback under the name configs already use (it was a hand-written timer before).

    Args:
        window_size: steps in the rolling averages of Lightning's ``*_per_sec`` metrics.
    """

    def __init__(self, window_size: int = 100):
        super().__init__(batch_size_fn=count_sequences, length_fn=count_tokens, window_size=window_size)
        # flops_per_batch is set after the first batch (below); until then ThroughputMonitor would say so.
        warnings.filterwarnings("ignore", message=r".*define a `flops_per_batch` attribute")
        self._counter, self.counted = None, {}

    # FLOPs of a step, counted once: the first batch's forward under torch's FlopCounterMode (it ends
    # before backward, which CUDA runs on another thread, out of the mode's sight), then the trained
    # part's counted x3 (backward ~ 2x forward), the frozen target's x1 (no backward). An estimate:
    # the frozen head's weight gradient, never computed, is counted in the x3.
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if getattr(pl_module, "flops_per_batch", None) is None and self._counter is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._counter = FlopCounterMode(display=False)
            self._counter.__enter__()

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self._counter is None:
            return
        counter, self._counter = self._counter, None
        counter.__exit__(None, None, None)
        frozen = sum(counter.get_flop_counts().get(type(pl_module.target).__name__, {}).values())
        self.counted = {"target_forward": frozen, "trained_forward": counter.get_total_flops() - frozen}
        pl_module.flops_per_batch = frozen + 3 * self.counted["trained_forward"]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.is_global_zero:  # ThroughputMonitor counts on rank 0 only
            totals = self._throughputs[RunningStage.TRAINING].compute()  # since training started
            tokens_per_s = totals["lengths"] * trainer.world_size / totals["time"]
            pl_module.log("train/tokens_per_s", tokens_per_s, rank_zero_only=True)
            flops = getattr(pl_module, "flops_per_batch", None)
            if flops:  # the run's rate: every batch's FLOPs over the training wall time
                flops_per_s = flops * totals["batches"] * trainer.world_size / totals["time"]
                pl_module.log("train/flops_per_batch", float(flops), rank_zero_only=True)
                pl_module.log("train/flops_per_s", flops_per_s, rank_zero_only=True)
                peak = self._available_flops(trainer)
                if peak:  # Lightning's table of devices' peak FLOPs at the run's precision
                    pl_module.log("train/mfu", flops_per_s / trainer.world_size / peak, rank_zero_only=True)

    @staticmethod
    def _available_flops(trainer) -> float | None:
        from lightning.fabric.utilities.throughput import get_available_flops

        if trainer.strategy.root_device.type != "cuda":
            return None  # CPUs are not in Lightning's table
        return get_available_flops(trainer.strategy.root_device, trainer.precision_plugin.compute_dtype)


class RunProgressBar(RichProgressBar):
    """Lightning's rich progress bar (the default when ``rich`` is installed), whose epoch reads
    "Epoch 3" on a run bounded by ``max_steps`` instead of "Epoch 3/-2" (``max_epochs`` -1, minus one).
    The total shows when ``max_epochs`` bounds the run."""

    def _get_train_description(self, current_epoch: int) -> str:
        text = f"Epoch {current_epoch}"
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs > 0:
            text += f"/{max_epochs - 1}"
        return f"{text:{len(self.validation_description)}}"  # padded like Lightning's: no flicker
