"""``export`` overwrites nothing it was not asked to: a user's folder, its own source, a shipped
registry drafter; with ``--force`` it replaces exactly the drafter files an earlier export or
calibration wrote (any layout), keeps the rest, and writes files whose mode follows the umask."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spec_drafters.artefacts.folders import read_folder, write_folder
from spec_drafters.cli.main import main


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(argv: list[str], fragment: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert fragment in str(exited.value.code), exited.value.code


def test_a_users_folder_is_left_byte_for_byte_without_force(made, tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "config.json").write_text('{"my": "own config"}\n')
    before = snapshot(user)
    refused(["export", str(made.drafter), "--out", str(user)], "not empty (config.json); pass --force")
    assert snapshot(user) == before


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("layout", ["spec_drafters", "zlab"])
def test_export_onto_its_own_source_changes_nothing(made, tmp_path, force, layout):
    source = shutil.copytree(made.drafter, tmp_path / "drafter")
    (source / "calibration.json").write_text('{"slot_temperatures": [1.0, 1.0, 1.0]}\n')
    before = snapshot(source)
    refused(["export", str(source), "--out", str(source), "--layout", layout, *force], "is the source")
    refused(["export", str(source), "--out", str(tmp_path), *force], "holds the source")
    refused(["export", str(source), "--out", str(source / "sub"), *force], "is inside the source")
    # the same folder by another spelling: resolved paths are compared
    refused(["export", str(source), "--out", f"{tmp_path}/x/../drafter", *force], "is the source")
    assert snapshot(source) == before and not (source / "sub").exists()


def test_a_registry_drafter_takes_force_and_overwrite_registry(made, tmp_path, capsys):
    shipped = shutil.copytree("registry/drafters/smollm2-reference", tmp_path / "registry/drafters/ref")
    before = snapshot(shipped)
    for extra in ([], ["--force"], ["--overwrite_registry"]):
        refused(["export", str(made.drafter), "--out", str(shipped), *extra], "--force --overwrite_registry")
        assert snapshot(shipped) == before
    main(["export", str(made.drafter), "--out", str(shipped), "--force", "--overwrite_registry"])
    assert (shipped / "README.md").read_bytes() == before["README.md"]  # not export's: kept
    now, want = load_file(shipped / "model.safetensors"), load_file(made.drafter / "model.safetensors")
    assert now.keys() == want.keys() and all(torch.equal(now[k], want[k]) for k in want)
    assert "kept in" in capsys.readouterr().out
    # a new drafter in a registry (an empty or new folder) needs no flag
    main(["export", str(made.drafter), "--out", str(tmp_path / "registry/drafters/new")])


def test_the_repositorys_registry_is_refused_and_untouched(made):
    shipped = Path("registry/drafters/smollm2-reference")
    before = snapshot(shipped)
    refused(["export", str(made.drafter), "--out", str(shipped), "--force"], "--force --overwrite_registry")
    assert snapshot(shipped) == before
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", str(shipped)], capture_output=True, text=True
    )
    assert status.returncode == 0 and status.stdout == ""


def test_force_replaces_the_files_of_an_earlier_export_in_another_layout(made, tmp_path):
    out = tmp_path / "out"
    main(["export", str(made.checkpoint), "--out", str(out)])  # spec_drafters layout
    (out / "calibration.json").write_text('{"slot_temperatures": [2.0, 2.0, 2.0]}\n')  # as calibrate writes
    (out / "notes.txt").write_text("mine\n")
    refused(["export", str(made.checkpoint), "--out", str(out), "--layout", "zlab"], "pass --force")
    main(["export", str(made.checkpoint), "--out", str(out), "--layout", "zlab", "--force"])
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "notes.txt"]
    assert "spec_drafters" not in json.loads((out / "config.json").read_text())  # the zlab layout's
    assert (out / "notes.txt").read_text() == "mine\n"


def test_a_layout_that_cannot_hold_the_drafter_removes_nothing(made, tmp_path):
    vocab = read_folder(made.drafter)  # the tiny drafter, given a draft vocabulary z-lab cannot hold
    vocab.config = replace(vocab.config, draft_vocab_size=16)
    vocab.state["draft_ids"] = torch.arange(16) * 3
    source = write_folder(vocab, tmp_path / "vocab")
    out = tmp_path / "out"
    main(["export", str(made.drafter), "--out", str(out)])
    before = snapshot(out)
    with pytest.raises(SystemExit) as exited:
        main(["export", str(source), "--out", str(out), "--layout", "zlab", "--force"])
    message = str(exited.value.code)
    assert message.startswith("spec-drafters: error: --layout zlab: the z-lab layout has no draft"), message
    assert snapshot(out) == before


def test_exported_files_follow_the_umask_and_a_calibration_goes_along(made, tmp_path):
    source = shutil.copytree(made.drafter, tmp_path / "drafter")
    (source / "calibration.json").write_text('{"slot_temperatures": [1.5, 1.5, 1.5]}\n')
    old = os.umask(0o022)
    try:
        main(["export", str(source), "--out", str(tmp_path / "a"), "--layout", "zlab"])
        main(["export", str(made.checkpoint), "--out", str(tmp_path / "b"), "--dtype", "bfloat16"])
    finally:
        os.umask(old)
    assert (tmp_path / "a/calibration.json").read_bytes() == (source / "calibration.json").read_bytes()
    for name in ("a/config.json", "a/model.safetensors", "a/calibration.json", "b/model.safetensors"):
        assert oct((tmp_path / name).stat().st_mode & 0o777) == oct(0o644), name
