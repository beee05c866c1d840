"""FedScale's device files: availability traces -> fedflex's trace CSV (:mod:`fedflex.trace`),
and device-capacity profiles for the system model (``system.kind: fedscale``).

FedScale (Lai et al., "FedScale: Benchmarking Model and System Performance of Federated
Learning at Scale", ICML 2022) ships ``client_behave_trace``: a pickled dict from a client
id to that client's behaviour, documented in FedScale's "Device Trace File Formats" as::

    {'duration': INT, 'inactive': [INT], 'finish_time': INT, 'active': [INT], 'model': STRING}

``active[i]`` and ``inactive[i]`` are the start and end (seconds) of the client's i-th
online interval; FedScale's simulator counts a client online at time ``t`` when
``active[i] <= t mod finish_time <= inactive[i]`` for some ``i`` (the trace repeats every
``finish_time`` seconds). Checked against the code of FedScale 1.0 (PyPI:
``fedscale/cloud/client_manager.py`` loads the pickle, ``internal/client_metadata.py``'s
``is_active`` tests the interval; FedScale walks the intervals with a cursor that moves one
step per call, here every interval is tested). The trace file itself (downloaded by
FedScale's scripts) could not be had on the machine this was written on, so it was not
opened here. FedScale gives its client ``c`` the trace ``keys[c mod len(trace)]`` in the
file's key order; here ids are sorted.

The conversion maps the clock to rounds: round ``t`` (1, 2, ...) happens at time
``offset + (t - 1) * seconds_per_round``, and a client is online in round ``t`` when it
is online at that instant (FedScale's own test). Each interval becomes the rows of
consecutive online rounds, ``online_from <= t < online_until``, repeated every
``finish_time`` seconds up to ``rounds`` (``repeat=False``: the trace is played once).
Clients are numbered ``0 ..`` in the order of their sorted FedScale ids (the
``fedscale_id`` column keeps the original id; :mod:`fedflex.trace` ignores extra columns);
``num_clients`` keeps the first ones.

Command line::

    python -m fedflex.fedscale client_behave_trace OUT.csv --seconds-per-round 60 --rounds 500 [--num-clients N]

FedScale's ``client_device_capacity`` (its "Device Trace File Formats") maps a client id to
``{'computation': ms per sample, 'communication': kbps}``; FedScale 1.0's
``ClientMetadata.get_completion_time`` makes a client's round
``3 x batch_size x local_steps x computation / 1000`` seconds of compute (the 3: a backward
pass costs about two forward ones) plus ``(upload + download) / communication`` seconds,
its sizes in kbit (bytes / 1024 x 8). :func:`read_device_profile` reads it;
:mod:`fedflex.launch.system_grid` applies it, client ``c`` taking the ``c mod len``-th
profile of the sorted ids (FedScale cycles through its profiles the same way).

The pickles are read with an unpickler that loads plain data only (mappings, lists,
numbers, strings, numpy scalars): a pickle that names any other class is refused, so no
code in the file runs. A JSON file of the same mapping is read too (``.json``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import pickle
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, cast

from fedflex.trace import TRACE_COLUMNS


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: any class but these few is refused."""

    ALLOWED = {
        ("collections", "OrderedDict"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}; only plain data (mappings, numbers, lists) is loaded")


def _read_mapping(path: str | Path, what: str) -> dict[Any, Any]:
    """Return the non-empty mapping in a pickle or a ``.json`` file; ``what`` names the file in errors."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {path}: no such file")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            with path.open("rb") as fh:
                data = _PlainUnpickler(fh).load()
    except (OSError, ValueError, pickle.UnpicklingError, EOFError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(f"{what} {path}: cannot be read ({exc})") from None
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{what} {path}: expected a non-empty mapping of client ids")
    return dict(data)


def read_fedscale(path: str | Path) -> dict[Any, dict]:
    """Return the trace mapping from a pickle (FedScale's file) or a JSON file.

    Raises
    ------
    ValueError
        For a missing or unreadable file, or one that is not a mapping of clients.
    """
    return _read_mapping(path, "FedScale trace")


def read_device_profile(path: str | Path) -> list[tuple[float, float]]:
    """Return FedScale device-capacity profiles as ``(ms per sample, kbps)`` in sorted id order.

    Raises
    ------
    ValueError
        For a file that cannot be read, or a client whose ``computation`` or
        ``communication`` is not a positive finite number (named in the message).
    """
    devices = _read_mapping(path, "FedScale device profile")
    out = []
    for client in sorted(devices, key=_sort_key):
        entry = devices[client]
        values = [entry.get(k) if isinstance(entry, Mapping) else None for k in ("computation", "communication")]
        if not all(_time(v) and cast(float, v) > 0 for v in values):
            raise ValueError(
                f"FedScale device profile {path}: client {client!r}: expected {{'computation': ms per sample, "
                f"'communication': kbps}}, both positive numbers, not {_short(entry)}"
            )
        out.append((float(cast(float, values[0])), float(cast(float, values[1]))))
    return out


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: most intervals one client's repeated trace may span (a finish_time of 1e-300 s would
#: repeat it without end)
MAX_INTERVALS = 10**6


def _time(value: Any) -> bool:
    """Whether ``value`` is a finite number of seconds (a bool is no time)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _times(values: Any) -> bool:
    """Whether ``values`` is a list of finite numbers of seconds."""
    return isinstance(values, Sequence) and not isinstance(values, (str, bytes)) and all(_time(v) for v in values)


def _sort_key(client_id: Any) -> tuple:
    try:
        return (0, int(client_id), "")
    except (TypeError, ValueError):
        return (1, 0, str(client_id))


def _rounds_online(start: float, end: float, spr: float, offset: float, rounds: int) -> tuple[int, int]:
    """Return rounds ``[first, until)`` whose instant ``offset + (t - 1) * spr`` lies in ``[start, end]``.

    The quotients are clamped to ``[-1, rounds + 1]`` before rounding: a tiny ``spr`` (1e-300 s)
    makes them overflow to infinity, which no round index can hold.
    """

    def steps(t: float) -> float:
        return min(max((t - offset) / spr, -1.0), rounds + 1.0)

    first = math.ceil(steps(start)) + 1
    until = math.floor(steps(end)) + 2
    return max(first, 1), min(until, rounds + 1)


def convert(
    trace: Mapping[Any, Mapping[str, Any]],
    seconds_per_round: float,
    rounds: int,
    num_clients: Optional[int] = None,
    offset: float = 0.0,
    repeat: bool = True,
) -> list[tuple[int, int, int, str]]:
    """Rows ``(client, online_from, online_until, fedscale_id)`` for rounds ``1 .. rounds``.

    Intervals of one client that touch or overlap are merged; a client never online in
    those rounds has no row (fedflex then never samples it).

    Raises
    ------
    ValueError
        For a non-positive or non-finite ``seconds_per_round``, ``rounds`` < 1, too few
        clients, or a client whose entry is not a mapping with ``active`` / ``inactive``
        lists of finite times of one length (and a finite positive ``finish_time`` when
        ``repeat``, which repeats them at most :data:`MAX_INTERVALS` times).
    """
    if not (seconds_per_round > 0 and math.isfinite(seconds_per_round)):
        raise ValueError(f"seconds_per_round = {seconds_per_round}: must be a finite number > 0")
    if rounds < 1:
        raise ValueError(f"rounds = {rounds}: must be >= 1")
    if not math.isfinite(offset):
        raise ValueError(f"offset = {offset}: must be a finite number")
    ids = sorted(trace, key=_sort_key)
    if num_clients is not None:
        if not 1 <= num_clients <= len(ids):
            raise ValueError(f"num_clients = {num_clients}: the trace has {len(ids)} clients")
        ids = ids[:num_clients]
    horizon = offset + (rounds - 1) * seconds_per_round  # the last round's instant
    rows: list[tuple[int, int, int, str]] = []
    for client, cid in enumerate(ids):
        entry = trace[cid]
        if not isinstance(entry, Mapping):
            raise ValueError(f"client {cid!r}: expected a mapping with 'active' and 'inactive', not {entry!r:.40}")
        active: Any = entry.get("active")
        inactive: Any = entry.get("inactive")
        if not _times(active) or not _times(inactive) or len(active) != len(inactive):
            raise ValueError(f"client {cid!r}: needs 'active' and 'inactive' lists of the same length (finite times)")
        period: Any = entry.get("finish_time")
        if repeat and not (_time(period) and period > 0):
            raise ValueError(
                f"client {cid!r}: needs a positive 'finish_time' to repeat (a finite number; or use repeat=False)"
            )
        repeats = horizon // period + 1 if repeat else 1.0  # a float: 1e-320 s periods overflow int()
        if repeats * max(len(active), 1) > MAX_INTERVALS:
            raise ValueError(
                f"client {cid!r}: finish_time {period} repeats its {len(active)} interval(s) {repeats:.3g} times "
                f"in {rounds} rounds of {seconds_per_round} s: more than {MAX_INTERVALS} (use repeat=False?)"
            )
        spans = []
        for k in range(int(repeats)):
            shift = k * period if repeat else 0.0
            for a, b in zip(active, inactive):
                if b < a:
                    raise ValueError(f"client {cid!r}: interval active {a} > inactive {b}")
                first, until = _rounds_online(a + shift, b + shift, seconds_per_round, offset, rounds)
                if first < until:
                    spans.append((first, until))
        for first, until in _merge(spans):
            rows.append((client, first, until, str(cid)))
    return rows


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for first, until in sorted(spans):
        if out and first <= out[-1][1]:
            out[-1][1] = max(out[-1][1], until)
        else:
            out.append([first, until])
    return [(a, b) for a, b in out]


def write_trace(rows: Sequence[tuple[int, int, int, str]], path: str | Path) -> None:
    """Write the rows as fedflex's trace CSV (``client,online_from,online_until,fedscale_id``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([*TRACE_COLUMNS, "fedscale_id"])
        writer.writerows(rows)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv``); return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m fedflex.fedscale", description="Convert a FedScale client_behave_trace to a fedflex trace CSV."
    )
    parser.add_argument("trace", help="FedScale's client_behave_trace (pickle) or the same mapping as .json")
    parser.add_argument("out", help="the CSV to write (churn.kind=trace churn.trace=OUT)")
    parser.add_argument("--seconds-per-round", type=float, required=True, help="seconds of trace time per round")
    parser.add_argument("--rounds", type=int, required=True, help="rounds to cover (the scenario's rounds)")
    parser.add_argument("--num-clients", type=int, default=None, help="keep the first N clients (sorted ids)")
    parser.add_argument("--offset", type=float, default=0.0, help="trace time of round 1 (seconds)")
    parser.add_argument("--no-repeat", action="store_true", help="play the trace once instead of every finish_time")
    args = parser.parse_args(argv)
    try:
        trace = read_fedscale(args.trace)
        rows = convert(trace, args.seconds_per_round, args.rounds, args.num_clients, args.offset, not args.no_repeat)
        write_trace(rows, args.out)
    except (ValueError, OSError) as exc:
        print(f"fedflex.fedscale: {exc}", file=sys.stderr)
        return 2
    clients = len(trace) if args.num_clients is None else args.num_clients
    online = len({r[0] for r in rows})
    print(f"wrote {args.out}: {len(rows)} intervals, {online} of {clients} clients online in rounds 1..{args.rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
