"""CLIENTS-1: which clients get displays updated in place, judged from the
``execute_request`` each sends (the requests below are the ones each client's
installed source makes: JupyterLab's ``CodeCell.execute`` names the cell in its
metadata, nbclient sets ``allow_stdin`` false, ``jupyter console`` sends
``jupyter_client``'s defaults); a console's ``%%mesh`` cell gets ``order``'s stream."""

from __future__ import annotations

from typing import Any

from jupyter_client.session import Session

from monarch_kernel.kernel._cells import BLOCKS_UP_TO, output_mode
from monarch_kernel.kernel._clients import updates_in_place


def _request(allow_stdin: bool, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    content = {
        "code": "%%mesh\nprint(1)",
        "silent": False,
        "store_history": True,
        "user_expressions": {},
        "allow_stdin": allow_stdin,
        "stop_on_error": True,
    }
    return Session().msg("execute_request", content, metadata=metadata)


def test_jupyterlab_which_names_the_cell_gets_displays_updated_in_place():
    lab = _request(True, {"cellId": "5c1d0b2e", "deletedCells": [], "recordTiming": False})
    assert updates_in_place(lab)


def test_nbclient_which_takes_no_input_gets_displays_updated_in_place():
    assert updates_in_place(_request(False))


def test_jupyter_console_which_sends_neither_gets_each_output_once():
    assert not updates_in_place(_request(True))
    assert not updates_in_place(_request(True, {"cellId": ""}))


def test_without_a_request_to_judge_the_live_view_stays():
    assert updates_in_place(None) and updates_in_place({})


def test_a_console_gets_one_block_per_rank_as_one_stream_and_merged_lines_once():
    assert output_mode("auto", 2, live=True) == "rank"
    assert output_mode("auto", 2, live=False) == "order"
    assert output_mode("rank", 2, live=False) == "order"
    assert output_mode("auto", BLOCKS_UP_TO + 1, live=False) == "merge"
    assert output_mode("order", 2, live=True) == "order"
