"""Losses by name, the even/odd label map, the svm model and the label-groups
partition, by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedflex import config
from fedflex.config import ConfigError, DatasetConfig, ModelConfig, PartitionConfig
from fedflex.data import ArrayDataset, FederatedData, apply_label_map
from fedflex.evaluation import evaluate
from fedflex.loader import load_scenario
from fedflex.losses import LOSSES, get_loss, squared_hinge
from fedflex.models import build_model
from fedflex.partition import label_group_partition, make_partition, partition_data


def test_registry_holds_exactly_the_config_loss_names():
    assert set(LOSSES) == set(config.LOSSES)


def test_squared_hinge_binary_by_hand():
    # f = (2, 0.5, -0.5), labels (1, 1, 1) -> y = +1: margins (0, 0.5, 1.5) -> (0 + 0.25 + 2.25) / 3
    scores = torch.tensor([[2.0], [0.5], [-0.5]])
    assert float(squared_hinge(scores, torch.tensor([1, 1, 1]))) == pytest.approx(2.5 / 3)
    # label 0 -> y = -1: f = -0.5 -> margin 1 - 0.5 = 0.5 -> 0.25
    assert float(squared_hinge(torch.tensor([[-0.5]]), torch.tensor([0]))) == pytest.approx(0.25)


def test_squared_hinge_one_vs_rest_by_hand():
    # scores (1, -1, 0.5), true class 0: y = (+1, -1, -1): margins (0, 0, 1.5) -> 2.25
    assert float(squared_hinge(torch.tensor([[1.0, -1.0, 0.5]]), torch.tensor([0]))) == pytest.approx(2.25)


def test_squared_hinge_on_one_output_refuses_multiclass_labels():
    with pytest.raises(ValueError, match="label_map"):
        squared_hinge(torch.zeros(2, 1), torch.tensor([0, 3]))


def test_squared_hinge_prediction_is_the_sign():
    assert get_loss("squared-hinge").predict(torch.tensor([[0.3], [-0.1], [0.0]])).tolist() == [1, 0, 0]


def test_unknown_loss_is_refused_by_name():
    with pytest.raises(ValueError, match="hinge"):
        get_loss("hinge")
    with pytest.raises(ConfigError, match="model.loss"):
        load_scenario(None, ["model.loss=hinge"])


def test_even_odd_maps_labels_and_classes():
    data = ArrayDataset(x=torch.zeros(5, 1), y=torch.tensor([0, 1, 2, 7, 8]), num_classes=10)
    mapped = apply_label_map(FederatedData(train=data, test=data), "even-odd")
    assert mapped.train.y.tolist() == [0, 1, 0, 1, 0] and mapped.train.num_classes == 2
    assert data.y.tolist() == [0, 1, 2, 7, 8]  # the source (e.g. a memory-mapped cache) is untouched


def test_label_map_is_checked_at_load():
    with pytest.raises(ConfigError, match="dataset.label_map"):
        load_scenario(None, ["dataset.label_map=parity"])


def test_load_dataset_applies_the_map(monkeypatch, tmp_path):
    from fedflex.data import load_dataset

    data = load_dataset(
        DatasetConfig(name="synthetic", num_classes=10, label_map="even-odd", samples_per_client=20), 2, 0
    )
    assert data.train.num_classes == 2 and set(data.train.y.tolist()) <= {0, 1}


def test_svm_is_one_linear_score():
    model = build_model(ModelConfig(name="svm", loss="squared-hinge"), (1, 28, 28), 2)
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 1)
    assert sum(p.numel() for p in model.parameters()) == 784 + 1


def test_svm_refuses_more_than_two_classes():
    with pytest.raises(ValueError, match="label_map"):
        build_model(ModelConfig(name="svm", loss="squared-hinge"), (4,), 10)


def test_evaluate_with_squared_hinge_by_hand():
    # f(x) = x: x = (2, -0.5) with labels (1, 1): losses (0, 2.25), accuracy 1/2
    model = nn.Linear(1, 1, bias=False)
    nn.init.ones_(model.weight)
    data = ArrayDataset(x=torch.tensor([[2.0], [-0.5]]), y=torch.tensor([1, 1]), num_classes=2)
    for loss in ("squared-hinge", None):  # None: one output column implies squared-hinge
        assert evaluate(model, data, loss=loss)[:2] == pytest.approx((1.125, 0.5))


def test_label_groups_partition_by_hand():
    # labels 0..3, 4 examples each; groups {0,2}, {1}, {3} over 3 clients
    y = np.repeat(np.arange(4), 4)
    parts = label_group_partition(y, 3, [[0, 2], [1], [3]], seed=0)
    assert [sorted(set(y[ix].tolist())) for ix in parts] == [[0, 2], [1], [3]]
    assert [len(ix) for ix in parts] == [8, 4, 4]


def test_label_groups_repeat_over_clients_and_split_evenly():
    # two groups over 5 clients: label 0 on clients 0, 2, 4 (3 + 3 + 3 of 9); label 1 on 1, 3
    y = np.array([0] * 9 + [1] * 8)
    parts = make_partition(PartitionConfig(scheme="label-groups", label_groups=[[0], [1]]), y, 5, 2, seed=1)
    assert [len(ix) for ix in parts.indices] == [3, 4, 3, 4, 3]
    assert parts.label_counts[:, 1].tolist() == [0, 4, 0, 4, 0]


def test_label_groups_need_groups_at_load():
    with pytest.raises(ConfigError, match="label_groups"):
        load_scenario(None, ["partition.scheme=label-groups"])


def test_partition_on_source_labels_splits_digits_and_counts_the_mapped_labels(tmp_path):
    # digits 0..3, 3 examples each, mapped to even/odd; groups {0,1} and {2,3} by digit give
    # each client one even and one odd digit: 3 + 3 examples, mapped counts (3, 3)
    y = torch.arange(4).repeat_interleave(3)
    data = apply_label_map(
        FederatedData(train=ArrayDataset(torch.zeros(12, 1), y, 4), test=ArrayDataset(torch.zeros(2, 1), y[:2], 4)),
        "even-odd",
    )
    cfg = PartitionConfig(scheme="label-groups", label_groups=[[0, 1], [2, 3]], labels="source")
    part = partition_data(cfg, data, 2, seed=0, cache_dir=tmp_path)
    assert [ix.tolist() for ix in part.indices] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert part.label_counts.tolist() == [[3, 3], [3, 3]]
    # on the mapped labels the same groups name classes 0 / 1 and digit 2 / 3 do not exist
    mapped = partition_data(
        PartitionConfig(scheme="label-groups", label_groups=[[0], [1]]), data, 2, seed=0, cache_dir=tmp_path
    )
    assert mapped.label_counts.tolist() == [[6, 0], [0, 6]]
    with pytest.raises(ConfigError, match="partition.labels"):
        load_scenario(None, ["partition.labels=digits"])
