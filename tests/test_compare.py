"""compare and diff label their columns by the shortest distinguishing path, so two files with the same
name are two columns (not one run silently dropped), and a legend line says which file each is."""

import json
from pathlib import Path

from conftest import tiny_drafter, tiny_target
from spec_drafters.artefacts.diff import distinct_labels
from spec_drafters.artefacts.folders import DrafterFolder, write_folder
from spec_drafters.cli.main import main


def test_labels_are_the_shortest_distinguishing_tails():
    assert distinct_labels([Path("runs/a/fit"), Path("runs/b/fit")]) == ["a/fit", "b/fit"]
    assert distinct_labels([Path("x/untrained"), Path("y/last")]) == ["untrained", "last"]
    assert distinct_labels([Path("fit"), Path("a/fit")]) == ["fit", "a/fit"]
    assert distinct_labels([Path("a/s/fit"), Path("b/s/fit"), Path("b/t/fit")]) == [
        "a/s/fit",
        "b/s/fit",
        "t/fit",
    ]
    assert distinct_labels([Path("r/fit"), Path("r/fit")]) == ["fit", "fit#2"]  # the same file twice
    assert distinct_labels([Path("/r/fit"), Path("r/fit")]) == ["/r/fit", "r/fit"]  # no tail differs


def test_compare_keeps_both_runs_of_the_same_file_name(tmp_path, capsys):
    paths = []
    for run, tau in (("a", 1.5), ("b", 2.5)):
        path = tmp_path / run / "fit.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"metrics": {"val/tau": tau}}))
        paths.append(str(path))
    main(["compare", *paths])
    header, row, legend = capsys.readouterr().out.splitlines()
    assert header.split() == ["metric", "a/fit", "b/fit"]
    assert row.split() == ["val/tau", "1.5000", "2.5000"]
    assert legend == f"columns: a/fit = {paths[0]}, b/fit = {paths[1]}"


def test_diff_labels_two_folders_of_the_same_name_apart(tmp_path, capsys):
    target = tiny_target()
    for run, k in (("a", 4), ("b", 8)):
        drafter = tiny_drafter(target, block_size=k)
        folder = DrafterFolder(drafter.config, [1, 2, 3], 6, 259, drafter.state_dict(), {}, "memory", {})
        write_folder(folder, tmp_path / run / "drafter")
    a, b = str(tmp_path / "a" / "drafter"), str(tmp_path / "b" / "drafter")
    main(["diff", a, b])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["choice", "a/drafter", "b/drafter"]
    assert "drafter.block_size" in lines[1] and lines[1].split()[1:] == ["4", "8"]
    assert lines[-1] == f"columns: a/drafter = {a}, b/drafter = {b}"
