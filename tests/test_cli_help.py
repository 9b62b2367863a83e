"""A CLI a person can discover: ``spec-drafters --help`` lists every command with one line, and
``spec-drafters COMMAND --help`` prints its usage and exits 0 for every command, the ones added later
included (the list comes from the dispatcher's table)."""

from __future__ import annotations

import pytest

from spec_drafters.cli.main import COMMANDS, main

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")

EVERY_COMMAND = sorted({*COMMANDS, "fit", "validate"})


@pytest.mark.parametrize("command", EVERY_COMMAND)
def test_every_command_prints_its_usage_and_exits_0(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code in (0, None), (exited.value.code, out)
    assert "usage:" in out and command in out, out


def test_the_top_level_help_lists_every_command_with_a_line_each(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(lines) == set(EVERY_COMMAND), out
    assert all(len(line.split()) > 2 for line in lines.values()), out  # the name and what it does
    assert out.startswith("usage: spec-drafters COMMAND")


def test_an_unknown_command_is_named_with_the_valid_ones():
    with pytest.raises(SystemExit) as exited:
        main(["inpsect", "x"])
    assert "unknown command 'inpsect'" in str(exited.value.code) and "inspect" in str(exited.value.code)
