"""Per-client, per-round local epochs and batch sizes (``client.epochs_range``,
``client.batch_size_range``): FedAWARE's authors' regime.

Expectations by hand: epochs are in [lo, hi]; a batch size is in [lo, min(hi, n - 1)] for a
client with n > lo examples, and n otherwise; a client with n examples, batch b and e epochs
takes e * ceil(n / b) steps; the draw is a function of (seed, round, client) alone.
"""

import json
import math

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

import fedflex.clients.runtime as runtime
from fedflex import keys
from fedflex.clients.client_app import app as client_app
from fedflex.clients.cohort_app import CohortTrainer
from fedflex.clients.train import TrainSettings, drawn_settings
from fedflex.config import ClientConfig, ConfigError
from fedflex.launch.cli import main
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import train_config
from fedflex.loader import load_scenario
from fedflex.records import from_record, to_record
from fedflex.strategies.parts import ServerRule

QUICKSTART = "scenarios/quickstart.yaml"
AUTHORS = (2, 5)  # the authors' epochs: np.random.randint(2, 5 + 1)


@pytest.fixture(autouse=True)
def _isolated(isolated_cache):  # tests/conftest.py
    yield


def _draw(settings, seed=0, server_round=1, client=0, n=600):
    return drawn_settings(settings, seed=seed, server_round=server_round, client=client, num_examples=n)


# ---------------------------------------------------------------------------- the draw
def test_off_returns_the_settings_unchanged():
    settings = TrainSettings(epochs=3, batch_size=64)
    assert _draw(settings) is settings


def test_epochs_are_drawn_in_range_and_every_value_occurs():
    settings = TrainSettings(epochs_range=AUTHORS)
    seen = [_draw(settings, server_round=r, client=c).epochs for r in range(1, 21) for c in range(10)]
    assert set(seen) == {2, 3, 4, 5}  # 200 draws of 4 values: each occurs (all-but-one: p < 1e-24)
    assert all(s.epochs_range is None for s in [_draw(settings)])  # resolved: no range left


def test_batch_size_is_in_lo_to_n_minus_one_and_the_whole_partition_when_small():
    settings = TrainSettings(batch_size_range=(10, 10_000))
    for n in (11, 12, 50, 600):
        sizes = {_draw(settings, server_round=r, n=n).batch_size for r in range(1, 41)}
        assert min(sizes) >= 10 and max(sizes) <= n - 1  # 10..n-1, as randint(10, n)
    assert {_draw(settings, server_round=r, n=11).batch_size for r in range(1, 10)} == {10}  # 10..10
    assert _draw(settings, n=10).batch_size == 10  # n <= lo: one batch of n
    assert _draw(settings, n=3).batch_size == 3
    capped = TrainSettings(batch_size_range=(16, 32))
    assert all(16 <= _draw(capped, server_round=r, n=600).batch_size <= 32 for r in range(1, 30))


def test_a_range_of_one_value_always_gives_it():
    settings = TrainSettings(epochs_range=(3, 3), batch_size_range=(64, 64))
    drawn = _draw(settings, server_round=7, client=4)
    assert (drawn.epochs, drawn.batch_size) == (3, 64)


def test_the_draw_depends_on_seed_round_and_client_only():
    settings = TrainSettings(epochs_range=(1, 100), batch_size_range=(10, 10_000), lr=0.5)
    one = _draw(settings, seed=3, server_round=5, client=7)
    assert _draw(settings, seed=3, server_round=5, client=7) == one  # repeatable
    assert (
        _draw(
            TrainSettings(epochs_range=(1, 100), batch_size_range=(10, 10_000), lr=0.1),
            seed=3,
            server_round=5,
            client=7,
        ).epochs
        == one.epochs
    )  # other fields do not enter
    rounds = {(_draw(settings, seed=3, server_round=r, client=7).epochs) for r in range(1, 11)}
    clients = {(_draw(settings, seed=3, server_round=5, client=c).epochs) for c in range(10)}
    seeds = {(_draw(settings, seed=s, server_round=5, client=7).epochs) for s in range(10)}
    assert len(rounds) > 1 and len(clients) > 1 and len(seeds) > 1  # 10 draws of 1..100: not all equal


def test_each_option_has_its_own_stream():
    # turning the batch-size draw on does not change the epochs a client draws, and back
    both = TrainSettings(epochs_range=AUTHORS, batch_size_range=(10, 10_000))
    for r in range(1, 10):
        assert _draw(both, server_round=r).epochs == _draw(TrainSettings(epochs_range=AUTHORS), server_round=r).epochs
        assert (
            _draw(both, server_round=r).batch_size
            == _draw(TrainSettings(batch_size_range=(10, 10_000)), server_round=r).batch_size
        )


