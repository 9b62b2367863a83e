"""The studies' tools (spec_drafters/studies): the one resume scheme (kept stages), the results lines
and the generated index of them, the runner, and the one timer."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spec_drafters.studies import index, results, runner
from spec_drafters.studies.stages import IdentityMismatch, Stages

ROOT = Path(__file__).resolve().parents[1]


def test_a_stage_runs_once_and_is_read_back_with_what_it_ran_on(tmp_path):
    calls = []

    def fit():
        calls.append(1)
        return {"val/tau": 1.5}

    stages = Stages(tmp_path / "keep")
    entry = stages.run("v6-s0", fit, identity={"steps": 400})
    assert entry["result"] == {"val/tau": 1.5} and entry["identity"] == {"steps": 400}
    assert entry["git_sha"] == results.git_sha() and entry["seconds"] >= 0 and entry["command"]
    again = Stages(tmp_path / "keep").run("v6-s0", fit, identity={"steps": 400})  # a rerun, a new process
    assert again == entry and calls == [1]
    assert stages.missing(["v6-s0", "v6-s1"]) == ["v6-s1"]
    assert not list((tmp_path / "keep").glob("*.tmp"))  # written through a renamed temporary file


def test_a_stage_kept_with_other_settings_is_refused_naming_them(tmp_path):
    stages = Stages(tmp_path)
    stages.run("fit", lambda: {"tau": 1.0}, identity={"steps": 400, "config_sha1": "a"})
    with pytest.raises(IdentityMismatch, match="differs in config_sha1"):
        stages.run("fit", lambda: {"tau": 2.0}, identity={"steps": 400, "config_sha1": "b"})
    assert stages.kept("fit")["result"] == {"tau": 1.0}  # nothing was overwritten


def test_a_failed_stage_keeps_nothing(tmp_path):
    stages = Stages(tmp_path)

    def killed():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stages.run("fit", killed)
    assert stages.kept("fit") is None and stages.missing(["fit"]) == ["fit"]


def test_a_folder_identity_is_written_once_and_checked_with_optional_keys(tmp_path):
    Stages(tmp_path, {"sha256": "x", "parts": 8, "config_content": ["c"]})
    Stages(tmp_path, {"sha256": "x", "parts": 8, "config_content": ["c"]})
    with pytest.raises(IdentityMismatch, match="differs in parts, sha256"):
        Stages(tmp_path, {"sha256": "y", "parts": 4, "config_content": ["c"]})
    (tmp_path / "identity.json").write_text(json.dumps({"sha256": "x", "parts": 8}))  # an older folder
    Stages(
        tmp_path, {"sha256": "x", "parts": 8, "config_content": ["c"]}, optional=frozenset({"config_content"})
    )
    with pytest.raises(IdentityMismatch, match="config_content"):
        Stages(tmp_path, {"sha256": "x", "parts": 8, "config_content": ["c"]})


def test_rows_kept_before_the_scheme_are_upgraded_with_their_values(tmp_path):
    row = {
        "recipe": "v6",
        "seed": 0,
        "val/tau": 1.57,
        "steps": 400,
        "git_sha": "c04ec6d",
        "config_sha1": "2ae",
    }
    (tmp_path / "v6-s0.json").write_text(json.dumps(row))
    stages = Stages(tmp_path)
    assert stages.upgrade_flat(("config_sha1", "steps")) == 1 and stages.upgrade_flat(("config_sha1",)) == 0
    entry = stages.kept("v6-s0", {"config_sha1": "2ae", "steps": 400})
    assert entry["result"] == {"recipe": "v6", "seed": 0, "val/tau": 1.57} and entry["git_sha"] == "c04ec6d"
    with pytest.raises(IdentityMismatch):
        stages.kept("v6-s0", {"config_sha1": "other", "steps": 400})


def test_a_legacy_decoding_folder_is_upgraded_in_place(tmp_path):
    from spec_drafters.studies.decoding_runs import folder_rows, upgrade_legacy_folder

    (tmp_path / "drafter.json").write_text(json.dumps({"parts": 1, "num_prompts": 1}))
    (tmp_path / "part-00-of-01.json").write_text(json.dumps({"metrics": {"decode/tau": 2.0}}))
    (tmp_path / "part-00-of-01.jsonl").write_text(json.dumps({"prompt": 0, "tau": 2.0}) + "\n")
    assert upgrade_legacy_folder(tmp_path) and not upgrade_legacy_folder(tmp_path)
    kept = json.loads((tmp_path / "part-00-of-01.json").read_text())
    assert kept["result"] == {"metrics": {"decode/tau": 2.0}} and kept["git_sha"] is None
    assert folder_rows(tmp_path) == [{"prompt": 0, "tau": 2.0, "piece": 0}]


def test_a_results_line_names_its_command_commit_and_machine(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "ddtree_build.py"), "--repeats", "3"])
    entry = results.record("toy", [{"a": 1}], {"ms": 2.5}, tmp_path / "results")
    line = json.loads((tmp_path / "results" / "toy.jsonl").read_text())
    assert line == entry and line["command"] == "python benchmarks/ddtree_build.py --repeats 3"
    assert (
        line["git_sha"] == results.git_sha(ROOT)
        and f"{len(os.sched_getaffinity(0))} cores" in line["machine"]
    )
    assert json.loads(capsys.readouterr().out.strip()) == {"ms": 2.5}


def test_the_index_marks_the_newest_line_of_each_setting_current(tmp_path):
    folder = tmp_path / "benchmarks" / "results"
    folder.mkdir(parents=True)
    lines = [
        {"benchmark": "h", "name": "a", "time": "1", "git_sha": "s1", "tau": 1.0},
        {"benchmark": "h", "name": "b", "time": "2", "git_sha": "s2", "command": "python x.py", "tau": 2.0},
        {
            "benchmark": "h",
            "name": "a",
            "time": "3",
            "git_sha": "s3",
            "uncommitted": ["src/x.py"],
            "tau": 3.0,
        },
    ]
    (folder / "h.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    got = index.entries(folder / "h.jsonl")
    assert [e["status"] for e in got] == ["superseded by line 3", "current", "current"]
    assert got[0]["command"] == "not recorded" and got[1]["command"] == "python x.py"
    page = index.render(tmp_path)
    assert "| benchmarks/results/h.jsonl:3 | a | current | 3 | s3+ |" in page and "tau=3" in page
    (tmp_path / "docs").mkdir()
    with pytest.raises(SystemExit, match="make results-index"):
        index.main(["--check", "--root", str(tmp_path)])
    index.main(["--root", str(tmp_path)])
    index.main(["--check", "--root", str(tmp_path)])


def test_the_committed_index_is_generated_from_the_committed_results():
    """docs/results.md must say what the results files say: a results line committed without
    `make results-index` fails here."""
    index.main(["--check"])


def test_the_runner_lists_the_studies_and_starts_one_niced_in_the_background(tmp_path, monkeypatch):
    listed = runner.studies()
    assert {"ablation", "data_source", "draft_vocab", "exam_gap", "tau_curve", "twins"} <= set(listed)
    assert "run" not in listed and all(listed.values())
    study = tmp_path / "experiments"
    study.mkdir()
    (study / "toy.py").write_text(
        '"""A toy study."""\nimport os, sys\nprint("niceness", os.nice(0), sys.argv[1:])\n'
    )
    monkeypatch.setattr(runner, "STUDIES", study)
    record = runner.start("toy", ["--steps", "3"], dirty=True, runs=tmp_path / "runs")
    assert record["git_sha"] == results.git_sha(ROOT) and "--steps 3" in record["command"]
    for _ in range(100):
        (state,) = runner.status(tmp_path / "runs")
        if not state["running"]:
            break
        time.sleep(0.1)
    log = (tmp_path / "runs" / "toy.log").read_text()
    assert log.startswith(f"# {record['started']} commit {record['git_sha']}")
    assert "niceness 5 ['--steps', '3']" in log or f"niceness {os.nice(0) + 5}" in log
    with pytest.raises(SystemExit, match="no study 'nope'"):
        runner.start("nope", [], dirty=True, runs=tmp_path / "runs")


def test_the_timer_imports_with_nothing_but_the_standard_library():
    """benchmarks/peer_speculators.py imports spec_drafters.clock inside speculators' own venv."""
    code = "import sys; sys.path.insert(0, 'src'); from spec_drafters.clock import median_seconds; "
    code += "print(median_seconds(lambda: None, 3), sorted(m for m in sys.modules if m.startswith('spec')))"
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 1)[1].strip() == "['spec_drafters', 'spec_drafters.clock']"
