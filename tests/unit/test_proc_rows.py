"""A mesh's procs as text and HTML (``mesh/_proc_rows.py``): a line per proc for a
small mesh; from 33 procs on a summary, and a line per proc that is not alive."""

from __future__ import annotations

from monarch_kernel.mesh._proc_rows import ProcRow, html_table, states_count, status_text, text_lines


def _rows(n: int, dead: tuple[int, ...] = ()) -> list[ProcRow]:
    return [
        ProcRow(
            rank=r,
            state="dead" if r in dead else "alive",
            pid=1000 + r,
            host=f"h{r // 16 + 1}",
            error="killed by SIGKILL" if r in dead else "",
        )
        for r in range(n)
    ]


def test_a_small_mesh_is_a_line_per_proc():
    lines = text_lines(_rows(2, dead=(1,)))
    assert lines == [
        "  rank 0: alive        pid 1000  restarts 0  h1",
        "  rank 1: dead         pid 1001  restarts 0  h1  (killed by SIGKILL)",
    ]
    assert html_table(_rows(2)).count("<tr>") == 3


def test_1024_procs_are_a_summary_and_the_ones_not_alive():
    lines = text_lines(_rows(1024, dead=(513, 700)))
    assert lines == [
        "  1,024 procs on 64 hosts: 1,022 alive, 2 dead",
        "  alive        ranks 0-512, 514-699, 701-1023",
        "  dead         ranks 513, 700",
        "  rank 513: dead         pid 1513  restarts 0  h33  (killed by SIGKILL)",
        "  rank 700: dead         pid 1700  restarts 0  h44  (killed by SIGKILL)",
    ]
    table = html_table(_rows(1024, dead=(513,)))
    assert table.count("<tr>") == 2 and "1,024 procs on 64 hosts: 1,023 alive, 1 dead" in table
    assert "ranks 0-512, 514-1023" in table
    assert html_table(_rows(1024)).count("<tr>") == 0  # all alive: the summary alone


def test_many_procs_not_alive_are_listed_up_to_a_bound():
    lines = text_lines(_rows(1024, dead=tuple(range(100))))
    assert lines[-1] == "  ... and 68 more procs that are not alive"
    assert len(lines) == 3 + 32 + 1


def test_states_are_counted_in_the_order_met():
    assert states_count(["alive", "alive", "dead", "alive"]) == "4 procs: 3 alive, 1 dead"


def test_status_counts_the_procs_once():
    # `%mesh status`: the title says how many procs, unless the summary under it does
    # ("128 procs:" then "128 procs on 16 hosts: 128 alive" said it twice).
    small = status_text("mesh 'm' (epoch 2)", _rows(2)).splitlines()
    assert small[0] == "mesh 'm' (epoch 2), 2 procs:"
    assert len(small) == 3
    big = status_text("mesh 'm' (epoch 2)", _rows(128)).splitlines()
    assert big[:2] == ["mesh 'm' (epoch 2):", "  128 procs on 8 hosts: 128 alive"]
    assert sum("128 procs" in line for line in big) == 1
