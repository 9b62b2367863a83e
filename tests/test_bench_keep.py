"""The long benchmarks keep what they measured where a later checkout finds it: a kept ablation row or
data_source stage is returned without running anything again, and a row trained with other configs is
refused rather than mixed into the table. Checked with stand-ins for the training commands."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def benchmarks():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import ablation
        import data_source

        yield ablation, data_source
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_a_kept_ablation_row_is_returned_without_training(benchmarks, tmp_path, monkeypatch):
    ablation, _ = benchmarks
    base = ablation.CONFIGS / "base.yaml"
    counts_a, counts_b = tmp_path / "a" / "counts.json", tmp_path / "b" / "counts.json"
    for counts in (counts_a, counts_b):
        counts.parent.mkdir()
        counts.write_text('{"1": 3}')
    extra = ["--model.draft_vocab.counts", str(counts_a)]
    calls = []
    monkeypatch.setattr(ablation, "spec_drafters", lambda *args, **kw: calls.append(args))
    keep = tmp_path / "keep"
    keep.mkdir()
    row = {"recipe": "v6", "seed": 0, "fit_s": 1.0, "val/tau": 2.0}
    sha = ablation.config_hash("v6", base, extra)
    (keep / "v6-s0.json").write_text(json.dumps({**row, "config_sha1": sha}))
    got = ablation.train("v6", 0, base, tmp_path / "out", 400, Path(), extra, keep=keep)
    assert got["val/tau"] == 2.0 and calls == []
    # the same counts at another path (another checkout) is the same run
    assert ablation.config_hash("v6", base, ["--model.draft_vocab.counts", str(counts_b)]) == sha
    counts_b.write_text('{"1": 4}')  # other counts: another run
    with pytest.raises(SystemExit, match="other configs"):
        ablation.train("v6", 0, base, tmp_path / "out", 400, Path(), [extra[0], str(counts_b)], keep=keep)
    (keep / "v5-s0.json").write_text(json.dumps({**row, "config_sha1": sha}))  # v6's configs
    with pytest.raises(SystemExit, match="other configs"):
        ablation.train("v5", 0, base, tmp_path / "out", 400, Path(), extra, keep=keep)


def test_an_unkept_ablation_run_trains_and_keeps_its_row(benchmarks, tmp_path, monkeypatch):
    ablation, _ = benchmarks
    base = ablation.CONFIGS / "base.yaml"

    def fake_fit(*args, **kw):  # writes the fit's results file as `spec-drafters fit --results` does
        result = Path(args[args.index("--results") + 1])
        result.write_text(json.dumps({"metrics": {"val/tau": 2.5, "val/tau_ddtree_b32": 3.0}}))

    monkeypatch.setattr(ablation, "spec_drafters", fake_fit)
    keep = tmp_path / "keep"
    keep.mkdir()
    row = ablation.train("v6", 1, base, tmp_path / "out", 400, tmp_path / "cache", [], keep=keep)
    kept = json.loads((keep / "v6-s1.json").read_text())
    assert row["val/tau"] == kept["val/tau"] == 2.5 and kept["steps"] == 400
    assert kept["config_sha1"] == ablation.config_hash("v6", base, [])
    monkeypatch.setattr(ablation, "spec_drafters", lambda *a, **k: pytest.fail("ran again"))
    assert ablation.train("v6", 1, base, tmp_path / "gone", 400, Path(), [], keep=keep)["val/tau"] == 2.5
    assert kept["fit_resumed"] is False and kept["fit_s"] >= 0


def test_a_resumed_ablation_run_continues_from_its_checkpoint_and_says_so(benchmarks, tmp_path, monkeypatch):
    ablation, _ = benchmarks
    base = ablation.CONFIGS / "base.yaml"
    calls = []

    def fake_fit(*args, **kw):
        calls.append(args)
        Path(args[args.index("--results") + 1]).write_text(json.dumps({"metrics": {"val/tau": 2.5}}))

    monkeypatch.setattr(ablation, "spec_drafters", fake_fit)
    last = tmp_path / "out" / "v6-s0" / "checkpoints" / "last.ckpt"  # an interrupted fit's checkpoint
    last.parent.mkdir(parents=True)
    last.write_bytes(b"")
    row = ablation.train("v6", 0, base, tmp_path / "out", 400, tmp_path / "cache", [])
    assert calls[0][calls[0].index("--ckpt_path") + 1] == str(last)
    assert row["fit_resumed"] is True  # its fit_s is the last process's only


def test_ablation_report_prints_the_kept_table_and_what_is_missing(benchmarks, tmp_path, monkeypatch, capsys):
    ablation, _ = benchmarks
    base = ablation.CONFIGS / "base.yaml"
    extra = ablation.records_flags(base, 400)  # no counts file: no draft-vocabulary flags
    keep = tmp_path / "keep"
    keep.mkdir()
    for recipe, seed, tau, tree in (("v6", 0, 1.5, 2.0), ("v6", 1, 1.7, 2.25), ("dspark", 0, 1.6, 2.5)):
        row = {"recipe": recipe, "seed": seed, "val/tau": tau, "val/tau_ddtree_b32": tree}
        row |= {"val/calibration_ece": 0.01, "val/acc_slot1": None}  # a metric a fit did not log: "-"
        sha = ablation.config_hash(recipe, base, extra)
        (keep / f"{recipe}-s{seed}.json").write_text(json.dumps({**row, "config_sha1": sha}))
    monkeypatch.setattr(ablation, "spec_drafters", lambda *a, **k: pytest.fail("trained"))
    monkeypatch.setattr(ablation, "record", lambda *a, **k: pytest.fail("recorded"))
    argv = ["ablation.py", "--report", "--keep", str(keep), "--counts", str(tmp_path / "none.json")]
    monkeypatch.setattr(sys, "argv", [*argv, "--only", "v6", "dspark", "lk_mix"])
    ablation.main()
    lines = capsys.readouterr().out.splitlines()
    # best DDTree-32 mean first; v6: means 1.6 / 2.125, spreads 0.2 / 0.25; dspark: one seed, spread 0
    assert lines[1].split()[:6] == ["dspark", "1", "1.6000", "±0.0000", "2.5000", "±0.0000"]
    assert lines[2].split()[:6] == ["v6", "2", "1.6000", "±0.2000", "2.1250", "±0.2500"]
    assert lines[1].split()[-2] == "-"  # slot 1
    assert lines[1].split()[-1] == "0.333"  # 2.5 above both of v6's seeds: 1 of 3 splits, p = 1/3
    assert lines[2].split()[-1] == "-"  # v6 against itself
    assert lines[-1].endswith("not run yet: dspark-s1 lk_mix-s0 lk_mix-s1")


def test_a_failed_ablation_run_does_not_stop_the_others(benchmarks, tmp_path, monkeypatch, capsys):
    """One fit failing (a checkpoint that would not load) once cancelled every run queued after it."""
    import subprocess

    ablation, _ = benchmarks

    def fake(*args, **kw):
        if args[0] == "cache":
            return Path(args[args.index("--out") + 1]).mkdir(parents=True, exist_ok=True)
        if any(a.endswith("dspark.yaml") for a in args):
            raise subprocess.CalledProcessError(2, "fit")
        Path(args[args.index("--results") + 1]).write_text(json.dumps({"metrics": {"val/tau": 2.5}}))

    monkeypatch.setattr(ablation, "spec_drafters", fake)
    monkeypatch.setattr(ablation, "record", lambda *a, **k: pytest.fail("recorded"))
    keep = tmp_path / "keep"
    argv = ["ablation.py", "--keep", str(keep), "--out", str(tmp_path / "out"), "--seeds", "0"]
    monkeypatch.setattr(sys, "argv", [*argv, "--counts", str(tmp_path / "none.json")])
    monkeypatch.setattr(ablation, "RECIPES", ["dspark", "v6", "lk_mix"])  # dspark first: the rest go on
    with pytest.raises(SystemExit, match=r"failed: dspark-s0; the others are kept"):
        ablation.main()
    assert sorted(p.name for p in keep.iterdir()) == ["lk_mix-s0.json", "v6-s0.json"]
    assert "dspark-s0 failed (exit 2)" in capsys.readouterr().err


def test_a_kept_data_source_stage_is_not_run_again(benchmarks, tmp_path):
    _, data_source = benchmarks
    runs = []
    fit = {"metrics": {"val/tau": 2.0}}
    first = data_source.stage(tmp_path, "answers.fit", lambda: runs.append(1) or dict(fit))
    again = data_source.stage(tmp_path, "answers.fit", lambda: runs.append(2) or {})
    assert runs == [1] and again == first and first["metrics"]["val/tau"] == 2.0
    assert first["seconds"] >= 0 and "git_sha" in first
