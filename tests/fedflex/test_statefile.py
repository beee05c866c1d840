"""fedflex.statefile: server state in an .npz (arrays) + JSON (the rest), read without
unpickling anything."""

from __future__ import annotations

import json
import os
from collections import OrderedDict

import numpy as np
import pytest

from fedflex.statefile import STATE_ENTRY, StateFileError, read_state, write_state


class _RunsCode:
    """Unpickling it creates the folder ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_types_round_trip_exactly(tmp_path):
    # Prepare
    state = {
        "ints": {0: 1, 7: 2**100},  # int keys, a big int (Generator states)
        "__dunder": "kept",  # a key that looks like a tag
        "od": OrderedDict([("b", np.float32(1.5)), ("a", np.arange(3, dtype=np.int16))]),
        "pair": (np.bool_(True), None, -0.0, float("inf")),
        "list": [True, "x", 3.25],
    }
    # Execute
    write_state(tmp_path / "s.npz", state)
    back = read_state(tmp_path / "s.npz")
    # Assert
    assert back["ints"] == {0: 1, 7: 2**100}
    assert back["__dunder"] == "kept"
    assert type(back["od"]) is OrderedDict and list(back["od"]) == ["b", "a"]
    assert type(back["od"]["b"]) is np.float32 and back["od"]["b"] == 1.5
    assert back["od"]["a"].dtype == np.int16 and back["od"]["a"].tolist() == [0, 1, 2]
    assert back["pair"] == (np.bool_(True), None, -0.0, float("inf")) and isinstance(back["pair"], tuple)
    assert str(back["pair"][2]) == "-0.0"
    assert back["list"] == [True, "x", 3.25]


def test_the_rest_of_the_state_is_plain_json(tmp_path):
    write_state(tmp_path / "s.npz", {"round": 3, "w": np.zeros(2)})
    with np.load(tmp_path / "s.npz", allow_pickle=False) as npz:
        text = npz[STATE_ENTRY].tobytes().decode("utf-8")
    assert json.loads(text) == {"round": 3, "w": {"__ndarray__": "a0"}}


@pytest.mark.parametrize("value, where", [({1, 2}, r"state\['s'\]: a set"), (np.array([None]), r"state\['s'\]")])
def test_what_json_and_npz_cannot_hold_is_refused_when_written(tmp_path, value, where):
    with pytest.raises(TypeError, match=where):
        write_state(tmp_path / "s.npz", {"s": value})
    assert list(tmp_path.iterdir()) == []  # no file, no temporary left


def test_an_object_array_in_the_file_is_refused_without_unpickling(tmp_path):
    # Prepare: a crafted file whose array entry is a pickle that would create a folder
    marker = tmp_path / "ran"
    evil = np.empty(1, dtype=object)
    evil[0] = _RunsCode(marker)
    state = np.frombuffer(json.dumps({"x": {"__ndarray__": "a0"}}).encode(), dtype=np.uint8)
    np.savez(tmp_path / "s.npz", **{STATE_ENTRY: state, "a0": evil})
    # Execute / Assert
    with pytest.raises(StateFileError, match="is damaged"):
        read_state(tmp_path / "s.npz")
    assert not marker.exists()


def test_a_failed_write_leaves_the_earlier_file(tmp_path):
    # Prepare
    write_state(tmp_path / "s.npz", {"round": 1})
    # Execute: a state that cannot be written
    with pytest.raises(TypeError):
        write_state(tmp_path / "s.npz", {"round": 2, "bad": object()})
    # Assert
    assert read_state(tmp_path / "s.npz") == {"round": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["s.npz"]
