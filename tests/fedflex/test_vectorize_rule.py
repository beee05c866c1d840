"""``simulation.vectorize=rule`` (the default): cohorts or one client at a time, decided
once per run by a fixed rule (no timing) and recorded in config.yaml, so that a resumed
run and a re-run of the saved config train the same way."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import fedflex.clients.cohort
import fedflex.clients.cohort_app
from fedflex.clients.cohort import RULE_CPU_BYTES, _activation_bytes, vectorize_rule
from fedflex.config import ConfigError, ModelConfig, ScenarioConfig, SimulationConfig
from fedflex.launch.cli import main
from fedflex.loader import load_scenario
from fedflex.models import build_model

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
FAST = ["output.progress=off", "output.plots=false", "simulation.backend=local"]
# server momentum: the resumed run must restore the server state to end with the same model
STATEFUL = ["strategy.aggregator.name=fedavgm", "strategy.aggregator.fedavgm.momentum=0.5", "output.checkpoint_every=1"]
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
FMNIST = torch.zeros(1, 1, 28, 28)


def _model(name: str, norm: str = "batch") -> torch.nn.Module:
    with torch.device("meta"):
        return build_model(ModelConfig(name=name, norm=norm), (1, 28, 28), 10)


# ---------------------------------------------------------------------------- the rule
def test_the_activation_sizes_the_rule_reads_are_the_hand_counted_ones():
    # every module's output for one 28x28 example, float32 (the containers' outputs too):
    # logreg: body (flatten) 784 + fc_out 10 + the model's 10 = 804 floats
    assert _activation_bytes(_model("logreg"), FMNIST.to("meta")) == 4 * 804
    # mlp: flatten 784 + linear 200 + relu 200 + body 200 + fc_out 10 + the model's 10 = 1404 floats
    assert _activation_bytes(_model("mlp"), FMNIST.to("meta")) == 4 * 1404
    assert RULE_CPU_BYTES == 64 * 2**20


@pytest.mark.parametrize(
    "model, k, batch, per_client, expected",
    [
        # logreg, 100 clients x 32 x 3,216 B = 9.8 MiB <= 64 MiB
        ("logreg", 100, 32, 60.0, "on"),
        # mlp, 100 x 32 x 5,616 B = 17.1 MiB
        ("mlp", 100, 32, 60.0, "on"),
        ("mlp", 5, 32, 1200.0, "on"),
        # cnn-fmnist, 103.1 KiB per example: 5 x 32 -> 16.1 MiB; 100 x 32 -> 322 MiB
        ("cnn-fmnist", 5, 32, 1200.0, "on"),
        ("cnn-fmnist", 100, 32, 60.0, "off"),
        # ... 100 clients of 10 examples: batches of 10 -> 100.7 MiB, still off; of 5 -> 50.3 MiB, on
        ("cnn-fmnist", 100, 32, 10.0, "off"),
        ("cnn-fmnist", 100, 32, 5.0, "on"),
        # resnet18 (GroupNorm), 6.8 MiB per example: 5 x 32 -> 1.1 GiB
        ("resnet18-group", 5, 32, 1200.0, "off"),
        ("resnet18-group", 100, 32, 60.0, "off"),
    ],
)
def test_the_rule_on_a_cpu(model, k, batch, per_client, expected):
    m = _model(model.removesuffix("-group"), "group" if model.endswith("-group") else "batch")
    choice, why = vectorize_rule(m, FMNIST.to("meta"), CPU, k, batch, per_client)
    assert choice == expected, why
    assert "MiB per batched step" in why


def test_the_rule_takes_cohorts_on_a_gpu_and_never_for_models_or_rounds_it_cannot_batch():
    x = FMNIST.to("meta")
    assert vectorize_rule(_model("resnet18", "group"), x, CUDA, 100, 32, 60.0)[0] == "on"
    choice, why = vectorize_rule(_model("resnet18", "batch"), x, CUDA, 100, 32, 60.0)
    assert choice == "off" and "BatchNorm2d" in why
    assert vectorize_rule(_model("mlp"), x, CUDA, 1, 32, 60.0)[0] == "off"  # one client a round
    # cohort_size caps the cohort: 100 clients in cohorts of 1 is one by one, of 10 fits
    assert vectorize_rule(_model("mlp"), x, CPU, 100, 32, 60.0, cohort_size=1)[0] == "off"
    assert vectorize_rule(_model("cnn-fmnist"), x, CPU, 100, 32, 60.0, cohort_size=10)[0] == "on"


# ---------------------------------------------------------------------------- the config
def test_rule_is_the_default_and_its_choice_is_read_back_from_yaml():
    assert SimulationConfig().vectorize == "rule" and SimulationConfig().vectorize_choice is None
    cfg = load_scenario(QUICKSTART, ["simulation.vectorize_choice=on"])
    assert cfg.simulation.cohorts() == "on"
    assert load_scenario(QUICKSTART, ["simulation.vectorize_choice=off"]).simulation.cohorts() == "off"
    # another vectorize clears a recorded choice; a bad one is refused
    assert (
        load_scenario(QUICKSTART, ["simulation.vectorize=off", "simulation.vectorize_choice=on"]).simulation.cohorts()
        == "off"
    )
    with pytest.raises(ConfigError, match="vectorize_choice"):
        load_scenario(QUICKSTART, ["simulation.vectorize_choice=maybe"])
    # a recorded `on` for a model that cannot be batched is refused like vectorize=on
    with pytest.raises(ConfigError, match="simulation.vectorize_choice"):
        ScenarioConfig(model=ModelConfig(name="resnet18"), simulation=SimulationConfig(vectorize_choice="on"))


def test_the_resolved_config_records_the_choice_and_a_rerun_of_it_repeats_bit_for_bit(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="fedflex.clients.cohort_app")
    # Execute: quickstart (logreg, 5 per round, batches of 10: 5 x 10 x 3.2 KiB) decides `on`
    assert main(["run", str(QUICKSTART), *FAST, "rounds=2", "--out", str(tmp_path / "a")]) == 0
    saved = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert saved["simulation"]["vectorize"] == "rule"
    assert saved["simulation"]["vectorize_choice"] == "on"
    assert "cohorts (simulation.vectorize=rule): in cohorts" in caplog.text
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="fedflex.clients.cohort_app")  # the local backend set INFO
    # ... the saved config, run again, takes it from there and ends with the same model
    assert main(["run", str(tmp_path / "a" / "config.yaml"), "--out", str(tmp_path / "b")]) == 0
    assert "as recorded in the config" in caplog.text
    with np.load(tmp_path / "a" / "model.npz") as a, np.load(tmp_path / "b" / "model.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_a_resumed_run_trains_as_recorded_even_where_the_rule_would_now_decide_otherwise(tmp_path, monkeypatch, caplog):
    # Prepare: the uninterrupted 3-round run; a 2-round run of the same config, then
    # given a third round (its config.yaml edited) to resume: round 3 runs on resume
    assert main(["run", str(QUICKSTART), *FAST, *STATEFUL, "rounds=3", "--out", str(tmp_path / "full")]) == 0
    out = tmp_path / "r"
    assert main(["run", str(QUICKSTART), *FAST, *STATEFUL, "rounds=2", "--out", str(out)]) == 0
    text = (out / "config.yaml").read_text()
    assert "\nrounds: 2\n" in text
    (out / "config.yaml").write_text(text.replace("\nrounds: 2\n", "\nrounds: 3\n"))
    (out / "summary.json").unlink()
    (out / "model.npz").unlink()
    # ... a rule that would now decide `off`, and a spy on how the clients train
    monkeypatch.setattr(fedflex.clients.cohort, "vectorize_rule", lambda *a, **k: ("off", "patched"))
    modes = []
    init = fedflex.clients.cohort_app.CohortTrainer.__init__

    def spy(self, vectorize="auto", cohort_size=0):
        modes.append(vectorize)
        init(self, vectorize, cohort_size)

    monkeypatch.setattr(fedflex.clients.cohort_app.CohortTrainer, "__init__", spy)
    # Execute
    with caplog.at_level(logging.DEBUG, logger="fedflex.clients.cohort_app"):
        assert main(["run", "--resume", str(out)]) == 0
    # Assert: the recorded `on`, not the rule's `off`; the uninterrupted run's model, bit for bit
    assert modes == ["on"]
    assert "as recorded in the config" in caplog.text
    with np.load(tmp_path / "full" / "model.npz") as a, np.load(out / "model.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        assert all(np.array_equal(a[k], b[k]) for k in a.files)


# ---------------------------------------------------------------------------- the decision
@pytest.mark.parametrize("real_bytes", [64 * 2**20, 0])  # small models built on the CPU; all on meta
def test_the_decision_reads_the_same_shapes_on_either_path_and_leaves_the_runs_random_stream(monkeypatch, real_bytes):
    import fedflex.launch.cohort_grid as packing
    from fedflex.data import load_dataset

    monkeypatch.setattr(packing, "REAL_RULE_MODEL_BYTES", real_bytes)
    # quickstart: logreg, 5 clients a round; cnn-fmnist at 100 of 1,000: 100 x 32 x 103.1 KiB > 64 MiB
    expected = {QUICKSTART: "on", ROOT / "scenarios" / "bench_fmnist.yaml": "off"}
    for path, choice in expected.items():
        ov = ["num_clients=1000", "strategy.sampler.clients_per_round=100"] if "bench" in path.name else []
        cfg = load_scenario(path, ov)
        data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)
        torch.manual_seed(123)
        before = torch.rand(3)
        torch.manual_seed(123)
        assert packing.decide_cohorts(cfg, data) == choice
        assert cfg.simulation.vectorize_choice == choice
        assert torch.equal(torch.rand(3), before)  # building the model drew nothing from the run's stream
