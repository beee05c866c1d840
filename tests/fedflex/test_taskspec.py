"""The task spec's wire contract (fedflex.taskspec): one typed to_record / from_record pair,
the same entry the server always sent, clear errors, and a round's clients parsing it
(and their training settings) once."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

import fedflex.clients.node as node
from fedflex import keys
from fedflex.clients.client_app import app as client_app
from fedflex.config import ClientConfig, DatasetConfig, LocalRuleConfig, ModelConfig, PartitionConfig
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server, train_config
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.taskspec import TaskSpec, TaskSpecError

SPEC = TaskSpec(
    dataset=DatasetConfig(name="hf", path="x/y", train_files=["a.csv", "b.csv"], client_column="writer"),
    partition=PartitionConfig(scheme="label-groups", label_groups=[[0, 1], [2]], alphas=[0.1, 1.0]),
    model=ModelConfig(name="mlp", hidden=[200, 100]),
    num_clients=7,
    seed=3,
    device="cpu",
    num_threads=2,
)


def _entry(spec: TaskSpec = SPEC) -> dict:
    return json.loads(spec.to_record()[keys.TASK])


def _parse(data) -> TaskSpec:
    return TaskSpec.from_record({keys.TASK: json.dumps(data)})


def test_the_spec_goes_out_and_comes_back_the_same():
    record = SPEC.to_record()
    assert list(record) == [keys.TASK] and isinstance(record[keys.TASK], str)
    back = TaskSpec.from_record(record)
    assert back == SPEC
    assert back.partition.label_groups == [[0, 1], [2]] and back.model.hidden == [200, 100]


def test_the_entry_is_what_the_server_sent_before_the_spec_had_a_class():
    # the task JSON of the first releases: the same string, so the same values reach the
    # clients and a worker's cached task (keyed on it) is found as before
    cfg = load_scenario(None, ["num_clients=5", "seed=4", "client.device=cpu", "model.name=mlp"])
    before = {
        "dataset": asdict(cfg.dataset),
        "partition": asdict(cfg.partition),
        "model": asdict(cfg.model),
        "num_clients": cfg.num_clients,
        "seed": cfg.seed,
        "device": cfg.client.device,
        "num_threads": cfg.client.num_threads,
    }
    assert TaskSpec.of(cfg).to_record() == {keys.TASK: json.dumps(before, sort_keys=True)}
    assert train_config(cfg)[keys.TASK] == json.dumps(before, sort_keys=True)  # the server builds it so
    assert TaskSpec.from_record(train_config(cfg)) == TaskSpec.of(cfg)


def test_worker_fields_left_out_take_their_defaults():
    data = _entry()
    del data["device"], data["num_threads"], data["model"]["hidden"]
    spec = _parse(data)
    assert (spec.device, spec.num_threads, spec.model.hidden) == ("auto", 0, ModelConfig.hidden)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("seed"), "task: missing field(s) seed (required: dataset, partition, model, num_clients, "),
        (lambda d: d.pop("dataset"), "task: missing field(s) dataset"),
        (lambda d: d.update(rounds=3), "task: unknown field(s) rounds (fields: dataset, partition, model, "),
        (lambda d: d["partition"].update(shards=2), "task.partition: unknown field(s) shards (fields: scheme, "),
        (lambda d: d.update(model=[1]), "task.model: a JSON object expected, got list"),
    ],
)
def test_a_missing_or_unknown_field_is_named(change, message):
    data = _entry()
    change(data)
    with pytest.raises(TaskSpecError) as info:
        _parse(data)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_a_record_without_a_spec_or_with_a_broken_one_is_refused():
    with pytest.raises(TaskSpecError, match="the train message's config has no 'task' entry"):
        TaskSpec.from_record({keys.SEED: 0})
    with pytest.raises(TaskSpecError, match="task: not JSON"):
        TaskSpec.from_record({keys.TASK: "{dataset"})
    with pytest.raises(TaskSpecError, match="task: a JSON object expected, got list"):
        TaskSpec.from_record({keys.TASK: "[]"})


def test_a_round_s_clients_parse_the_spec_and_their_settings_once(tmp_path, monkeypatch, isolated_cache):
    # Prepare: count the parses of the task spec and of the typed config objects
    specs, parsed = [], []
    from_entry, from_record = TaskSpec.from_entry, node.from_record
    monkeypatch.setattr(TaskSpec, "from_entry", classmethod(lambda cls, text: specs.append(1) or from_entry(text)))
    monkeypatch.setattr(node, "from_record", lambda cls, *a: parsed.append(cls) or from_record(cls, *a))
    monkeypatch.setattr(node, "_PARSED", {})
    cfg = load_scenario(
        None,
        [
            "num_clients=6",
            "rounds=2",
            "dataset.samples_per_client=20",
            "churn.kind=none",
            "strategy.sampler.clients_per_round=4",
            "output.progress=off",
            "output.plots=false",
        ],
    )

    # Execute: 2 rounds of 4 clients through the real ClientApp
    run_server(LocalGrid(client_app, cfg.num_clients), cfg, tmp_path / "out")

    # Assert: 8 clients trained; the worker parsed the spec once, each round's settings and rule options once
    assert sum(len(r["sampled"]) for r in read_metrics(tmp_path / "out") if r["phase"] == "train") == 8
    assert len(specs) == 1
    assert parsed.count(ClientConfig) == 2 and parsed.count(LocalRuleConfig) == 2
