"""Progress on stderr: shown on a terminal, never into a pipe or a file, never with --quiet."""

import io
import sys

import pytest

from hetsim.cli import main


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


SWEEP = ["sweep", "--waves", "4", "--vary", "seed=1,2", "--workers", "1"]


def test_a_sweep_shows_progress_on_a_terminal_and_not_with_quiet(tmp_path, monkeypatch, capsys):
    for quiet, shown in (([], True), (["--quiet"], False)):
        terminal = _Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main([*SWEEP, "--out", str(tmp_path), *quiet]) == 0
        assert ("sweep:" in terminal.getvalue() and "/2 " in terminal.getvalue()) is shown, terminal.getvalue()


def test_nothing_is_drawn_when_stderr_is_not_a_terminal(tmp_path, capsys):
    assert main([*SWEEP, "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["simulate", "sweep", "plan", "validate", "profile"])
def test_every_long_running_command_takes_quiet(command, capsys):
    assert main([command, "--help"]) == 0
    assert "--quiet" in capsys.readouterr().out
