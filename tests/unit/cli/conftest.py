"""Run `trtpd` in-process and keep its exit status and what it printed."""

from __future__ import annotations

import pytest

from trtpd.cli.main import main


@pytest.fixture
def trtpd(capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return int(code or 0), out, err
    return run
