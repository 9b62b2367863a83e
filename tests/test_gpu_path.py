"""The GPU path, made ready and checked here as far as a CPU can (issue 33, item 3; docs/scale.md#gpu):
the target's attention kernel as an argument, refused where it would misread a tree's mask."""

import pytest
import torch

from conftest import tiny_target
from spec_drafters.target.loaders import HFPretrained, TinyRandom


def test_the_targets_attention_kernel_is_an_argument(tmp_path):
    TinyRandom(num_layers=4).load().model.save_pretrained(tmp_path / "t")
    for kernel in ("eager", "sdpa"):
        loaded = HFPretrained(str(tmp_path / "t"), mask_token_id=258, attn_implementation=kernel).load()
        assert loaded.model.config._attn_implementation == kernel
    with pytest.raises(ValueError, match="attn_implementation must be one of sdpa, eager"):
        HFPretrained(str(tmp_path / "t"), mask_token_id=258, attn_implementation="flash2")


def test_a_flash_target_refuses_a_trees_mask_instead_of_reading_it_as_causal(monkeypatch):
    target = tiny_target()
    ids = torch.randint(0, 256, (1, 6))
    tree = torch.zeros((1, 1, 6, 6))  # additive 4D mask, as tree verification passes it
    target(ids, attention_mask=tree)  # sdpa: fine
    # as a flash-attn target reports it (setting it for real would look for the kernel)
    flash = property(lambda _: "flash_attention_2")
    monkeypatch.setattr(type(target.model.config), "_attn_implementation", flash)
    with pytest.raises(ValueError, match="takes no 4D mask: tree verification"):
        target(ids, attention_mask=tree)
