"""The layering contract (.importlinter, docs/architecture.md) holds, and it does catch a violation:
the same check on a copy of the package with one forbidden import added fails and names the rule."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint(src: Path) -> subprocess.CompletedProcess:
    """lint-imports over the package found under ``src`` (PYTHONPATH first, so a copy wins)."""
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [str(LINT), "--config", str(ROOT / ".importlinter"), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=src,
    )


def test_the_package_keeps_its_layers():
    out = lint(ROOT / "src")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("model/drafter.py", "import lightning.pytorch", "No lightning, jsonargparse or aim import below"),
        ("decode/verifiers.py", "import jsonargparse", "No lightning, jsonargparse or aim import below"),
        ("target/frozen.py", "from spec_drafters.train import anchors", "Layers import only downward"),
        ("registry.py", "from spec_drafters import errors", "The registry imports nothing"),
        ("data/corpus.py", "from spec_drafters.data import reference_corpus", "No import cycles"),
    ],
)
def test_a_forbidden_import_breaks_the_contract(tmp_path, module, line, contract):
    shutil.copytree(ROOT / "src" / "spec_drafters", tmp_path / "spec_drafters")
    file = tmp_path / "spec_drafters" / module
    file.write_text(file.read_text() + f"\n{line}  # noqa\n")  # at the end: after any __future__ import
    out = lint(tmp_path)
    assert out.returncode != 0
    broken = out.stdout.split("Broken contracts", 1)[-1]  # the section naming each broken contract
    assert contract in broken, out.stdout


def test_the_target_subpackage_is_seen_where_a_global_ignore_has_target(tmp_path):
    """Global ignore templates (PyBuilder, Rust, Maven) ignore ``target/``; the repository's .gitignore
    negates it for src/spec_drafters/target/, so git (and ruff, which reads the same files) still sees
    a new module there. Without the negation ``check-ignore`` says ignored (exit 0)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    excludes = tmp_path / "global_ignore"
    excludes.write_text("target/\n")
    check = ["git", "-c", f"core.excludesFile={excludes}", "check-ignore", "-q", "--no-index"]
    new = subprocess.run([*check, "src/spec_drafters/target/new_module.py"], cwd=ROOT)
    assert new.returncode == 1  # not ignored
    other = subprocess.run([*check, "elsewhere/target/x.py"], cwd=ROOT)
    assert other.returncode == 0  # the global rule itself still applies elsewhere
