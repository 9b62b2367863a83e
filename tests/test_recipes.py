"""The studies keep what they measured where a later checkout finds it (spec_drafters/studies/recipes.py,
run by experiments/ablation.py and draft_vocab.py; stages.py): a kept recipe row or data_source stage is
returned without running anything again, and a row trained with other configs is refused rather than
mixed into the table. Checked with stand-ins for the training commands."""

import argparse
import json
from pathlib import Path

import pytest

from spec_drafters.studies import recipes as ablation
from spec_drafters.studies import runner
from spec_drafters.studies.stages import Stages


def study_args(tmp_path: Path, **kw) -> argparse.Namespace:
    """experiments/ablation.py's arguments, its defaults but for the folders."""
    base = {
        "steps": 400, "seeds": [0, 1], "only": None, "base": ablation.CONFIGS / "base.yaml",
        "out": tmp_path / "out", "keep": None, "counts": tmp_path / "none.json", "workers": 2,
        "threads": 1, "report": False, "record": False, "extra": [],
    }  # fmt: skip
    return argparse.Namespace(**(base | kw))


def fail(what: str):
    return lambda *a, **k: pytest.fail(what)


def test_a_kept_ablation_row_is_returned_without_training(tmp_path, monkeypatch):
    base = ablation.CONFIGS / "base.yaml"
    counts_a, counts_b = tmp_path / "a" / "counts.json", tmp_path / "b" / "counts.json"
    for counts in (counts_a, counts_b):
        counts.parent.mkdir()
        counts.write_text('{"1": 3}')
    extra = ["--model.draft_vocab.counts", str(counts_a)]
    calls = []
    monkeypatch.setattr(runner, "run_cli", lambda *args, **kw: calls.append(args))
    keep = tmp_path / "keep"
    keep.mkdir()
    row = {"recipe": "v6", "seed": 0, "fit_s": 1.0, "val/tau": 2.0}
    sha = ablation.config_hash("v6", base, extra)
    (keep / "v6-s0.json").write_text(json.dumps({**row, "config_sha1": sha, "steps": 400}))  # before stages
    got = ablation.train("v6", 0, base, tmp_path / "out", 400, Path(), extra, keep=keep)
    assert got["val/tau"] == 2.0 and calls == []
    # the same counts at another path (another checkout) is the same run
    assert ablation.config_hash("v6", base, ["--model.draft_vocab.counts", str(counts_b)]) == sha
    counts_b.write_text('{"1": 4}')  # other counts: another run
    with pytest.raises(SystemExit, match="differs in config_sha1"):
        ablation.train("v6", 0, base, tmp_path / "out", 400, Path(), [extra[0], str(counts_b)], keep=keep)
    (keep / "v5-s0.json").write_text(json.dumps({**row, "config_sha1": sha, "steps": 400}))  # v6's configs
    with pytest.raises(SystemExit, match="differs in config_sha1"):
        ablation.train("v5", 0, base, tmp_path / "out", 400, Path(), extra, keep=keep)


def test_an_unkept_ablation_run_trains_and_keeps_its_row(tmp_path, monkeypatch):
    base = ablation.CONFIGS / "base.yaml"

    def fake_fit(*args, **kw):  # writes the fit's results file as `spec-drafters fit --results` does
        result = Path(args[args.index("--results") + 1])
        result.write_text(json.dumps({"metrics": {"val/tau": 2.5, "val/tau_ddtree_b32": 3.0}}))

    monkeypatch.setattr(runner, "run_cli", fake_fit)
    keep = tmp_path / "keep"
    keep.mkdir()
    row = ablation.train("v6", 1, base, tmp_path / "out", 400, tmp_path / "cache", [], keep=keep)
    kept = json.loads((keep / "v6-s1.json").read_text())
    assert row["val/tau"] == kept["result"]["val/tau"] == 2.5 and kept["identity"]["steps"] == 400
    assert kept["identity"]["config_sha1"] == ablation.config_hash("v6", base, [])
    monkeypatch.setattr(runner, "run_cli", lambda *a, **k: pytest.fail("ran again"))
    assert ablation.train("v6", 1, base, tmp_path / "gone", 400, Path(), [], keep=keep)["val/tau"] == 2.5
    assert kept["result"]["fit_resumed"] is False and kept["result"]["fit_s"] >= 0


