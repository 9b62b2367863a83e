"""``--model.init_from FOLDER``: a drafter started from a folder of any layout, checked first to have been
made for this run's target (as ``--ckpt_path`` checks a checkpoint's), then for its fc layers, shape
and draft vocabulary.

What each layout records of its target: the spec_drafters layout its card name (and shape); z-lab's
the target's depth and vocabulary; speculators' its vocabulary (the depth is the caller's). The
hidden size is the drafter's own in all three. A folder without a name is checked by that shape and
warned about: a drafter for another target of the same shape cannot be told apart.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from spec_drafters.artefacts.folders import DrafterFolder, read_folder
from spec_drafters.errors import InputError
from spec_drafters.model.drafter import DFlashDrafter


def load_folder_into(
    path: str | Path, drafter: DFlashDrafter, fc_ids: list[int], card, aux_head=None
) -> None:
    """Starts ``drafter`` (and a confidence head, if given and stored) from a drafter folder of any
    layout; it must have been made for ``card``'s target (checked as ``--ckpt_path`` checks a
    checkpoint's), and its fc layers, shape and draft vocabulary must be the drafter's."""
    folder = read_folder(path, num_target_layers=card.num_layers)
    check_target(folder, path, card)
    made_for = f" (the folder was made for target {target_name(folder)!r})" if target_name(folder) else ""
    if folder.fc_ids != fc_ids:
        raise ValueError(
            f"{path}: its fc reads target layers {folder.fc_ids}, this drafter's fc {fc_ids}{made_for}"
        )
    mine, theirs = asdict(drafter.config), asdict(folder.config)
    differ = [k for k in mine if k != "attention" and mine[k] != theirs.get(k)]
    if differ:
        raise ValueError(
            f"{path}: the folder's drafter differs from this config's{made_for}: "
            + ", ".join(f"{k} {theirs.get(k)} vs {mine[k]}" for k in differ)
        )
    mine_ids, theirs_ids = drafter.draft_ids, folder.state.get("draft_ids")
    if mine_ids is not None and not torch.equal(mine_ids, theirs_ids):
        raise ValueError(
            f"{path}: the folder's draft vocabulary ({len(theirs_ids)} tokens) is not the one "
            f"--model.draft_vocab gives ({len(mine_ids)} tokens, "
            f"{len(set(mine_ids.tolist()) - set(theirs_ids.tolist()))} of them not in the folder's)"
        )
    drafter.load_state_dict(folder.state, strict=True)
    if aux_head is not None and "confidence_head.weight" in folder.aux:
        aux_head.load_state_dict(
            {"weight": folder.aux["confidence_head.weight"], "bias": folder.aux["confidence_head.bias"]}
        )


def target_name(folder: DrafterFolder) -> str | None:
    """The target a folder names (the spec_drafters layout's block; z-lab and speculators name none)."""
    target = folder.meta.get("target")
    return target.get("name") if isinstance(target, dict) else None


def check_target(folder: DrafterFolder, path, card) -> None:
    """The folder's target must be ``card``'s: by name where it records one (its name, as a
    checkpoint's); otherwise by what it records of the target's shape (depth, vocabulary, hidden
    size), with a warning that only the shape could be checked."""
    name = target_name(folder)
    if name is not None:
        if name != card.name:
            raise InputError(
                f"{path}: the drafter folder was trained for target {name!r}, --model.target loads "
                f"{card.name!r}"
            )
        return
    theirs = (folder.num_target_layers or card.num_layers, folder.vocab_size, folder.config.hidden_size)
    mine = (card.num_layers, card.vocab_size, card.hidden_size)
    if theirs != mine:
        raise InputError(
            f"{path}: the drafter folder was made for a target of (layers, vocabulary, hidden) {theirs} "
            f"(its {folder.layout} config names no target), --model.target loads {card.name!r} {mine}"
        )
    warnings.warn(
        f"{path}: a {folder.layout} folder does not say which target it was trained for; its shape fits "
        f"--model.target {card.name!r} ({card.num_layers} layers, vocabulary {card.vocab_size}), which "
        "is all that can be checked",
        stacklevel=2,
    )
