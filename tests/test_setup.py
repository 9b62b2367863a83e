"""The built setup below Lightning (issue 34, item 1): the commands that train nothing build a
DrafterSetup from validate's arguments without LightningCLI, and it is the setup the LightningModule
wraps: the same description, settings, fc ids and, from a checkpoint, the same weights."""

import lightning.pytorch.cli
import pytest
import torch

from spec_drafters.artefacts.setup import DrafterSetup
from spec_drafters.cli.setup_args import load_setup

TINY = "tests/configs/tiny.yaml"
HYBRID = "tests/configs/tiny_hybrid.yaml"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny fit: (its checkpoint, the module that wrote it)."""
    from spec_drafters.cli.lightning_cli import SpecDraftersCLI
    from spec_drafters.cli.setup_args import lightning_classes

    root = tmp_path_factory.mktemp("setup")
    args = ["fit", "--config", TINY, "--trainer.max_steps", "2", "--trainer.logger", "false",
            "--trainer.default_root_dir", str(root), "--trainer.callbacks.dirpath", str(root),
            "--trainer.limit_val_batches", "0"]  # fmt: skip
    cli = SpecDraftersCLI(*lightning_classes(), args=args, parser_kwargs={"default_env": False})
    return root / "last.ckpt", cli


def test_no_lightning_cli_builds_a_setup(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("LightningCLI was built for a command that trains nothing")

    monkeypatch.setattr(lightning.pytorch.cli.LightningCLI, "__init__", refuse)
    setup = load_setup(["--config", TINY, "--trainer.accelerator", "cpu"], quiet=True)
    assert isinstance(setup, DrafterSetup) and setup.fc_ids == [1, 2, 3]


@pytest.mark.parametrize("config", [TINY, HYBRID])
def test_the_setup_is_the_one_the_module_wraps(config):
    from conftest import module_from_config

    setup = load_setup(["--config", config], quiet=True)
    module = module_from_config(config)
    assert module.built.describe() == setup.describe()
    assert dict(module.hparams) == setup.settings
    assert module.fc_ids == setup.fc_ids and module.card.name == setup.card.name
    # the module's attributes are the setup's parts, not copies
    assert module.drafter is module.built.drafter and module.loss_fn is module.built.loss_fn
    keys = {k.split(".")[0] for k in module.state_dict()} - {"target"}
    assert keys <= set(module.built.trained_modules())


def test_a_checkpoint_loads_into_the_setup_weight_for_weight(fitted):
    ckpt, _ = fitted
    setup = load_setup(["--config", TINY, "--ckpt_path", str(ckpt)], quiet=True)
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    drafter = {k[len("drafter.") :]: v for k, v in state.items() if k.startswith("drafter.")}
    assert drafter and drafter.keys() == setup.drafter.state_dict().keys()
    for key, value in setup.drafter.state_dict().items():
        assert torch.equal(value, drafter[key]), key


def test_a_checkpoint_missing_drafter_weights_is_refused_by_name(fitted, tmp_path):
    ckpt, _ = fitted
    saved = torch.load(ckpt, weights_only=True)
    del saved["state_dict"]["drafter.fc.weight"]
    torch.save(saved, tmp_path / "cut.ckpt")
    with pytest.raises(SystemExit, match=r"cut\.ckpt: lacks drafter tensors \['drafter\.fc\.weight'\]"):
        load_setup(["--config", TINY, "--ckpt_path", str(tmp_path / "cut.ckpt")], quiet=True)
    setup = load_setup(["--config", TINY], quiet=True)  # the setup's own check, for any caller
    with pytest.raises(KeyError, match=r"lacks drafter weights \['drafter\.fc\.weight'\]"):
        setup.load_checkpoint(saved)


def test_validation_blocks_are_the_setups_held_out_blocks(fitted):
    """calibrate reads the setup's held-out blocks; validation reads the module's: the same blocks."""
    from spec_drafters.data.records import collate

    ckpt, cli = fitted
    setup, data = load_setup(["--config", TINY, "--ckpt_path", str(ckpt)], quiet=True, with_data=True)
    module = cli.model.eval()
    _, val = data.examples(setup.tokenizer)
    batch = collate(val[:3])
    with torch.no_grad():
        _, per_block, labels, _, _ = module.held_out_blocks(batch, 0)
        inp = setup.held_out_inputs(batch, 0)
        mine, my_labels = setup.scored_blocks(inp, setup.step_builder().draft_hidden(inp))
    assert torch.equal(labels, my_labels) and labels.numel() > 0
    torch.testing.assert_close(per_block, mine)