def test_a_resumed_ablation_run_continues_from_its_checkpoint_and_says_so(tmp_path, monkeypatch):
    base = ablation.CONFIGS / "base.yaml"
    calls = []

    def fake_fit(*args, **kw):
        calls.append(args)
        Path(args[args.index("--results") + 1]).write_text(json.dumps({"metrics": {"val/tau": 2.5}}))

    monkeypatch.setattr(runner, "run_cli", fake_fit)
    last = tmp_path / "out" / "v6-s0" / "checkpoints" / "last.ckpt"  # an interrupted fit's checkpoint
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    row = ablation.train("v6", 0, base, tmp_path / "out", 400, tmp_path / "cache", [])
    assert calls[0][calls[0].index("--ckpt_path") + 1] == str(last)
    assert row["fit_resumed"] is True  # its fit_s is the last process's only


def test_ablation_report_prints_the_kept_table_and_what_is_missing(tmp_path, monkeypatch, capsys):
    base = ablation.CONFIGS / "base.yaml"
    extra = ablation.records_flags(base, 400)  # no counts file: no draft-vocabulary flags
    keep = tmp_path / "keep"
    keep.mkdir()
    for recipe, seed, tau, tree in (("v6", 0, 1.5, 2.0), ("v6", 1, 1.7, 2.25), ("dspark", 0, 1.6, 2.5)):
        row = {"recipe": recipe, "seed": seed, "val/tau": tau, "val/tau_ddtree_b32": tree}
        row |= {"val/calibration_ece": 0.01, "val/acc_slot1": None}  # a metric a fit did not log: "-"
        sha = ablation.config_hash(recipe, base, extra)
        (keep / f"{recipe}-s{seed}.json").write_text(json.dumps({**row, "config_sha1": sha, "steps": 400}))
    monkeypatch.setattr(runner, "run_cli", fail("trained"))
    ablation.study(
        study_args(tmp_path, report=True, keep=keep, only=["v6", "dspark", "lk_mix"]), fail("recorded")
    )
    lines = capsys.readouterr().out.splitlines()
    # best DDTree-32 mean first; v6: means 1.6 / 2.125, spreads 0.2 / 0.25; dspark: one seed, spread 0
    assert lines[1].split()[:6] == ["dspark", "1", "1.6000", "±0.0000", "2.5000", "±0.0000"]
    assert lines[2].split()[:6] == ["v6", "2", "1.6000", "±0.2000", "2.1250", "±0.2500"]
    assert lines[1].split()[-2] == "-"  # slot 1
    assert lines[1].split()[-1] == "0.333"  # 2.5 above both of v6's seeds: 1 of 3 splits, p = 1/3
    assert lines[2].split()[-1] == "-"  # v6 against itself
    assert lines[-1].endswith("not run yet: dspark-s1 lk_mix-s0 lk_mix-s1")


def test_a_failed_ablation_run_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    """One fit failing (a checkpoint that would not load) once cancelled every run queued after it."""
    import subprocess

    def fake(*args, **kw):
        if args[0] == "cache":
            return Path(args[args.index("--out") + 1]).mkdir(parents=True, exist_ok=True)
        if any(a.endswith("dspark.yaml") for a in args):
            raise subprocess.CalledProcessError(2, "fit")
        Path(args[args.index("--results") + 1]).write_text(json.dumps({"metrics": {"val/tau": 2.5}}))

    monkeypatch.setattr(runner, "run_cli", fake)
    keep = tmp_path / "keep"
    monkeypatch.setattr(ablation, "RECIPES", ["dspark", "v6", "lk_mix"])  # dspark first: the rest go on
    with pytest.raises(SystemExit, match=r"failed: dspark-s0; the others are kept"):
        ablation.study(study_args(tmp_path, keep=keep, seeds=[0]), fail("recorded"))
    assert sorted(p.name for p in keep.iterdir()) == ["lk_mix-s0.json", "v6-s0.json"]
    assert "dspark-s0 failed (exit 2)" in capsys.readouterr().err


def test_a_kept_data_source_stage_is_not_run_again(tmp_path):
    """experiments/data_source.py keeps each stage (a cache build, a fit) in the one scheme; a stage it
    kept before the scheme (one flat dict) is read back, not run again, its wall time kept."""
    legacy = {"threads": 1, "metrics": {"val/tau": 2.0}, "seconds": 812.5, "git_sha": "51cabdc"}
    (tmp_path / "answers.fit.json").write_text(json.dumps(legacy))
    stages = Stages(tmp_path)
    assert stages.upgrade_flat() == 1
    entry = stages.run("answers.fit", fail("ran again"))
    assert entry["result"] == {"threads": 1, "metrics": {"val/tau": 2.0}} and entry["seconds"] == 812.5
    runs = []
    first = stages.run("source.fit", lambda: runs.append(1) or {"metrics": {"val/tau": 1.5}})
    again = stages.run("source.fit", lambda: runs.append(2) or {})
    assert runs == [1] and again == first and first["git_sha"] and first["seconds"] >= 0
