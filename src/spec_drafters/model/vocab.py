"""Draft vocabularies (component kind ``draft_vocab``): which target tokens the drafter may propose.

The frozen head over the target's whole vocabulary dominates both the drafter's training step and its
drafting pass on small targets (SmolLM2-135M: 49,152 x 576, about three quarters of a 2-layer drafter's
FLOPs per slot) and on large-vocabulary ones (Qwen3.6: 248k). A draft vocabulary keeps the V_d tokens
the target emits most often on the training corpus and drafts over the head's rows for those tokens
only: a frozen slice, no new parameters (the EAGLE-3 / speculators convention, ``d2t`` / ``t2d``).

Verification is unchanged: the target still checks every drafted token against its own choice, so
decoding stays lossless; a token outside the subset is simply never drafted, and a block stops being
accepted there. In training, slots whose label is outside the subset are not supervised; in
validation they count as misses (the drafter cannot propose them), so ``val/tau`` stays honest.

- ``full_vocab``: the whole vocabulary (the default).
- ``frequent_tokens``: the ``size`` most frequent tokens of a counts file written by
  ``spec-drafters draft-vocab`` (the training labels, i.e. the target's own outputs).
- ``from_folder``: the subset a drafter folder was trained with (its ``draft_ids``, or speculators'
  ``d2t``), to evaluate or fine-tune a shipped drafter without the counts it was chosen from.
"""

from __future__ import annotations

import json
import pickle
import warnings
from collections import Counter
from pathlib import Path

import torch

from spec_drafters.errors import MissingFile
from spec_drafters.registry import register


class DraftVocab:
    """Base class of the ``draft_vocab`` kind."""

    component_kind = "draft_vocab"

    def token_ids(self, vocab_size: int) -> torch.Tensor | None:
        """Sorted target ids of the draftable tokens (V_d,), or None for the whole vocabulary."""
        raise NotImplementedError


@register("draft_vocab", "full_vocab")
class FullVocab(DraftVocab):
    """Draft over the target's whole vocabulary."""

    def token_ids(self, vocab_size):
        return None


