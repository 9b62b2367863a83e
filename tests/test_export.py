"""Drafter folders: round trips through every layout, and parity with z-lab's own model code."""

import json

import pytest
import torch

from conftest import tiny_drafter, tiny_target
from spec_drafters.artefacts.folders import DrafterFolder, build_drafter, read_folder, write_folder
from spec_drafters.model.masks import SlidingWindowMask

FC = [1, 2, 3]


def folder_of(drafter, fc_ids=FC, layers=6) -> DrafterFolder:
    return DrafterFolder(drafter.config, fc_ids, layers, 259, drafter.state_dict(), {}, "memory", {})


def block_logits(target, drafter, ids, k):
    """One serving pass: context = all of ids, block [last token, MASK...] after it -> (K, V)."""
    s = ids.shape[1]
    taps = torch.cat([target(ids).taps[i] for i in FC], dim=-1)
    block = torch.full((1, k), 258)
    block[0, 0] = ids[0, -1]
    with torch.no_grad():
        ctx = drafter.encode_context(taps, torch.arange(s)[None])
        return target.head(drafter(target.embed(block), torch.arange(s, s + k)[None], ctx))[0]


@pytest.mark.parametrize("layout", ["spec_drafters", "zlab", "speculators"])
def test_round_trip_keeps_every_weight_and_the_layer_rules(tmp_path, layout):
    target = tiny_target(dtype="float64")
    drafter = tiny_drafter(target, block_size=4, mask=SlidingWindowMask(window=6, layers=[0]))
    write_folder(folder_of(drafter), tmp_path / layout, layout)
    back = read_folder(tmp_path / layout, num_target_layers=6)
    assert back.layout == layout and back.fc_ids == FC and back.num_target_layers == 6
    assert back.config.layer_types == ["sliding_attention", "full_attention"]
    assert back.config.sliding_window == 6 and back.config.block_size == 4
    rebuilt = build_drafter(back).double().eval()
    for key, value in drafter.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[key], value), key
    ids = torch.randint(0, 256, (1, 17), generator=torch.Generator().manual_seed(0))
    # z-lab and speculators folders do not say which kernel to use: they load with the default (sdpa).
    want = block_logits(target, drafter, ids, 4)
    torch.testing.assert_close(block_logits(target, rebuilt, ids, 4), want, rtol=1e-12, atol=1e-12)


def test_layouts_state_ids_in_their_own_conventions(tmp_path):
    target = tiny_target()
    drafter = tiny_drafter(target)
    write_folder(folder_of(drafter), tmp_path / "z", "zlab")
    write_folder(folder_of(drafter), tmp_path / "s", "speculators")
    z = json.loads((tmp_path / "z" / "config.json").read_text())
    s = json.loads((tmp_path / "s" / "config.json").read_text())
    assert z["dflash_config"]["target_layer_ids"] == [1, 2, 3] and z["num_target_layers"] == 6
    assert z["block_size"] == 4 and z["dflash_config"]["mask_token_id"] == 258
    assert z["dflash_config"]["block_size"] == 4  # where newer z-lab configs and readers look
    z["dflash_config"]["block_size"] = 8
    (tmp_path / "z" / "config.json").write_text(json.dumps(z))
    with pytest.raises(ValueError, match=r"block_size 4 and dflash_config\.block_size 8 disagree"):
        read_folder(tmp_path / "z")
    z["dflash_config"]["block_size"] = 4
    (tmp_path / "z" / "config.json").write_text(json.dumps(z))
    assert s["aux_hidden_state_layer_ids"] == [2, 3, 4]  # speculators count one higher
    assert (
        "embed_tokens.weight" not in read_folder(tmp_path / "z").state
    )  # the head and embedding are the target's
    with pytest.raises(ValueError, match="last layer"):
        write_folder(folder_of(drafter, fc_ids=[1, 3, 5]), tmp_path / "bad", "speculators")
    with pytest.raises(ValueError, match="target's depth"):
        read_folder(tmp_path / "s")  # speculators does not record the target's depth


