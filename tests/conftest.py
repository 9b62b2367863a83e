"""Shared tiny, deterministic fixtures: random Qwen3/Llama/hybrid targets built in code, hidden 32."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from spec_drafters.model.drafter import DFlashDrafter, DrafterConfig
from spec_drafters.registry import load_components
from spec_drafters.target.frozen import FrozenTarget
from spec_drafters.target.loaders import TinyRandom

load_components()
torch.set_num_threads(2)

ROOT = Path(__file__).resolve().parent.parent


# What Lightning writes into the working directory when a run has no logger and no default_root_dir.
STRAY = ("calibration.json", "config.yaml", "config_validate.yaml", "config_test.yaml", "lightning_logs")


@pytest.fixture(autouse=True)
def nothing_written_into_the_checkout():
    """A test's runs write under its tmp_path, never into the repository root."""
    before = {name for name in STRAY if (ROOT / name).exists()}
    yield
    stray = sorted({name for name in STRAY if (ROOT / name).exists()} - before)
    for name in stray:
        shutil.rmtree(ROOT / name) if (ROOT / name).is_dir() else (ROOT / name).unlink()
    assert not stray, f"the test wrote {stray} into the repository root: give its run a tmp_path folder"


def tiny_target(
    architecture="qwen3", num_layers=6, dtype="float32", seed=0, tap_ids=(1, 2, 3)
) -> FrozenTarget:
    loaded = TinyRandom(architecture=architecture, num_layers=num_layers, dtype=dtype, seed=seed).load()
    return FrozenTarget(loaded.model, tap_ids)


def tiny_drafter(
    target: FrozenTarget, block_size=4, num_layers=2, attention="eager", num_fc_inputs=3, seed=0, mask=None
):
    cfg = DrafterConfig(num_layers=num_layers, block_size=block_size, attention=attention)
    rules = mask.per_layer(num_layers) if mask is not None else None
    cfg = cfg.resolved(target.model.config, num_fc_inputs, mask_token_id=258, layers=rules)
    torch.manual_seed(seed)
    drafter = DFlashDrafter(cfg).to(target.embed_tokens.weight.dtype)
    # A larger init than training's 0.02 so that untrained drafts vary and attention is not uniform.
    for p in drafter.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.3)
    return drafter.eval()


@pytest.fixture
def qwen3_target():
    return tiny_target("qwen3")


@pytest.fixture
def llama_target():
    return tiny_target("llama")


@pytest.fixture
def hybrid_target():
    """Qwen3.5-style hybrid: Gated-DeltaNet layers 0-2 and 4-6, full attention 3 and 7 (float32)."""
    return tiny_target("qwen3_5", num_layers=8)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The bad-input tables' valid tiny artefacts (tests/bad_input.py), built on first use per module."""
    from bad_input import Made

    return Made(tmp_path_factory.mktemp("made"))


def module_from_config(path: str, *overrides: str):
    """The DFlashModule a config builds (the arguments parsed as `fit` parses them), for tests that
    drive the LightningModule's own hooks; the commands that train nothing build a DrafterSetup."""
    from spec_drafters.cli.setup_args import lightning_classes, model_arguments, setup_parser

    parser = setup_parser()
    args = model_arguments(parser.instantiate(parser.parse_args(["--config", path, *overrides])).model)
    module_class, _ = lightning_classes()
    return module_class(**args)
