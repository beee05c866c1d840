"""FedScale client_behave_trace -> fedflex trace CSV (fedflex.fedscale)."""

import json
import pickle

import numpy as np
import pytest

from fedflex.churn import TraceAvailability
from fedflex.fedscale import convert, main, read_fedscale, write_trace

# client 5: online 0-90 s and 250-400 s, repeating every 500 s; client 2: one instant (100 s)
TRACE = {
    5: {"duration": 500, "active": [0, 250], "inactive": [90, 400], "finish_time": 500, "model": "x"},
    2: {"duration": 500, "active": [100], "inactive": [100], "finish_time": 500, "model": "y"},
}


def test_intervals_map_to_the_rounds_whose_instant_they_cover():
    # Execute: 60 s per round, 10 rounds at instants 0, 60, ..., 540
    rows = convert(TRACE, seconds_per_round=60, rounds=10)

    # Assert: sorted ids 2 -> client 0, 5 -> client 1. Client 1: [0, 90] covers 0, 60 (rounds
    # 1-2); [250, 400] covers 300, 360 (rounds 6-7); the repeat [500, 590] covers 540 (round 10).
    # Client 0: 100 s and 600 s fall between instants: never online, no row.
    assert rows == [(1, 1, 3, "5"), (1, 6, 8, "5"), (1, 10, 11, "5")]


def test_without_repeat_the_trace_plays_once_and_offset_shifts_the_clock():
    # Execute: round 1 at 100 s, rounds at 100, 160, 220, ...
    once = convert(TRACE, seconds_per_round=60, rounds=10, repeat=False)
    shifted = convert(TRACE, seconds_per_round=60, rounds=3, offset=100, repeat=False)

    # Assert: no round 10 without the repeat; with the offset client 0's instant 100 s is round 1
    assert once == [(1, 1, 3, "5"), (1, 6, 8, "5")]
    assert shifted == [(0, 1, 2, "2")]


def test_converted_csv_is_read_as_a_trace_schedule(tmp_path):
    # Prepare
    path = tmp_path / "trace.csv"
    write_trace(convert(TRACE, 60, 10), path)

    # Execute
    schedule = TraceAvailability(path, num_clients=2)

    # Assert
    assert path.read_text().splitlines()[0] == "client,online_from,online_until,fedscale_id"
    assert [list(schedule.online(t)) for t in (1, 2, 3, 6, 10)] == [[1], [1], [], [1], [1]]


def test_num_clients_keeps_the_first_sorted_ids_and_is_bounded():
    assert convert(TRACE, 60, 10, num_clients=1) == []  # only id 2, never online
    with pytest.raises(ValueError, match="the trace has 2 clients"):
        convert(TRACE, 60, 10, num_clients=3)


def test_bad_entries_are_named():
    with pytest.raises(ValueError, match="client 7: needs a positive 'finish_time'"):
        convert({7: {"active": [0], "inactive": [5]}}, 60, 3)
    with pytest.raises(ValueError, match="client 7: needs 'active' and 'inactive' lists of the same length"):
        convert({7: {"active": [0, 9], "inactive": [5], "finish_time": 10}}, 60, 3)
    with pytest.raises(ValueError, match="seconds_per_round = 0"):
        convert(TRACE, 0, 3)


def test_extreme_clocks_give_round_ranges_not_an_overflow():
    # A 1e-300 s round puts 1.8e8 s at 1.8e308 rounds (infinity as a float): found by the fuzz test.
    trace = {0: {"active": [0], "inactive": [179769314.0], "finish_time": 1}}
    # Rounds 1..3 sit at instants 0, 1e-300, 2e-300: all inside [0, 1.8e8]
    assert convert(trace, 1e-300, 3, repeat=False) == [(0, 1, 4, "0")]
    # A 1e-320 s finish_time would repeat the interval infinitely often in 60 rounds of 60 s
    with pytest.raises(ValueError, match="repeats its 1 interval\\(s\\) inf times"):
        convert({0: {"active": [0], "inactive": [1], "finish_time": 1e-320}}, 60, 60)


def test_cli_converts_a_pickle_and_reports_a_bad_file_in_one_line(tmp_path, capsys):
    # Prepare
    pkl = tmp_path / "client_behave_trace"
    pkl.write_bytes(pickle.dumps(TRACE))
    (tmp_path / "t.json").write_text(json.dumps({str(k): v for k, v in TRACE.items()}))

    # Execute
    code = main([str(pkl), str(tmp_path / "out.csv"), "--seconds-per-round", "60", "--rounds", "10"])
    said = capsys.readouterr().out
    bad = main([str(tmp_path / "missing"), str(tmp_path / "x.csv"), "--seconds-per-round", "60", "--rounds", "3"])
    err = capsys.readouterr().err

    # Assert
    assert code == 0 and "3 intervals, 1 of 2 clients online in rounds 1..10" in said
    assert len(read_fedscale(tmp_path / "t.json")) == 2
    assert bad == 2 and err.strip().count("\n") == 0 and "no such file" in err
    rows = np.loadtxt(tmp_path / "out.csv", delimiter=",", skiprows=1, dtype=int)
    assert rows.tolist() == [[1, 1, 3, 5], [1, 6, 8, 5], [1, 10, 11, 5]]
