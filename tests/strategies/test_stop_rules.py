"""The target-accuracy stop rule, raw and on the Savitzky-Golay-smoothed curve."""

from types import SimpleNamespace

import pytest

from fedflex.launch.observers import StopRules
from fedflex.loader import load_scenario
from fedflex.results import smoothed_rounds_to_accuracy, sustained_rounds_to_accuracy


def _rows(accs):
    return [{"round": r, "test_accuracy": a} for r, a in enumerate(accs, start=1)]


def test_smoothing_keeps_a_cubic_curve_so_the_smoothed_round_is_the_raw_one():
    # a polynomial of degree <= order passes a Savitzky-Golay filter unchanged
    # the target lies between two rounds' values, so the answer does not hang on a float
    # tie (scipy 1.17's filter gives 0.09999999999999999 for the line's 0.1)
    accs = [0.01 * r for r in range(1, 13)]  # 0.095 first passed at round 10 (0.10)
    assert smoothed_rounds_to_accuracy(_rows(accs), 0.095, 5, 3, final_only=False) == 10
    # round 10 is final once its window (rounds 8-12) is complete: 12 rounds, not 11
    assert smoothed_rounds_to_accuracy(_rows(accs), 0.095, 5, 3) == 10
    assert smoothed_rounds_to_accuracy(_rows(accs[:11]), 0.095, 5, 3) is None
    assert smoothed_rounds_to_accuracy(_rows(accs[:4]), 0.005, 5, 3) is None  # shorter than the window


def test_a_one_round_spike_reaches_the_raw_target_but_not_the_smoothed_one():
    accs = [0.5] * 20
    accs[5] = 0.9  # round 6
    assert smoothed_rounds_to_accuracy(_rows(accs), 0.75, 13, 3, final_only=False) is None
    assert smoothed_rounds_to_accuracy(_rows(accs), 0.55, 13, 3, final_only=False) is not None


def test_sustained_rounds_need_k_evaluations_in_a_row_at_the_target():
    # 0.8 at rounds 3, 6, 7, 9, 10, 11: a one-round touch at 3, two in a row at 6-7,
    # three in a row from 9
    accs = [0.5, 0.7, 0.8, 0.6, 0.7, 0.8, 0.9, 0.7, 0.8, 0.85, 0.8, 0.6]
    assert sustained_rounds_to_accuracy(_rows(accs), 0.8, 1) == 3  # the raw first touch
    assert sustained_rounds_to_accuracy(_rows(accs), 0.8, 2) == 6
    assert sustained_rounds_to_accuracy(_rows(accs), 0.8, 3) == 9
    assert sustained_rounds_to_accuracy(_rows(accs), 0.8, 4) is None
    # rounds without an evaluation are skipped, not counted as a break
    rows = _rows(accs)
    rows.insert(7, {"round": 7.5, "test_accuracy": None})
    assert sustained_rounds_to_accuracy(rows, 0.8, 2) == 6
    with pytest.raises(ValueError, match="at least 1"):
        sustained_rounds_to_accuracy(rows, 0.8, 0)


def _stops(overrides):
    cfg = load_scenario(None, ["evaluation.stop_on_divergence=false", *overrides])
    return StopRules(cfg)


def _feed(stops, accs):
    """Feed the rounds one by one; the round the rule stopped at (None: never)."""
    for r, a in enumerate(accs, start=1):
        if stops.after_round(SimpleNamespace(round=r, test_accuracy=a, test_loss=1.0), None):
            return r
    return None


@pytest.mark.parametrize(
    "window, stopped_at",
    [
        (0, 10),  # raw: the first round >= 0.095 (0.10 at round 10)
        (5, 12),  # smoothed: round 10 is known once rounds 11 and 12 are in
    ],
)
def test_stop_rule_waits_for_the_smoothed_curve_when_asked(window, stopped_at):
    stops = _stops(["evaluation.stop_at_accuracy=0.095", f"evaluation.stop_smoothing={window}"])
    assert _feed(stops, [0.01 * r for r in range(1, 30)]) == stopped_at
    assert stops.fields["stopped_early"] is True


def test_stop_rule_runs_on_past_a_raw_spike_until_the_smoothed_curve_gets_there():
    accs = [0.5] * 10 + [0.9] + [0.5] * 10 + [0.8] * 20  # spike at round 11, plateau from 22
    stops = _stops(["evaluation.stop_at_accuracy=0.75", "evaluation.stop_smoothing=5"])
    stopped = _feed(stops, accs)
    assert stopped is not None and stopped > 22  # not at the spike
    assert _feed(_stops(["evaluation.stop_at_accuracy=0.75"]), accs) == 11
