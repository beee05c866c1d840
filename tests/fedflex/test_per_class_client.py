"""Evaluation a paper can cite: per-class accuracy and the confusion matrix of the central
test set, and each client's accuracy on its own test split (fedflex.evaluation,
evaluation.per_class / per_client)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fedflex
from fedflex.evaluation import class_accuracy, client_accuracy_stats, client_test_rows, confusion_matrix

QUICKSTART = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"


def test_confusion_matrix_and_class_accuracy_by_hand():
    # Prepare: true 0 0 1 2 2 1 (class 3 has no example), predicted 0 1 1 2 2 2
    labels, predicted = np.array([0, 0, 1, 2, 2, 1]), np.array([0, 1, 1, 2, 2, 2])
    # Execute
    matrix = confusion_matrix(predicted, labels, 4)
    # Assert: rows are true classes; class 0: 1 of 2, class 1: 1 of 2, class 2: 2 of 2
    assert matrix.tolist() == [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 2, 0], [0, 0, 0, 0]]
    assert class_accuracy(matrix) == [0.5, 0.5, 1.0, None]


def test_a_clients_test_split_follows_its_label_proportions():
    # Prepare: 10 test rows of label 0, 10 of label 1, 2 of label 2
    test = np.array([0] * 10 + [1] * 10 + [2] * 2)
    # Execute: client 0 trains on labels 3:1 (size 8 -> 6 and 2); client 1 on 1:1:1 (8 / 3 = 2.67
    # each: floors 2, 2, 2 and the two largest remainders, ties by label, to labels 0 and 1);
    # client 2 on label 2 only, which has 2 test rows (all of them, not 8)
    splits = client_test_rows(test, [np.array([3, 1, 0]), np.array([1, 1, 1]), np.array([0, 0, 5])], 8, seed=0)
    again = client_test_rows(test, [np.array([3, 1, 0]), np.array([1, 1, 1]), np.array([0, 0, 5])], 8, seed=0)
    # Assert
    assert [np.bincount(test[rows], minlength=3).tolist() for rows in splits] == [[6, 2, 0], [3, 3, 2], [0, 0, 2]]
    assert all(len(set(rows)) == len(rows) for rows in splits)  # drawn without replacement
    assert all((a == b).all() for a, b in zip(splits, again))  # fixed by the seed


def test_client_accuracy_statistics_by_hand():
    # 20 clients: accuracies 0.00, 0.05, ..., 0.95; worst 10% = the 2 lowest, best 10% the 2 highest
    stats = client_accuracy_stats({c: c / 20 for c in range(20)})
    assert stats["client_accuracy_mean"] == pytest.approx(0.475)
    assert stats["client_accuracy_std"] == pytest.approx(np.std(np.arange(20) / 20))
    assert stats["client_accuracy_worst10"] == pytest.approx(0.025)
    assert stats["client_accuracy_best10"] == pytest.approx(0.925)
    assert stats["client_accuracy"][:2] == [[0, 0.0], [1, 0.05]]


def test_one_label_per_client_gives_each_client_its_class_accuracy(tmp_path):
    # Prepare: 10 clients with one label each, every one evaluated on all test rows of its label
    overrides = [
        "rounds=2",
        "num_clients=10",
        "churn.kind=none",
        "partition.scheme=shards",
        "partition.labels_per_client=1",
        "strategy.sampler.clients_per_round=10",
        "evaluation.per_client=all",
        "evaluation.client_test_size=100000",
        "output.progress=off",
    ]
    # Execute
    run = fedflex.run(QUICKSTART, overrides, out=tmp_path / "r")
    row = run.rows[-1]
    # Assert: the clients' accuracies are the classes' (one each), from two computations
    per_class = sorted(row["class_accuracy"])
    per_client = sorted(a for _, a in row["client_accuracy"])
    assert per_client == pytest.approx(per_class)
    assert row["client_accuracy_worst10"] == pytest.approx(per_class[0])
    assert row["worst_class_accuracy"] == pytest.approx(per_class[0], abs=1e-6)
    # the confusion matrix of the last round: its diagonal over its rows is the class accuracy
    matrix = np.array(json.loads((tmp_path / "r" / "summary.json").read_text())["confusion_matrix"])
    assert matrix.shape == (10, 10)
    assert [round(a, 6) for a in class_accuracy(matrix)] == row["class_accuracy"]
    assert (tmp_path / "r" / "confusion.png").is_file()


def test_per_client_off_and_per_class_off_add_no_fields():
    run = fedflex.run(QUICKSTART, ["rounds=1", "evaluation.per_class=false", "output.progress=off"])
    assert not [k for k in run.rows[0] if "class" in k or k.startswith("client_accuracy")]
    with pytest.raises(fedflex.ConfigError, match="evaluation.per_client"):
        fedflex.run(QUICKSTART, ["evaluation.per_client=some"])