@register("draft_vocab", "frequent_tokens")
class FrequentTokens(DraftVocab):
    """The ``size`` most frequent tokens of a counts file (ties broken by the smaller id).

    A drafter stores the ids it was trained with (a checkpoint's ``drafter.draft_ids``, a folder's
    ``draft_ids`` or ``d2t``), so evaluating it does not need the counts file: ``stored`` names that
    artefact (``--ckpt_path`` sets it to the checkpoint; ``--model.init_from`` to the folder when the
    counts file is gone). Its ids are used; a counts file that ranks other tokens is warned about.

    Args:
        counts: JSON written by ``spec-drafters draft-vocab``: ``{"counts": {token id: count}}``.
        size: V_d, the number of draftable tokens.
        stored: a checkpoint or drafter folder that stores the ids (set by the CLI, not by hand).
    """

    def __init__(self, counts: str, size: int = 8192, stored: str | None = None):
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        self.counts, self.size, self.stored = counts, size, stored

    def token_ids(self, vocab_size):
        stored = stored_ids(self.stored, vocab_size) if self.stored else None
        if stored is None:
            return self.ranked(vocab_size)
        if len(stored) != self.size:
            raise ValueError(f"{self.stored} stores {len(stored)} draft token ids, size is {self.size}")
        if Path(self.counts).is_file():
            ranked = self.ranked(vocab_size)
            if not torch.equal(ranked, stored):
                other = len(set(ranked.tolist()) - set(stored.tolist()))
                warnings.warn(
                    f"{self.counts} ranks other draft tokens than {self.stored} stores ({other} of "
                    f"{self.size} differ): the stored ids, which the drafter was trained with, are used",
                    stacklevel=2,
                )
        return stored

    def ranked(self, vocab_size: int) -> torch.Tensor:
        """The ``size`` most frequent ids of the counts file, sorted."""
        table = read_counts(self.counts)
        if self.size > vocab_size:
            raise ValueError(f"size {self.size} exceeds the target's vocabulary of {vocab_size}")
        bad = [t for t in table if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{self.counts}: token ids {bad[:5]} outside the vocabulary 0..{vocab_size - 1}")
        ranked = sorted(range(vocab_size), key=lambda t: (-table.get(t, 0), t))
        return torch.tensor(sorted(ranked[: self.size]), dtype=torch.long)


def draft_vocab_ids(vocab: DraftVocab, vocab_size: int, init_from: str | None = None) -> torch.Tensor | None:
    """``vocab``'s ids; a ``frequent_tokens`` whose counts file is gone takes those the ``init_from``
    folder stores (a folder whose ids differ from an existing counts file's is refused by the load)."""
    if (
        init_from is not None
        and isinstance(vocab, FrequentTokens)
        and vocab.stored is None
        and not Path(vocab.counts).is_file()
    ):
        vocab = FrequentTokens(vocab.counts, vocab.size, stored=init_from)
    return vocab.token_ids(vocab_size)


@register("draft_vocab", "from_folder")
class FolderVocab(DraftVocab):
    """The draft vocabulary stored in a drafter folder (spec_drafters' ``draft_ids`` or speculators'
    ``d2t``, where target id = draft id + d2t).

    Args:
        path: the drafter folder (config.json + model.safetensors).
    """

    def __init__(self, path: str):
        self.path = path

    def token_ids(self, vocab_size):
        ids = stored_ids(self.path, vocab_size)
        if ids is None:
            raise ValueError(f"{self.path}: the folder drafts over the whole vocabulary; use full_vocab")
        return ids


def stored_ids(path: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The draft vocabulary a drafter folder (``draft_ids``, or speculators' ``d2t``) or a Lightning
    checkpoint (``drafter.draft_ids``) stores; None where it drafts over the whole vocabulary."""
    path = Path(path)
    ids = _checkpoint_ids(path) if path.is_file() else _folder_ids(path)
    if ids is not None and (
        ids.numel() < 2
        or bool((ids[1:] <= ids[:-1]).any())
        or not 0 <= int(ids[0]) <= int(ids[-1]) < vocab_size
    ):
        raise ValueError(f"{path}: its draft ids are not sorted distinct ids of 0..{vocab_size - 1}")
    return ids


def _folder_ids(path: Path) -> torch.Tensor | None:
    from safetensors import safe_open

    file = path / "model.safetensors"
    if not file.is_file():
        raise MissingFile(f"{path}: no model.safetensors (a drafter folder holds it)")
    with safe_open(str(file), framework="pt") as f:
        keys = set(f.keys())
        if "draft_ids" in keys:
            return f.get_tensor("draft_ids").long()
        if "d2t" in keys:
            d2t = f.get_tensor("d2t").long()
            return d2t + torch.arange(len(d2t))
    return None


READ_ERRORS = (RuntimeError, EOFError, ValueError, OSError, pickle.UnpicklingError)


def _checkpoint_ids(path: Path) -> torch.Tensor | None:
    """A checkpoint's ``drafter.draft_ids``, memory-mapped: the weights beside them are not read. The
    CLI has read and checked the file already (artefacts/checkpoints.py); this names it if not."""
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        ids = ckpt["state_dict"].get("drafter.draft_ids")
    except (*READ_ERRORS, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: no draft ids readable from it ({type(e).__name__}: {e})") from None
    return None if ids is None else ids.long().clone()


def read_counts(path: str | Path) -> dict[int, int]:
    path = Path(path)
    if not path.is_file():
        raise MissingFile(f"no token counts file {path} (write one with spec-drafters draft-vocab)")
    try:
        data = json.loads(path.read_text())
        return {int(k): int(v) for k, v in data["counts"].items()}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not a token counts file ({e})") from None


def count_labels(batches) -> Counter:
    """Counts of the supervised labels over an iterable of training batches or cached records.

    A cached record carries the target's labels (``labels``, -1 where none); a text record counts its
    supervised tokens, which are the target's outputs when the text is the target's own answers.
    """
    counts: Counter = Counter()
    for rec in batches:
        if "labels" in rec:
            labels = rec["labels"][rec["loss_mask"].bool() & (rec["labels"] >= 0)]
        else:
            labels = rec["input_ids"][rec["loss_mask"].bool()]
        counts.update(labels.tolist())
    return counts


def coverage(ids: torch.Tensor | None, counts: Counter) -> float:
    """Fraction of the counted tokens inside the vocabulary ``ids`` (1.0 for the whole vocabulary)."""
    total = sum(counts.values())
    if ids is None or not total:
        return 1.0
    inside = set(ids.tolist())
    return sum(n for t, n in counts.items() if t in inside) / total
