"""Tests for fedflex.churn: availability schedules, the factory and the session counter."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedflex.churn import (
    AlwaysOnline,
    Availability,
    ExplicitSessions,
    LabelSessions,
    MarkovChurn,
    SessionTracker,
    TraceAvailability,
    make_availability,
)
from fedflex.config import ChurnConfig


def ids(arr: np.ndarray) -> list[int]:
    return arr.tolist()


# ---------------------------------------------------------------------------- AlwaysOnline
def test_always_online_returns_every_client_sorted_int64():
    # Prepare
    avail = AlwaysOnline(4)

    # Execute
    online = avail.online(17)

    # Assert
    assert ids(online) == [0, 1, 2, 3]
    assert online.dtype == np.int64


def test_online_rejects_round_zero():
    # Prepare
    avail = AlwaysOnline(3)

    # Execute / Assert
    with pytest.raises(ValueError, match="1-based"):
        avail.online(0)


def test_default_timeline_marks_online_ids_per_round():
    # Prepare: the base-class timeline, via a schedule that does not override it
    avail = ExplicitSessions(3, [[0], [1, 2]], rounds_per_session=1)

    # Execute
    mask = avail.timeline(3)

    # Assert: rows are rounds 1..3
    assert mask.dtype == bool
    assert mask.tolist() == [[True, False, False], [False, True, True], [True, False, False]]


# ---------------------------------------------------------------------------- ExplicitSessions
@pytest.mark.parametrize(
    "server_round, expected",
    [(1, [0, 1]), (3, [0, 1]), (4, [2, 3]), (6, [2, 3]), (7, [0, 1]), (10, [2, 3])],
)
def test_explicit_sessions_boundaries_with_cycle(server_round, expected):
    # Prepare: session 0 = rounds 1-3, session 1 = rounds 4-6, then again from session 0
    avail = ExplicitSessions(4, [[0, 1], [2, 3]], rounds_per_session=3, cycle=True)

    # Execute
    online = avail.online(server_round)

    # Assert
    assert ids(online) == expected


@pytest.mark.parametrize("server_round, expected", [(6, [2, 3]), (7, [2, 3]), (100, [2, 3])])
def test_explicit_sessions_without_cycle_stay_in_last(server_round, expected):
    # Prepare
    avail = ExplicitSessions(4, [[0, 1], [2, 3]], rounds_per_session=3, cycle=False)

    # Execute
    online = avail.online(server_round)

    # Assert
    assert ids(online) == expected


def test_explicit_sessions_sort_and_deduplicate_ids():
    # Prepare
    avail = ExplicitSessions(5, [[4, 1, 4, 0]], rounds_per_session=2)

    # Execute
    online = avail.online(1)

    # Assert
    assert ids(online) == [0, 1, 4]


def test_explicit_sessions_reject_unknown_client_id():
    # Execute / Assert
    with pytest.raises(ValueError, match=r"sessions\[1\].*0\.\.3"):
        ExplicitSessions(4, [[0, 1], [2, 4]], rounds_per_session=3)


def test_explicit_sessions_answer_cannot_be_mutated_by_caller():
    # Prepare
    avail = ExplicitSessions(4, [[0, 1]], rounds_per_session=3)
    first = avail.online(1)

    # Execute
    first[0] = 3

    # Assert
    assert ids(avail.online(1)) == [0, 1]


# ---------------------------------------------------------------------------- LabelSessions
CLIENT_LABELS = [
    frozenset({0, 1}),  # 0
    frozenset({1}),  # 1
    frozenset({2, 3}),  # 2
    frozenset({3}),  # 3
    frozenset(),  # 4: no labels, never online
    frozenset({1, 2}),  # 5
]
SESSION_LABELS = [[0, 1], [2, 3], [1, 2, 3]]


@pytest.mark.parametrize(
    "server_round, expected",
    [
        (1, [0, 1]),  # {0,1}: clients 0 and 1; 5 holds label 2 too
        (2, [0, 1]),
        (3, [2, 3]),  # {2,3}
        (5, [1, 2, 3, 5]),  # {1,2,3}: everyone but 0 (label 0) and 4 (empty)
        (7, [0, 1]),  # cycle back to session 0
    ],
)
def test_label_sessions_admit_clients_whose_labels_are_a_subset(server_round, expected):
    # Prepare
    avail = LabelSessions(6, SESSION_LABELS, CLIENT_LABELS, rounds_per_session=2, cycle=True)

    # Execute
    online = avail.online(server_round)

    # Assert
    assert ids(online) == expected


def test_label_sessions_need_one_label_set_per_client():
    # Execute / Assert
    with pytest.raises(ValueError, match="one label set per client"):
        LabelSessions(7, SESSION_LABELS, CLIENT_LABELS, rounds_per_session=2, cycle=True)


# ---------------------------------------------------------------------------- MarkovChurn
def test_markov_same_seed_gives_same_timeline():
    # Prepare
    a = MarkovChurn(50, p_leave=0.2, p_join=0.3, seed=7)
    b = MarkovChurn(50, p_leave=0.2, p_join=0.3, seed=7)

    # Execute
    ta, tb = a.timeline(40), b.timeline(40)

    # Assert
    assert np.array_equal(ta, tb)


def test_markov_different_seed_gives_different_timeline():
    # Prepare
    a = MarkovChurn(50, p_leave=0.2, p_join=0.3, seed=7)
    b = MarkovChurn(50, p_leave=0.2, p_join=0.3, seed=8)

    # Execute
    ta, tb = a.timeline(40), b.timeline(40)

    # Assert
    assert not np.array_equal(ta, tb)


def test_markov_answers_do_not_depend_on_order_of_asking():
    # Prepare
    in_order = MarkovChurn(30, p_leave=0.3, p_join=0.4, seed=3)
    reference = {t: ids(in_order.online(t)) for t in range(1, 31)}
    shuffled = MarkovChurn(30, p_leave=0.3, p_join=0.4, seed=3)

    # Execute
    answers = {t: ids(shuffled.online(t)) for t in [17, 2, 30, 1, 17, 9, 2]}

    # Assert
    assert answers == {t: reference[t] for t in answers}


def test_markov_timeline_agrees_with_online():
    # Prepare
    avail = MarkovChurn(20, p_leave=0.3, p_join=0.4, seed=5)
    online_5 = ids(avail.online(5))

    # Execute
    mask = avail.timeline(8)

    # Assert
    assert ids(np.flatnonzero(mask[4])) == online_5


def test_markov_never_leave_always_join_puts_everyone_online_from_round_2():
    # Prepare
    avail = MarkovChurn(25, p_leave=0.0, p_join=1.0, seed=0, initial_online=0.0)

    # Execute
    first, later = avail.online(1), [avail.online(t) for t in range(2, 10)]

    # Assert
    assert ids(first) == []
    assert all(ids(o) == list(range(25)) for o in later)


def test_markov_always_leave_never_join_empties_after_round_1():
    # Prepare
    avail = MarkovChurn(25, p_leave=1.0, p_join=0.0, seed=0, initial_online=1.0)

    # Execute
    first, later = avail.online(1), [avail.online(t) for t in range(2, 10)]

    # Assert
    assert ids(first) == list(range(25))
    assert all(ids(o) == [] for o in later)


def test_markov_mean_online_share_is_stationary_share():
    # Prepare: pi = p_join / (p_leave + p_join) = 0.3 / 0.4 = 0.75. One round's share over
    # N independent clients is binomial: sd = sqrt(pi (1 - pi) / N). Over T rounds a
    # client's states are correlated with lag-1 coefficient rho = 1 - p_leave - p_join
    # = 0.6, which multiplies the variance of the time average by (1 + rho) / (1 - rho) = 4.
    n, rounds, p_leave, p_join = 2000, 200, 0.1, 0.3
    pi = p_join / (p_leave + p_join)
    rho = 1 - p_leave - p_join
    sd = math.sqrt(pi * (1 - pi) / (n * rounds) * (1 + rho) / (1 - rho))  # ~0.00137
    avail = MarkovChurn(n, p_leave=p_leave, p_join=p_join, seed=11)

    # Execute
    share = avail.timeline(rounds).mean()

    # Assert
    assert abs(share - pi) < 5 * sd


def test_markov_each_round_share_is_within_binomial_spread():
    # Prepare: started from the stationary share, every round's share is Binomial(N, pi)/N
    n, rounds, p_leave, p_join = 2000, 200, 0.1, 0.3
    pi = p_join / (p_leave + p_join)
    sd = math.sqrt(pi * (1 - pi) / n)  # ~0.00968
    avail = MarkovChurn(n, p_leave=p_leave, p_join=p_join, seed=12)

    # Execute
    shares = avail.timeline(rounds).mean(axis=1)

    # Assert
    assert np.all(np.abs(shares - pi) < 5 * sd)


def test_markov_mean_on_stretch_length_is_one_over_p_leave():
    # Prepare: an on-stretch lasts Geometric(p_leave) rounds: mean 1/p_leave = 5, variance
    # (1 - p_leave)/p_leave^2 = 20. Count the stretches that start with an off -> on step in
    # rounds 2..200 and give each 100+ further rounds, so cutting at the end is negligible
    # (P(L > 100) = 0.8^100 ~ 2e-10) and no length is favoured.
    n, rounds, p_leave, p_join, last_start = 2000, 300, 0.2, 0.3, 200
    avail = MarkovChurn(n, p_leave=p_leave, p_join=p_join, seed=13)

    # Execute
    states = avail.timeline(rounds).T.astype(np.int8)  # [client, round]
    padded = np.pad(states, ((0, 0), (1, 1)))
    step = np.diff(padded, axis=1)
    starts = np.argwhere(step == 1)  # (client, 0-based round of the first online round)
    ends = np.argwhere(step == -1)  # (client, 0-based round after the last online round)
    lengths = ends[:, 1] - starts[:, 1]
    keep = (starts[:, 1] >= 1) & (starts[:, 1] <= last_start - 1)
    sample = lengths[keep]

    # Assert
    sd = math.sqrt((1 - p_leave) / p_leave**2 / sample.size)  # ~0.02 for ~48,000 stretches
    assert sample.size > 40_000
    assert abs(sample.mean() - 1 / p_leave) < 5 * sd


def test_markov_default_initial_share_is_stationary():
    # Prepare
    avail = MarkovChurn(10, p_leave=0.1, p_join=0.3, seed=0)

    # Execute
    initial = avail.initial_online

    # Assert
    assert initial == pytest.approx(0.75)


def test_markov_without_movement_needs_initial_online():
    # Execute / Assert
    with pytest.raises(ValueError, match="initial_online"):
        MarkovChurn(10, p_leave=0.0, p_join=0.0, seed=0)


def test_markov_rejects_probability_above_one():
    # Execute / Assert
    with pytest.raises(ValueError, match="p_leave"):
        MarkovChurn(10, p_leave=1.5, p_join=0.3, seed=0)


def test_markov_handles_ten_thousand_clients_over_thousand_rounds():
    # Prepare
    avail = MarkovChurn(10_000, p_leave=0.1, p_join=0.3, seed=1)

    # Execute
    mask = avail.timeline(1000)

    # Assert
    assert mask.shape == (1000, 10_000)


# ---------------------------------------------------------------------------- TraceAvailability
def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


TRACE = "client,online_from,online_until\n0,1,3\n1,2,\n0,5,6\n2,3,4\n"


@pytest.mark.parametrize(
    "server_round, expected",
    [
        (1, [0]),  # 0 from 1 (inclusive)
        (2, [0, 1]),  # 1 from 2, forever
        (3, [1, 2]),  # 0 until 3 (exclusive); 2 in [3, 4)
        (4, [1]),
        (5, [0, 1]),  # 0's second interval [5, 6)
        (6, [1]),
        (1000, [1]),
    ],
)
def test_trace_intervals_are_from_inclusive_until_exclusive(tmp_path, server_round, expected):
    # Prepare
    avail = TraceAvailability(write(tmp_path, TRACE), num_clients=4)

    # Execute
    online = avail.online(server_round)

    # Assert
    assert ids(online) == expected


def test_trace_ignores_extra_columns_spaces_and_blank_lines(tmp_path):
    # Prepare
    text = "online_until, client ,online_from,note\n\n3, 1 ,2,x\n"
    avail = TraceAvailability(write(tmp_path, text), num_clients=2)

    # Execute
    online = [ids(avail.online(t)) for t in (1, 2, 3)]

    # Assert
    assert online == [[], [1], []]


@pytest.mark.parametrize(
    "text, message",
    [
        ("client,online_from,online_until\n0,1,3\n7,1,2\n", r"line 3: unknown client id 7"),
        ("client,online_from,online_until\n0,4,4\n", r"line 2: online_from = 4 >= online_until = 4"),
        ("client,online_from,online_until\n0,1.5,3\n", r"line 2: online_from = '1\.5' is not an integer"),
        ("client,online_from,online_until\nzero,1,3\n", r"line 2: client = 'zero' is not an integer"),
        ("client,online_from,online_until\n0,1,3\n\n0,,4\n", r"line 4: online_from is empty"),
        ("client,online_from,online_until\n0,1\n", r"line 2: missing value for column online_until"),
        ("client,online_from\n0,1\n", r"line 1: missing column online_until"),
        ("", r"line 1: empty file"),
    ],
)
def test_trace_errors_name_file_line_and_problem(tmp_path, text, message):
    # Prepare
    path = write(tmp_path, text, name="bad.csv")

    # Execute / Assert
    with pytest.raises(ValueError, match=r"bad\.csv, " + message):
        TraceAvailability(path, num_clients=4)


def test_trace_missing_file_is_a_value_error(tmp_path):
    # Execute / Assert
    with pytest.raises(ValueError, match="nope.csv: no such file"):
        TraceAvailability(tmp_path / "nope.csv", num_clients=4)


# ---------------------------------------------------------------------------- make_availability
@pytest.mark.parametrize(
    "cfg, expected",
    [
        (ChurnConfig(kind="none"), AlwaysOnline),
        (ChurnConfig(kind="sessions", sessions=[[0, 1], [2, 3]]), ExplicitSessions),
        (ChurnConfig(kind="label-sessions", session_labels=[[0, 1]]), LabelSessions),
        (ChurnConfig(kind="markov"), MarkovChurn),
    ],
)
def test_make_availability_dispatches_on_kind(cfg, expected):
    # Prepare
    labels = [frozenset({c % 2}) for c in range(4)]

    # Execute
    avail = make_availability(cfg, num_clients=4, seed=0, client_labels=labels)

    # Assert
    assert type(avail) is expected
    assert isinstance(avail, Availability)
    assert avail.num_clients == 4


def test_make_availability_builds_trace(tmp_path):
    # Prepare
    cfg = ChurnConfig(kind="trace", trace=str(write(tmp_path, TRACE)))

    # Execute
    avail = make_availability(cfg, num_clients=4, seed=0)

    # Assert
    assert isinstance(avail, TraceAvailability)
    assert ids(avail.online(2)) == [0, 1]


def test_make_availability_passes_session_settings():
    # Prepare
    cfg = ChurnConfig(kind="sessions", sessions=[[0, 1], [2, 3]], rounds_per_session=2, cycle=False)

    # Execute
    avail = make_availability(cfg, num_clients=4, seed=0)

    # Assert: rounds 1-2 -> [0,1], 3-4 -> [2,3], then stays
    assert [ids(avail.online(t)) for t in (2, 3, 5)] == [[0, 1], [2, 3], [2, 3]]


def test_make_availability_markov_uses_the_seed():
    # Prepare
    cfg = ChurnConfig(kind="markov", p_leave=0.2, p_join=0.3)

    # Execute
    built = make_availability(cfg, num_clients=40, seed=9).timeline(20)
    direct = MarkovChurn(40, p_leave=0.2, p_join=0.3, seed=9).timeline(20)

    # Assert
    assert np.array_equal(built, direct)


def test_make_availability_label_sessions_without_client_labels_fails():
    # Prepare
    cfg = ChurnConfig(kind="label-sessions", session_labels=[[0, 1]])

    # Execute / Assert
    with pytest.raises(ValueError, match="client_labels"):
        make_availability(cfg, num_clients=4, seed=0)


def test_make_availability_trace_without_path_fails():
    # Prepare
    cfg = ChurnConfig(kind="trace")

    # Execute / Assert
    with pytest.raises(ValueError, match="churn.trace"):
        make_availability(cfg, num_clients=4, seed=0)


def test_make_availability_rejects_unknown_kind():
    # Prepare
    cfg = ChurnConfig(kind="weekly")

    # Execute / Assert
    with pytest.raises(ValueError, match="'weekly': must be one of none, sessions"):
        make_availability(cfg, num_clients=4, seed=0)


# ---------------------------------------------------------------------------- SessionTracker
def feed(tracker: SessionTracker, sets: list[set[int]]) -> list[tuple[int, bool]]:
    return [tracker.update(t, s) for t, s in enumerate(sets, start=1)]


def test_tracker_first_update_starts_session_0():
    # Prepare
    tracker = SessionTracker()

    # Execute
    result = tracker.update(1, [2, 0])

    # Assert
    assert result == (0, True)
    assert (tracker.session, tracker.session_start_round, tracker.members) == (0, 1, frozenset({0, 2}))


def test_tracker_has_no_session_before_first_update():
    # Execute
    tracker = SessionTracker()

    # Assert
    assert (tracker.session, tracker.history) == (-1, [])


def test_tracker_keeps_session_for_equal_sets():
    # Prepare
    tracker = SessionTracker()

    # Execute
    results = feed(tracker, [{0, 1}, {1, 0}, {0, 1}])

    # Assert
    assert results == [(0, True), (0, False), (0, False)]


def test_tracker_moves_counter_on_change():
    # Prepare
    tracker = SessionTracker()

    # Execute
    results = feed(tracker, [{0, 1}, {0, 1}, {2, 3}, {2, 3}, {0, 1}])

    # Assert
    assert results == [(0, True), (0, False), (1, True), (1, False), (2, True)]
    assert tracker.history == [(1, frozenset({0, 1})), (3, frozenset({2, 3})), (5, frozenset({0, 1}))]


def test_tracker_min_session_rounds_holds_flapping_node_back():
    # Prepare: client 2 flaps every round; sessions must last 3 rounds.
    # r1 A: start s0 | r2 B: s0 1 round old | r3 A: equal to s0's start
    # r4 B: s0 3 rounds old -> s1 | r5 A: s1 1 round old | r6 B: equal to s1's start
    # r7 A: s1 3 rounds old -> s2
    a, b = {0, 1, 2}, {0, 1}
    tracker = SessionTracker(min_session_rounds=3)

    # Execute
    results = feed(tracker, [a, b, a, b, a, b, a])

    # Assert
    assert results == [
        (0, True),
        (0, False),
        (0, False),
        (1, True),
        (1, False),
        (1, False),
        (2, True),
    ]


def test_tracker_without_minimum_follows_every_flap():
    # Prepare
    a, b = {0, 1, 2}, {0, 1}
    tracker = SessionTracker()

    # Execute
    results = feed(tracker, [a, b, a])

    # Assert
    assert results == [(0, True), (1, True), (2, True)]


def test_tracker_change_threshold_compares_with_session_start():
    # Prepare: start with 10 clients; Jaccard distances to the start are
    # {0..8}: 1/10 = 0.1, {0..6}: 3/10 = 0.3 (not > 0.3), {0..5}: 4/10 = 0.4 (> 0.3)
    tracker = SessionTracker(change_threshold=0.3)
    sets = [set(range(10)), set(range(9)), set(range(7)), set(range(6))]

    # Execute
    results = feed(tracker, sets)

    # Assert
    assert results == [(0, True), (0, False), (0, False), (1, True)]
    assert tracker.members == frozenset(range(6))


def test_tracker_same_round_twice_gives_the_first_answer():
    # Prepare
    tracker = SessionTracker()
    tracker.update(1, {0})
    first = tracker.update(2, {1})

    # Execute
    again = tracker.update(2, {0})

    # Assert
    assert (first, again, tracker.session) == ((1, True), (1, True), 1)


def test_tracker_rejects_earlier_round():
    # Prepare
    tracker = SessionTracker()
    tracker.update(5, {0})

    # Execute / Assert
    with pytest.raises(ValueError, match="earlier than the last round fed"):
        tracker.update(4, {0})


def test_tracker_rejects_threshold_of_one():
    # Execute / Assert
    with pytest.raises(ValueError, match="change_threshold"):
        SessionTracker(change_threshold=1.0)


def test_tracker_state_dict_round_trip_through_json():
    # Prepare
    tracker = SessionTracker(min_session_rounds=2)
    feed(tracker, [{0, 1}, {0, 1}, {2}, {2, 3}])
    state = json.loads(json.dumps(tracker.state_dict()))
    restored = SessionTracker(min_session_rounds=2)

    # Execute
    restored.load_state_dict(state)

    # Assert: same state, and the same decision for the next round ({2,3} after s1 began
    # at round 3 with {2}: 2 rounds old at round 5 -> s2)
    assert (restored.session, restored.session_start_round, restored.members, restored.history) == (
        tracker.session,
        tracker.session_start_round,
        tracker.members,
        tracker.history,
    )
    assert restored.update(5, {2, 3}) == tracker.update(5, {2, 3}) == (2, True)


def test_tracker_load_state_dict_reports_missing_keys():
    # Prepare
    tracker = SessionTracker()

    # Execute / Assert
    with pytest.raises(ValueError, match="missing history"):
        tracker.load_state_dict(
            {"session": 0, "session_start_round": 1, "members": [], "last_round": 1, "last_started": True}
        )
