"""Running the command line in a test: a user error must be one line, and say what it should."""

from __future__ import annotations

from mopd.cli import main


def one_line_error(capsys, argv, *needles, progress: bool = False) -> str:
    """``mopd argv`` exits 2 with one error line naming each of ``needles`` and no traceback
    (the last line, after a build's progress lines, with ``progress``); returns that line."""
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "Traceback" not in err, err
    if progress:
        err = err.splitlines()[-1]
    assert err.startswith(f"mopd {argv[0]}: error: ") and "\n" not in err, err
    for n in needles:
        assert n in err, err
    return err
