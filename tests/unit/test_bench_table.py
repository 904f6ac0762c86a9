"""`make bench`'s table: every row prints, whatever its baseline."""

from __future__ import annotations

import math

from bench.run import print_table


def test_a_row_whose_baseline_is_zero_or_absent_prints_without_a_ratio(capsys) -> None:
    # An idle baseline can measure 0 (idle workers use no CPU): the table printed
    # nothing after that row and the whole scale run failed with ZeroDivisionError.
    print_table(
        [
            ("workers' CPU per second, idle", 3.5, "ms", "idle, 64 procs", 0.0, ""),
            ("death reported", 80.0, "ms", "", math.nan, "<= 1000 ms"),
            ("call()", 100.0, "ms", "call() to 64", 8.0, "<= 50 ms"),
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines
    assert "0.0 (idle, 64 procs)" in lines[1] and lines[1].split()[-1] == "-", lines[1]
    assert lines[2].split()[-3:] == ["<=", "1000", "ms"], lines[2]
    assert lines[3].split()[-4:] == ["12.50", "<=", "50", "ms"], lines[3]
