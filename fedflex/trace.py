"""Churn traces: CSV files of online intervals (FedScale-style), read and checked.

Read by :class:`fedflex.churn.TraceAvailability`, and by :func:`fedflex.loader.load_scenario`
so that a bad trace fails at load, naming its file and line.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

import numpy as np

TRACE_COLUMNS = ("client", "online_from", "online_until")
FOREVER = int(np.iinfo(np.int64).max)  # an empty online_until


def _error(path: Path, line: int, problem: str) -> ValueError:
    return ValueError(f"trace {path}, line {line}: {problem}")


def read_trace(path: "str | Path", num_clients: int) -> tuple[list[int], list[int], list[int]]:
    """Return the intervals of a trace file as ``(clients, online_from, online_until)`` lists
    (see :class:`fedflex.churn.TraceAvailability` for the format).

    Raises
    ------
    ValueError
        Naming the file, the line and the problem.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace {path}: no such file")
    clients: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise _error(path, 1, "empty file; expected the header " + ",".join(TRACE_COLUMNS))
            names = [h.strip() for h in header]
            missing = [c for c in TRACE_COLUMNS if c not in names]
            if missing:
                raise _error(
                    path,
                    reader.line_num,
                    f"missing column {', '.join(missing)} (header is {','.join(names)!r}; "
                    f"expected {','.join(TRACE_COLUMNS)})",
                )
            col = {c: names.index(c) for c in TRACE_COLUMNS}
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                c, start, end = _parse_row(path, num_clients, reader.line_num, row, col)
                clients.append(c)
                starts.append(start)
                ends.append(end)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"trace {path}: cannot be read ({exc})") from None
    return clients, starts, ends


def _parse_row(path: Path, num_clients: int, line: int, row: list[str], col: dict[str, int]) -> tuple[int, int, int]:
    client = _cell(path, line, row, col, "client")
    start = _cell(path, line, row, col, "online_from")
    end = _cell(path, line, row, col, "online_until", empty=FOREVER)
    if not 0 <= client < num_clients:
        raise _error(path, line, f"unknown client id {client} (ids are 0..{num_clients - 1})")
    if start < 0:
        raise _error(path, line, f"online_from = {start} is negative")
    if start >= end:
        raise _error(path, line, f"online_from = {start} >= online_until = {end}")
    return client, start, end


def _cell(path: Path, line: int, row: list[str], col: dict[str, int], name: str, empty: Optional[int] = None) -> int:
    """Return the integer in column ``name``; ``empty`` (when given) stands for a blank cell."""
    if col[name] >= len(row):
        raise _error(path, line, f"missing value for column {name}")
    text = row[col[name]].strip()
    if not text:
        if empty is not None:
            return empty
        raise _error(path, line, f"{name} is empty; expected an integer")
    try:
        value = int(text)
    except ValueError:
        raise _error(path, line, f"{name} = {text!r} is not an integer") from None
    if not -FOREVER - 1 <= value <= FOREVER:  # the rounds are int64 (fedflex.churn.TraceAvailability)
        raise _error(path, line, f"{name} = {text} is out of range (at most {FOREVER}; empty online_until: forever)")
    return value
