"""fedflex compare: grouping, figures against a hand computation, tables and plots, on
run directories written by hand."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedflex.launch.cli import main
from fedflex.loader import load_scenario, to_yaml
from fedflex.study.compare import compare, curve, find_runs, group_runs, load_run, write_comparison
from fedflex.study.runs import StudyError

QUICKSTART = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"


def _write_run(path, sampler, seed, accs, status="completed", e_lud=None, wall=None, rounds=20, **summary):
    """A run directory as fedflex run writes it: config.yaml, metrics.jsonl, summary.json
    (none when ``status`` is None)."""
    cfg = load_scenario(QUICKSTART, [f"strategy.sampler.name={sampler}", f"seed={seed}", f"rounds={rounds}"])
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(to_yaml(cfg))
    rows = [
        {
            "round": t,
            "session": 0,
            "online": [0, 1],
            "sampled": [0],
            "test_accuracy": a,
            "test_loss": 1.0,
            "train_loss": 2.0 - a,
            "wall_s": 0.5,
            "e_lud": e_lud,
        }
        for t, a in enumerate(accs, 1)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if status is not None:
        body = {"status": status, "last_round": len(accs), "rounds": len(accs), "run_wall_s": wall, **summary}
        (path / "summary.json").write_text(json.dumps(body))


def _curve(c, spike=None):
    """20 rounds: c + 0.01 t for t = 1..19, a dip to c + 0.15 in round 20; ``spike``:
    (round, accuracy) replaced."""
    accs = [round(c + 0.01 * t, 4) for t in range(1, 20)] + [round(c + 0.15, 4)]
    if spike:
        accs[spike[0] - 1] = spike[1]
    return accs


@pytest.fixture
def study_dir(tmp_path):
    """Group uniform: seeds 0, 1, 2 at c = 0.5, 0.6, 0.7 (e-LUD 1, 2, 3; wall 10, 12, 14 s)
    plus seed 3 interrupted after round 7 and seed 4 killed (no summary) after round 3.
    Group hics: seeds 0, 1 at c = 0.40 (spike to 0.6 in round 5) and 0.45."""
    root = tmp_path / "sweep"
    for seed, c in enumerate((0.5, 0.6, 0.7)):
        _write_run(root / f"u{seed}", "uniform", seed, _curve(c), e_lud=float(seed + 1), wall=10.0 + 2 * seed)
    _write_run(root / "u3", "uniform", 3, _curve(0.5)[:7], status="interrupted", wall=3.0)
    _write_run(root / "u4", "uniform", 4, _curve(0.5)[:3], status=None)
    _write_run(root / "h0", "hics", 0, _curve(0.40, spike=(5, 0.6)), e_lud=1.0, wall=20.0)
    _write_run(root / "h1", "hics", 1, _curve(0.45), e_lud=1.0, wall=22.0)
    (root / ".replaced").mkdir()  # moved-aside runs are not compared
    _write_run(root / ".replaced" / "old", "uniform", 9, [0.9] * 20)
    return root


def test_runs_are_found_recursively_and_hidden_folders_skipped(study_dir):
    # Execute
    found = find_runs([study_dir])
    # Assert
    assert [p.name for p in found] == ["h0", "h1", "u0", "u1", "u2", "u3", "u4"]


def test_groups_differ_by_sampler_only_and_unfinished_runs_are_left_out(study_dir):
    # Execute
    study = group_runs([load_run(p) for p in find_runs([study_dir])])
    # Assert: seed is not a grouping key; u3 (interrupted) and u4 (killed) left out, saying why
    assert study.keys == ["strategy.sampler.name"]
    assert [(label, len(runs)) for label, _, runs in study.groups] == [
        ("strategy.sampler.name=hics", 2),
        ("strategy.sampler.name=uniform", 3),
    ]
    why = {run.path.name: text for run, text in study.excluded}
    assert why == {
        "u3": "interrupted after round 7 of 20",
        "u4": "no summary.json (killed, or still running) after round 3 of 20",
    }


def test_figures_equal_the_hand_computation(study_dir):
    # Execute
    rows = {r["group"]: r for r in compare([study_dir], target=0.555, window=5, order=1)}
    uniform, hics = rows["strategy.sampler.name=uniform"], rows["strategy.sampler.name=hics"]
    # Assert, uniform (n = 3, t(0.975, 2) = 4.302653, half = t * std / sqrt(3)):
    # final 0.65, 0.75, 0.85 -> mean 0.75, std 0.1, half 0.248413
    assert uniform["n"] == 3 and uniform["seeds"] == [0, 1, 2]
    assert uniform["final_accuracy_mean"] == pytest.approx(0.75)
    assert uniform["final_accuracy_std"] == pytest.approx(0.1)
    assert uniform["final_accuracy_ci_low"] == pytest.approx(0.75 - 0.248413, abs=1e-6)
    assert uniform["final_accuracy_ci_high"] == pytest.approx(0.75 + 0.248413, abs=1e-6)
    # best: round 19, c + 0.19 -> 0.69, 0.79, 0.89: mean 0.79, std 0.1
    assert (uniform["best_accuracy_mean"], uniform["best_accuracy_std"]) == pytest.approx((0.79, 0.1))
    # last 10% of 20 rounds = rounds 19, 20: c + 0.17 -> mean 0.77, std 0.1
    assert (uniform["last10_accuracy_mean"], uniform["last10_accuracy_std"]) == pytest.approx((0.77, 0.1))
    # e-LUDD 1, 2, 3 -> 2 +- 1; wall (summary's run_wall_s) 10, 12, 14 -> 12 +- 2
    assert (uniform["e_ludd_mean"], uniform["e_ludd_std"]) == pytest.approx((2.0, 1.0))
    assert (uniform["wall_s_mean"], uniform["wall_s_std"]) == pytest.approx((12.0, 2.0))
    # rounds to 0.555: c = 0.5 -> round 6 (0.56), c = 0.6 and 0.7 -> round 1: mean 8/3,
    # std sqrt(((10/3)^2 + (5/3)^2 + (5/3)^2) / 2) = sqrt(25/3); smoothed (window 5, order 1:
    # exact on the straight part) the same
    assert uniform["rounds_to_target_reached"] == 3
    assert uniform["rounds_to_target_mean"] == pytest.approx(8 / 3)
    assert uniform["rounds_to_target_std"] == pytest.approx(math.sqrt(25 / 3))
    assert uniform["rounds_to_target_smoothed_mean"] == pytest.approx(8 / 3)
    # hics (n = 2, t(0.975, 1) = 12.706205): final 0.55, 0.60 -> 0.575, std 0.05 / sqrt(2),
    # half 12.706205 * 0.05 / 2 = 0.317655
    assert (hics["final_accuracy_mean"], hics["final_accuracy_std"]) == pytest.approx((0.575, 0.05 / math.sqrt(2)))
    assert hics["final_accuracy_ci_low"] == pytest.approx(0.575 - 0.317655, abs=1e-6)
    # best: the spike 0.6 beats 0.59 of round 19; 0.64 -> mean 0.62
    assert hics["best_accuracy_mean"] == pytest.approx(0.62)
    # raw rounds to 0.555: the spike in round 5, and round 11 (0.56) -> 8 +- sqrt(3^2 + 3^2);
    # smoothed: the spike is averaged away (at most 0.47 + 0.15 / 5 = 0.50 near it), so
    # round 16 (0.56) and 11 -> 13.5 +- sqrt(2.5^2 + 2.5^2)
    assert (hics["rounds_to_target_mean"], hics["rounds_to_target_std"]) == pytest.approx((8.0, 6 / math.sqrt(2)))
    assert hics["rounds_to_target_smoothed_mean"] == pytest.approx(13.5)
    assert hics["rounds_to_target_smoothed_std"] == pytest.approx(5 / math.sqrt(2))


def test_a_single_run_has_a_mean_but_no_spread(tmp_path):
    # Prepare
    _write_run(tmp_path / "only", "uniform", 0, _curve(0.5))
    # Execute
    (row,) = compare([tmp_path / "only"])
    # Assert
    assert row["n"] == 1 and row["final_accuracy_mean"] == pytest.approx(0.65)
    assert row["final_accuracy_std"] is None and row["final_accuracy_ci_low"] is None


def test_include_incomplete_keeps_the_interrupted_and_killed_runs(study_dir):
    # Execute
    rows = {r["group"]: r for r in compare([study_dir], include_incomplete=True)}
    # Assert: u3's final is round 7 (0.57), u4's round 3 (0.53)
    uniform = rows["strategy.sampler.name=uniform"]
    assert uniform["n"] == 5
    assert uniform["final_accuracy_mean"] == pytest.approx((0.65 + 0.75 + 0.85 + 0.57 + 0.53) / 5)


def test_a_run_with_another_round_count_than_its_group_is_left_out(tmp_path):
    # Prepare: grouped by sampler, a 10-round run joins two 20-round runs
    _write_run(tmp_path / "a", "uniform", 0, _curve(0.5))
    _write_run(tmp_path / "b", "uniform", 1, _curve(0.6))
    _write_run(tmp_path / "c", "uniform", 2, _curve(0.7)[:10], rounds=10)
    # Execute
    study = group_runs([load_run(p) for p in find_runs([tmp_path])], by=["strategy.sampler.name"])
    # Assert
    assert [len(runs) for _, _, runs in study.groups] == [2]
    assert [(r.path.name, why) for r, why in study.excluded] == [("c", "10 rounds, its group has 20")]


def test_mean_curve_and_band_per_round(study_dir):
    # Prepare
    study = group_runs([load_run(p) for p in find_runs([study_dir])])
    uniform = study.groups[1][2]
    # Execute
    rounds, mean, low, high = curve(uniform, "test_accuracy")
    # Assert: round 1: 0.51, 0.61, 0.71
    assert rounds.tolist() == list(range(1, 21))
    assert (mean[0], low[0], high[0]) == pytest.approx((0.61, 0.51, 0.71))


def test_tables_and_plots_are_written(study_dir, tmp_path):
    # Execute
    text, written = write_comparison([study_dir], tmp_path / "cmp", target=0.555, metrics=["train_loss"])
    # Assert
    assert [p.name for p in written] == ["compare.md", "compare.csv", "test_accuracy.png", "train_loss.png"]
    for png in written[2:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = text.splitlines()
    assert lines[0].startswith("| group | n | final acc | best acc | last-10% acc | rounds to 0.555 |")
    assert lines[3].startswith("| strategy.sampler.name=uniform | 3 | 0.7500 ± 0.1000 [0.5016, 0.9984] |")
    assert "interrupted after round 7 of 20" in text
    with open(written[1]) as fh:
        table = list(csv.DictReader(fh))
    assert [r["strategy.sampler.name"] for r in table] == ["hics", "uniform"]
    assert math.isclose(float(table[1]["final_accuracy_mean"]), 0.75)


def test_the_plot_is_titled_labelled_with_a_legend_and_integer_round_ticks(study_dir, tmp_path, monkeypatch):
    # Prepare: keep the figure to look at it
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    # Execute
    write_comparison([study_dir], tmp_path / "cmp")
    # Assert
    ax = figures[0].axes[0]
    assert "test accuracy per round" in ax.get_title() and "band: min-max" in ax.get_title()
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("round", "test accuracy")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "strategy.sampler.name=hics (n=2)",
        "strategy.sampler.name=uniform (n=3)",
    ]
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 20]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert len(ax.collections) == 2  # one band per group
    np.testing.assert_allclose(ax.lines[1].get_ydata()[0], 0.61)


def test_unknown_metric_and_missing_runs_are_one_line_errors(study_dir, tmp_path, capsys):
    # Execute / Assert
    assert main(["compare", str(study_dir), "--metric", "nope", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--metric nope: not a numeric field" in err and "train_loss" in err
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty")]) == 2
    assert "no run directory" in capsys.readouterr().err
    with pytest.raises(StudyError, match="--by nope"):
        compare([study_dir], by=["nope"])


def test_cli_prints_the_table_and_writes_into_the_directory(study_dir, capsys):
    # Execute
    code = main(["compare", str(study_dir), "--target", "0.555"])
    # Assert
    out = capsys.readouterr().out
    assert code == 0
    assert "| strategy.sampler.name=hics | 2 |" in out
    assert (study_dir / "compare" / "compare.md").read_text() == out


def test_sustain_counts_the_rounds_to_a_target_held_k_evaluations(study_dir, capsys):
    # Target 0.555, held 3: hics seed 0 (0.40 + 0.01 t, a spike to 0.6 at round 5) touches
    # it at round 5 but holds it from round 16 (0.56, 0.57, 0.58); seed 1 (0.45 + 0.01 t)
    # from round 11 -> mean 13.5, sample std 5 / sqrt(2), against 8.0 raw. uniform's curves
    # rise steadily: held = raw (6, 1, 1).
    rows = {r["group"]: r for r in compare([study_dir], target=0.555, sustain=3)}
    hics, uniform = rows["strategy.sampler.name=hics"], rows["strategy.sampler.name=uniform"]
    assert hics["rounds_to_target_mean"] == pytest.approx(8.0)
    assert hics["rounds_to_target_sustained_mean"] == pytest.approx(13.5)
    assert hics["rounds_to_target_sustained_std"] == pytest.approx(5 / math.sqrt(2))
    assert uniform["rounds_to_target_sustained_mean"] == pytest.approx(8 / 3)
    assert "rounds_to_target_sustained_mean" not in compare([study_dir], target=0.555)[0]
    # Execute: the command line
    assert main(["compare", str(study_dir), "--target", "0.555", "--sustain", "3"]) == 0
    out = capsys.readouterr().out
    assert "| rounds to 0.555 (held 3) |" in out
    assert "| 13.5 ± 3.5, median 13.5 (2/2) |" in out
    assert main(["compare", str(study_dir), "--sustain", "3"]) == 2
    assert capsys.readouterr().err.strip() == "fedflex: --sustain 3: a number of evaluations >= 1, with --target"


# ---------------------------------------------------------------------------- sweeps, fields, references
def _index(root, points):
    """A sweep.json listing ``points`` (run name -> grid point) in this order."""
    members = [{"name": name, "point": point} for name, point in points.items()]
    (root / "sweep.json").write_text(json.dumps({"members": members}))


@pytest.fixture
def variant_sweep(tmp_path):
    """A sweep over a variant axis ``method``: ``slow`` (uniform sampler) and ``fast``
    (hics), listed fast first; seeds 0, 1 each."""
    root = tmp_path / "sweep"
    points = {}
    for method, sampler, c in (("fast", "hics", 0.6), ("slow", "uniform", 0.5)):
        for seed in (0, 1):
            name = f"method={method},seed={seed}"
            _write_run(root / name, sampler, seed, _curve(c + 0.02 * seed), transitions=[{"acc": c + seed / 10}])
            points[name] = {"method": method, "seed": str(seed)}
    _index(root, points)
    return root


def test_runs_of_a_sweep_are_labelled_by_their_grid_point_in_the_sweeps_order(variant_sweep):
    # Execute
    rows = compare([variant_sweep])
    # Assert: the label is the variant, not the config key it sets; fast (listed first) first
    assert [(r["group"], r["n"]) for r in rows] == [("method=fast", 2), ("method=slow", 2)]
    assert rows[0]["strategy.sampler.name"] == "hics"


def test_by_may_name_a_grid_axis(variant_sweep):
    # Execute
    rows = compare([variant_sweep], by=["method"])
    # Assert
    assert [(r["group"], r["method"]) for r in rows] == [("method=fast", "fast"), ("method=slow", "slow")]


def test_a_summary_field_is_tabulated_over_the_seeds(variant_sweep):
    # Execute
    rows = {r["group"]: r for r in compare([variant_sweep], fields=["transitions.0.acc"])}
    # Assert: slow: 0.5, 0.6 -> mean 0.55, std 0.1 / sqrt(2)
    slow = rows["method=slow"]
    assert slow["transitions.0.acc_mean"] == pytest.approx(0.55)
    assert slow["transitions.0.acc_std"] == pytest.approx(0.1 / math.sqrt(2))


def test_a_field_in_no_summary_is_a_one_line_error(variant_sweep, tmp_path, capsys):
    assert main(["compare", str(variant_sweep), "--field", "transitions.5.acc", "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedflex: --field transitions.5.acc: not a number in any compared run's summary.json"
    )


def test_rounds_to_target_has_its_median(variant_sweep):
    # Execute: target 0.55; slow seeds reach it at c + 0.01 t >= 0.55: c = 0.50 -> t = 5, c = 0.52 -> t = 3
    rows = {r["group"]: r for r in compare([variant_sweep], target=0.55)}
    # Assert
    assert rows["method=slow"]["rounds_to_target_median"] == 4.0
    assert rows["method=fast"]["rounds_to_target_median"] == 1.0


def test_reference_numbers_join_the_groups_they_name(variant_sweep, tmp_path, capsys):
    # Prepare: one entry by variant, one by a config key that only the slow runs have, one
    # that matches nothing (a group not run)
    ref_file = tmp_path / "ref.yaml"
    ref_file.write_text(
        "reference:\n"
        "  source: Table 9 of a paper\n"
        "  groups:\n"
        "    method=fast: {paper acc: 0.7}\n"
        "    strategy.sampler.name=uniform: {paper acc: 0.4, paper rounds: 12}\n"
        "    method=none: {paper acc: 0.1}\n"
    )
    # Execute
    code = main(["compare", str(variant_sweep), "--reference", str(ref_file), "--out", str(tmp_path / "c")])
    # Assert: the columns at the end of the table, "-" where the paper has none, the source under it
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0].endswith("| wall s | MB sent | paper acc | paper rounds |")
    assert lines[2].startswith("| method=fast | 2 |") and lines[2].endswith("| 0.7 | - |")
    assert lines[3].startswith("| method=slow | 2 |") and lines[3].endswith("| 0.4 | 12 |")
    assert "paper acc, paper rounds: Table 9 of a paper, as published (no seeds)." in out
    with open(tmp_path / "c" / "compare.csv") as fh:
        table = list(csv.DictReader(fh))
    assert json.loads(table[1]["reference"]) == {"paper acc": 0.4, "paper rounds": 12}


def test_a_reference_file_without_reference_is_a_one_line_error(variant_sweep, tmp_path, capsys):
    (tmp_path / "r.yaml").write_text("source: x\n")
    assert main(["compare", str(variant_sweep), "--reference", str(tmp_path / "r.yaml"), "--out", str(tmp_path)]) == 2
    assert "reference: expected source: TEXT and groups:" in capsys.readouterr().err


def test_an_interval_is_clipped_to_the_range_its_figure_can_take():
    from fedflex.study.compare import mean_interval

    # Prepare: two accuracies 0.95, 0.99: mean 0.97, std 0.02 * sqrt(2) = 0.028284,
    # half = t(0.975, 1) 12.706205 * 0.028284 / sqrt(2) = 0.254124 -> [0.715876, 1.224124]
    accuracy = mean_interval([0.95, 0.99], bounds=(0.0, 1.0))
    # two wall times 1 and 9 s: mean 5, std 4 * sqrt(2), half 12.706205 * 4 = 50.8248 -> [-45.82, 55.82]
    wall = mean_interval([1.0, 9.0], bounds=(0.0, None))
    # Assert: the side past the range is cut at it, the other side and the mean are kept
    assert accuracy["ci_low"] == pytest.approx(0.715876, abs=1e-6) and accuracy["ci_high"] == 1.0
    assert wall["ci_low"] == 0.0 and wall["ci_high"] == pytest.approx(55.8248, abs=1e-4)
    assert (wall["mean"], mean_interval([1.0, 9.0])["ci_low"]) == pytest.approx((5.0, -45.8248), abs=1e-4)


def test_compare_clips_wall_time_at_zero_and_says_so(tmp_path):
    # Prepare: two seeds whose wall times (1 s, 9 s) give a t-interval reaching below 0
    for seed, wall in ((0, 1.0), (1, 9.0)):
        _write_run(tmp_path / f"s{seed}", "uniform", seed, _curve(0.5), wall=wall)
    # Execute
    (row,) = compare([tmp_path])
    text, _ = write_comparison([tmp_path], tmp_path / "cmp")
    # Assert
    assert row["wall_s_ci_low"] == 0.0
    assert "5.0 ± 5.7 [0.0, 55.8]" in text and "clipped to the figure's range" in text


def test_the_smoothed_column_says_when_the_window_is_longer_than_the_runs(tmp_path):
    # Prepare: 5-round runs, the default window 13
    for seed in (0, 1):
        _write_run(tmp_path / f"s{seed}", "uniform", seed, [0.1, 0.2, 0.3, 0.4, 0.5], rounds=5)
    # Execute
    text, _ = write_comparison([tmp_path], tmp_path / "cmp", target=0.3)
    long_runs, _ = write_comparison([tmp_path], tmp_path / "cmp3", target=0.3, window=3, order=1)
    # Assert: the smoothed cell is '-' and a line under the table says why; none with w = 3
    assert "- (0/2)" in text
    assert "fewer evaluated rounds (5) than the smoothing window w=13 (--smooth sets it)" in text
    assert "smoothing window" not in long_runs


def test_the_accuracy_plot_draws_the_target_and_wraps_a_long_title(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from fedflex.results import wrap_title

    # Prepare: a scenario name long enough to run past the figure's edges on one line
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    name = "hics_fmnist_reproduction_of_the_papers_setting_2_with_churn"
    for seed in (0, 1):
        _write_run(tmp_path / f"s{seed}", "uniform", seed, _curve(0.5))
        config = tmp_path / f"s{seed}" / "config.yaml"
        config.write_text(config.read_text().replace("name: quickstart", f"name: {name}"))
    # Execute
    write_comparison([tmp_path], tmp_path / "cmp", target=0.555)
    # Assert: a dotted line at 0.555 in the legend; no title line over 90 characters, no word lost
    ax = figures[0].axes[0]
    target = [line for line in ax.lines if line.get_label() == "target 0.555"]
    assert len(target) == 1 and set(target[0].get_ydata()) == {0.555}
    title = ax.get_title()
    assert name in title and len(title.splitlines()) > 1
    assert max(len(line) for line in title.splitlines()) <= 90
    assert wrap_title("a b\nc", 90) == "a b\nc"


def _one_megabyte_a_round(run_dir, unevaluated=()):
    """Give a written run's rows 0.5 MB down and 0.5 MB up each; ``unevaluated``: rounds
    whose test accuracy is taken out."""
    metrics = run_dir / "metrics.jsonl"
    rows = [
        {**json.loads(line), "bytes_down": 500_000, "bytes_up": 500_000} for line in metrics.read_text().splitlines()
    ]
    rows = [{**r, "test_accuracy": None} if r["round"] in unevaluated else r for r in rows]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_megabytes_to_target_and_sent_come_from_the_rows_bytes(tmp_path):
    # Prepare: 1 MB a round (0.5 MB down, 0.5 MB up); c = 0.5 and 0.6 reach 0.555 in rounds 6 and 1
    for seed, c in ((0, 0.5), (1, 0.6)):
        _write_run(tmp_path / f"s{seed}", "uniform", seed, _curve(c))
        _one_megabyte_a_round(tmp_path / f"s{seed}")
    # Execute
    (row,) = compare([tmp_path], target=0.555)
    text, _ = write_comparison([tmp_path], tmp_path / "cmp", target=0.555)
    # Assert: 6 and 1 MB to the target (mean 3.5, median 3.5); 20 MB sent by each run
    assert (row["mb_to_target_mean"], row["mb_to_target_median"], row["mb_to_target_reached"]) == (3.5, 3.5, 2)
    assert (row["mb_total_mean"], row["mb_total_std"]) == (20.0, 0.0)
    assert "| MB to 0.555 |" in text and "3.50 ± 3.54, median 3.5 (2/2)" in text


def test_accuracy_at_a_byte_budget_is_the_last_evaluated_round_within_it(tmp_path):
    # Prepare: 1 MB a round; 5.5 MB buys rounds 1-5. Seed 0 (c = 0.5) has no evaluation in
    # round 5, so its model at the budget is round 4's, 0.54; seed 1's (c = 0.6) round 5's, 0.65
    _write_run(tmp_path / "s0", "uniform", 0, _curve(0.5))
    _one_megabyte_a_round(tmp_path / "s0", unevaluated=(5,))
    _write_run(tmp_path / "s1", "uniform", 1, _curve(0.6))
    _one_megabyte_a_round(tmp_path / "s1")
    # Execute
    (row,) = compare([tmp_path], budget_mb=5.5)
    text, _ = write_comparison([tmp_path], tmp_path / "cmp", budget_mb=5.5)
    (too_small,) = compare([tmp_path], budget_mb=0.5)
    # Assert
    assert row["acc_at_budget_mean"] == pytest.approx((0.54 + 0.65) / 2)
    assert "| acc at 5.5 MB |" in text and "0.5950 ± 0.0778" in text
    assert too_small["acc_at_budget_mean"] is None
    assert "acc_at_budget_mean" not in compare([tmp_path])[0]
    assert main(["compare", str(tmp_path), "--budget-mb", "0"]) == 2


def test_simulated_seconds_to_target_come_from_the_rows_clock(tmp_path):
    # Prepare: a system model's clock of 2 s a round; c = 0.5 reaches 0.555 in round 6 (12 s),
    # c = 0.6 in round 1 (2 s)
    for seed, c in ((0, 0.5), (1, 0.6)):
        _write_run(tmp_path / f"s{seed}", "uniform", seed, _curve(c))
        metrics = tmp_path / f"s{seed}" / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        rows = [{**r, "sim_round_s": 2.0, "sim_clock_s": 2.0 * r["round"]} for r in rows]
        metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Execute
    (row,) = compare([tmp_path], target=0.555)
    text, _ = write_comparison([tmp_path], tmp_path / "cmp", target=0.555)
    # Assert
    assert (row["sim_s_to_target_mean"], row["sim_s_to_target_reached"]) == (7.0, 2)
    assert "| simulated s to 0.555 |" in text and "7.0 ± 7.1, median 7 (2/2)" in text


def test_a_run_from_before_an_option_existed_groups_with_its_default(tmp_path):
    # Prepare: two seeds of one configuration; the first run's config.yaml predates
    # system.partial (the key is missing), the second holds its default
    for seed in (0, 1):
        _write_run(tmp_path / f"s{seed}", "uniform", seed, _curve(0.5))
    config = tmp_path / "s0" / "config.yaml"
    config.write_text(config.read_text().replace("  partial: false\n", ""))
    assert "partial" not in config.read_text()
    # Execute
    rows = compare([tmp_path])
    # Assert: one group of both seeds, not one group per spelling of the default
    assert [r["n"] for r in rows] == [2]