def test_zlab_folder_gives_the_same_block_logits_as_zlab_model_code(tmp_path):
    """z-lab/dflash's DFlashDraftModel (PyPI ``dflash``) loads our export and computes the same block."""
    dflash_model = pytest.importorskip("dflash.model")
    from safetensors.torch import load_file
    from transformers import Qwen3Config

    target = tiny_target(dtype="float64", tap_ids=(1, 2, 3, 4))
    drafter = tiny_drafter(target, block_size=4)
    write_folder(folder_of(drafter), tmp_path, "zlab")
    config = Qwen3Config(**json.loads((tmp_path / "config.json").read_text()))
    config._attn_implementation = "eager"
    reference = dflash_model.DFlashDraftModel(config).double().eval()
    missing, unexpected = reference.load_state_dict(
        load_file(str(tmp_path / "model.safetensors")), strict=False
    )
    assert not unexpected and all("rotary" in k for k in missing)
    ids = torch.randint(0, 256, (1, 15), generator=torch.Generator().manual_seed(3))
    s, k = ids.shape[1], 4
    out = target(ids)
    taps = torch.cat([out.taps[i] for i in reference.target_layer_ids], dim=-1)  # z-lab's ids, ours
    block = torch.full((1, k), 258)
    block[0, 0] = ids[0, -1]
    with torch.no_grad():
        ref_hidden = reference(
            position_ids=torch.arange(s + k)[None], noise_embedding=target.embed(block), target_hidden=taps
        )
    ours = block_logits(target, drafter, ids, k)
    # HF computes RoPE's cos/sin in fp32 even for a float64 model, hence 1e-5 and not 1e-9.
    torch.testing.assert_close(target.head(ref_hidden)[0], ours, rtol=1e-5, atol=1e-5)
    # The check has teeth: feeding z-lab's model the taps one layer off (the speculators numbering
    # read as ours) moves the logits far more than that.
    shifted = torch.cat([out.taps[i + 1] for i in reference.target_layer_ids], dim=-1)
    with torch.no_grad():
        wrong = reference(
            position_ids=torch.arange(s + k)[None], noise_embedding=target.embed(block), target_hidden=shifted
        )
    assert (target.head(wrong)[0] - ours).abs().max() > 1e-2


def test_checkpoint_export_reimport_and_side_by_side_validation(tmp_path, capsys):
    """fit -> drafter folder (ExportDrafter) and z-lab export -> validate all of them on the same data."""
    from spec_drafters.cli.main import main
    from spec_drafters.cli.tools import diff

    tiny = ["--config", "tests/configs/tiny.yaml", "--trainer.logger", "false"]
    main(
        ["fit", *tiny, "--trainer.max_steps", "6", "--trainer.default_root_dir", str(tmp_path),
         "--trainer.callbacks+=ExportDrafter", "--trainer.callbacks.dirpath", str(tmp_path / "drafter"),
         "--results", str(tmp_path / "fit.json")]
    )  # fmt: skip
    ckpt = json.loads((tmp_path / "fit.json").read_text())["last_checkpoint"]
    ours = read_folder(tmp_path / "drafter")
    assert ours.layout == "spec_drafters" and ours.meta["components"]["injection"] == "all_taps"
    main(["export", ckpt, "--out", str(tmp_path / "zlab"), "--layout", "zlab"])
    zlab = read_folder(tmp_path / "zlab")
    for key, value in ours.state.items():
        assert torch.equal(zlab.state[key], value), key
    # Same architecture: only what a z-lab folder cannot say differs (components, target name, kernel).
    differ = {k for k, _, _ in diff(tmp_path / "drafter", tmp_path / "zlab")}
    others = sorted(
        k for k in differ if not k.startswith(("component.", "target.", "tapped_", "drafter.attention"))
    )
    assert differ and not others, others
    capsys.readouterr()
    main(["validate", *tiny, "--trainer.default_root_dir", str(tmp_path), "--results", str(tmp_path / "many"),
          "--drafters", ckpt, str(tmp_path / "zlab"), "untrained"])  # fmt: skip
    table = capsys.readouterr().out
    results = {p.stem: json.loads(p.read_text())["metrics"] for p in (tmp_path / "many").glob("*.json")}
    assert set(results) == {"last", "zlab", "untrained"} and "val/tau" in table
    # The checkpoint and its z-lab re-import are the same drafter: identical numbers on identical data.
    for key in ("val/loss", "val/acc", "val/tau"):
        assert results["last"][key] == pytest.approx(results["zlab"][key], rel=1e-6), key
    assert results["untrained"]["val/loss"] > results["last"]["val/loss"]
    main(["export", ckpt, "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16"])
    half = read_folder(tmp_path / "bf16")
    for key, value in ours.state.items():  # each weight cast once, nothing else changed
        assert half.state[key].dtype == torch.bfloat16 and torch.equal(half.state[key], value.bfloat16()), key