# ---------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "override",
    [
        "client.epochs_range=[5,2]",
        "client.epochs_range=[0,3]",
        "client.epochs_range=[2]",
        "client.epochs_range=[2,3,4]",
        "client.batch_size_range=[64,10]",
        "client.batch_size_range=[0,10]",
    ],
)
def test_bad_ranges_are_refused_naming_the_key(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as info:
        load_scenario(QUICKSTART, [override])
    assert info.value.key == key
    assert "[lo, hi] with integers 1 <= lo <= hi" in str(info.value)


def test_a_non_integer_range_is_refused():
    with pytest.raises(ConfigError) as info:
        load_scenario(QUICKSTART, ["client.epochs_range=[2,3.5]"])
    assert info.value.key.startswith("client.epochs_range")


def test_an_epochs_range_with_steps_is_refused():
    with pytest.raises(ConfigError) as info:
        load_scenario(QUICKSTART, ["client.epochs_range=[2,5]", "client.steps=10"])
    assert info.value.key == "client.epochs_range" and "client.steps" in str(info.value)


def test_options_off_leave_the_train_config_as_before():
    # the train config of quickstart, key by key, as it was before the options existed
    config = dict(train_config(load_scenario(QUICKSTART)))
    config.pop(keys.TASK)
    assert config == {
        "seed": 0,
        "client.epochs": 1,
        "client.batch-size": 10,
        "client.optimizer": "sgd",
        "client.lr": 0.01,
        "client.momentum": 0.0,
        "client.weight-decay": 0.0,
        "client.keep-optimizer-state": False,  # issue 16's other client option, off
    }


def test_ranges_travel_in_the_train_config_and_come_back():
    cfg = load_scenario(QUICKSTART, ["client.epochs_range=[2,5]", "client.batch_size_range=[10,64]"])
    entries = to_record(cfg.client, keys.CLIENT, only=cfg.client.training_fields())
    assert entries["client.epochs-range"] == [2, 5] and entries["client.batch-size-range"] == [10, 64]
    back = from_record(ClientConfig, ConfigRecord(entries), keys.CLIENT)
    assert (back.epochs_range, back.batch_size_range) == ([2, 5], [10, 64])
    settings = TrainSettings.from_client(back)
    assert (settings.epochs_range, settings.batch_size_range) == ((2, 5), (10, 64))


# ---------------------------------------------------------------------------- messages
BASE = [
    "num_clients=6",
    "dataset.samples_per_client=40",
    "churn.kind=none",
    "client.batch_size=8",
    "output.progress=off",
    "output.plots=false",
]
DRAWS = ["client.epochs_range=[1,3]", "client.batch_size_range=[5,20]"]


def _replies(cfg, trainer=None, server_round=1):
    grid = LocalGrid(client_app, cfg.num_clients, seed=1, train_batch=trainer)
    task = runtime.get_task(str(train_config(cfg)[keys.TASK]))
    content = RecordDict({keys.ARRAYS: ArrayRecord({k: v.detach() for k, v in task.model.state_dict().items()})})
    config = ConfigRecord({**train_config(cfg), **ServerRule(cfg.strategy.local_rule).train_config(server_round)})
    config[keys.SERVER_ROUND] = server_round
    content[keys.CONFIG] = config
    messages = [Message(content=content, dst_node_id=n, message_type=MessageType.TRAIN) for n in grid.get_node_ids()]
    replies = grid.send_and_receive(messages)
    assert not any(r.has_error() for r in replies)
    return task, sorted((dict(r.content[keys.METRICS]) for r in replies), key=lambda m: m[keys.PARTITION_ID])


def test_replies_report_the_draw_and_train_that_many_steps():
    cfg = load_scenario(None, BASE + DRAWS)
    task, metrics = _replies(cfg)
    for m in metrics:
        pid, n = m[keys.PARTITION_ID], m[keys.NUM_EXAMPLES]
        e, b = m[keys.LOCAL_EPOCHS], m[keys.LOCAL_BATCH_SIZE]
        assert n == len(task.client_indices(pid))
        assert 1 <= e <= 3 and 5 <= b <= min(20, n - 1)
        assert m[keys.NUM_STEPS] == e * math.ceil(n / b)
        expected = _draw(TrainSettings(epochs_range=(1, 3), batch_size_range=(5, 20)), seed=cfg.seed, client=pid, n=n)
        assert (e, b) == (expected.epochs, expected.batch_size)


def test_replies_without_the_options_have_no_draw_metrics():
    _, metrics = _replies(load_scenario(None, BASE))
    assert all(keys.LOCAL_EPOCHS not in m and keys.LOCAL_BATCH_SIZE not in m for m in metrics)
    assert all(m[keys.NUM_STEPS] == math.ceil(m[keys.NUM_EXAMPLES] / 8) for m in metrics)


def test_fednova_sees_the_real_number_of_steps():
    cfg = load_scenario(None, BASE + DRAWS + ["strategy.local_rule.name=fednova"])
    _, metrics = _replies(cfg)
    for m in metrics:
        assert (
            m[keys.FEDNOVA_TAU]
            == m[keys.NUM_STEPS]
            == m[keys.LOCAL_EPOCHS] * math.ceil(m[keys.NUM_EXAMPLES] / m[keys.LOCAL_BATCH_SIZE])
        )
        assert m[keys.FEDNOVA_A_NORM] == pytest.approx(m[keys.NUM_STEPS])  # plain SGD: ||a||_1 = tau


def test_cohorts_fall_back_to_one_by_one_with_the_same_replies(caplog):
    cfg = load_scenario(None, BASE + DRAWS)
    _, plain = _replies(cfg)
    trainer = CohortTrainer("on")
    with caplog.at_level("INFO", logger="fedflex.clients.cohort_app"):
        _, cohort = _replies(cfg, trainer)
    assert trainer.last_mode == "sequential"
    assert "drew different epochs / batch sizes" in caplog.text and "one client at a time" in caplog.text
    assert cohort == plain  # one by one both times: the same numbers


# ---------------------------------------------------------------------------- a real run
def test_a_quickstart_run_with_the_draws_logs_them(tmp_path):
    out = tmp_path / "o"
    args = ["simulation.backend=local", "rounds=2", "output.progress=off", "output.plots=false"]
    code = main(["run", QUICKSTART, "--out", str(out), *args, "client.epochs_range=[2,5]",
                 "client.batch_size_range=[10,10000]"])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    cfg = load_scenario(QUICKSTART)
    task = runtime.get_task(str(train_config(cfg)[keys.TASK]))
    for row in rows:
        draws = row["local_draws"]
        assert [d[0] for d in draws] == sorted(row["sampled"])
        for client, epochs, batch, steps in draws:
            n = len(task.client_indices(client))
            assert 2 <= epochs <= 5 and 10 <= batch <= n - 1
            assert steps == epochs * math.ceil(n / batch)
            want = _draw(TrainSettings(epochs_range=AUTHORS, batch_size_range=(10, 10_000)), seed=0,
                         server_round=row["round"], client=client, n=n)  # fmt: skip
            assert (epochs, batch) == (want.epochs, want.batch_size)
    plain = tmp_path / "plain"
    assert main(["run", QUICKSTART, "--out", str(plain), *args]) == 0
    assert all("local_draws" not in json.loads(line) for line in (plain / "metrics.jsonl").read_text().splitlines())


def test_packed_cohort_messages_draw_what_single_messages_draw():
    # the Ray cohort path (CohortGrid packs a round into one message per worker) over an
    # in-process grid: each client reports the draw and steps the plain path gives it
    from fedflex.launch.cohort_grid import CohortGrid

    cfg = load_scenario(None, BASE + DRAWS)
    _, plain = _replies(cfg)
    inner = LocalGrid(client_app, cfg.num_clients, seed=1)
    client_of = {n: int(c.node_config["partition-id"]) for n, c in inner.contexts.items()}
    packed = CohortGrid(inner, client_of.get, workers=2, vectorize="on")
    task = runtime.get_task(str(train_config(cfg)[keys.TASK]))
    content = RecordDict({keys.ARRAYS: ArrayRecord({k: v.detach() for k, v in task.model.state_dict().items()})})
    config = ConfigRecord({**train_config(cfg), **ServerRule(cfg.strategy.local_rule).train_config(1)})
    config[keys.SERVER_ROUND] = 1
    content[keys.CONFIG] = config
    messages = [Message(content=content, dst_node_id=n, message_type=MessageType.TRAIN) for n in packed.get_node_ids()]
    got = sorted(
        (dict(r.content[keys.METRICS]) for r in packed.send_and_receive(messages)), key=lambda m: m[keys.PARTITION_ID]
    )
    fields = (keys.PARTITION_ID, keys.LOCAL_EPOCHS, keys.LOCAL_BATCH_SIZE, keys.NUM_STEPS)
    assert [[m[f] for f in fields] for m in got] == [[m[f] for f in fields] for m in plain]
