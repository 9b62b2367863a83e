"""A component from another installed package is listed, selectable from YAML, and recorded.

tests/plugin_example/ is a separate package declaring the entry-point group
``spec_drafters.components``; it is pip-installed into a temporary folder and used from fresh
processes, exactly as a downstream project would be.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pip installs the plugin into a fresh site folder

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    src = tmp_path_factory.mktemp("src") / "plugin_example"  # pip builds in the source tree: copy it
    shutil.copytree(ROOT / "tests" / "plugin_example", src, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(src)],
        check=True, cwd=tmp_path_factory.getbasetemp(),
    )  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    return env


def spec_drafters(env, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "spec_drafters.cli.main", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_plugin_components_appear_in_the_registry(plugin_env):
    listing = json.loads(spec_drafters(plugin_env, "registry", "--json"))
    injection = {e["name"]: e for e in listing["injection"]}
    assert injection["deepest_taps"]["class_path"] == "spec_drafters_plugin_example.DeepestTaps"
    assert "keep: int = 2" in injection["deepest_taps"]["parameters"]
    assert "relative_uniform" in {e["name"] for e in listing["noise"]}
    assert "all_taps" in injection  # the built-ins are still there


def test_plugin_subclasses_train_from_yaml_and_are_recorded(plugin_env, tmp_path):
    cfg = tmp_path / "plugin.yaml"
    cfg.write_text(
        "model:\n"
        "  injection:\n"
        "    class_path: spec_drafters_plugin_example.DeepestTaps\n"
        "    init_args: {num_taps: 3, keep: 2}\n"
        "  noise:\n"
        "    class_path: RelativeUniformNoise\n"  # the class name alone works too
        "    init_args: {amplitude: 0.1}\n"
    )
    spec_drafters(
        plugin_env, "fit", "--config", "tests/configs/tiny.yaml", "--config", str(cfg),
        "--trainer.max_steps", "3", "--trainer.default_root_dir", str(tmp_path),
        "--results", str(tmp_path / "fit.json"),
    )  # fmt: skip
    desc = json.loads((tmp_path / "fit.json").read_text())["drafter"]
    assert desc["target"]["tap_ids"] == [1, 2, 3] and desc["fc_ids"] == [2, 3]  # the override took effect
    assert desc["components"]["injection"] == "deepest_taps"
    assert desc["components"]["noise"] == "relative_uniform"


def test_without_the_plugin_its_name_is_unknown(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "spec_drafters.cli.main", "fit", "--config", "tests/configs/tiny.yaml",
         "--model.injection", "DeepestTaps"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode != 0 and "unknown injection 'DeepestTaps'" in out.stderr
    assert "all_but_last (AllButLast)" in out.stderr
