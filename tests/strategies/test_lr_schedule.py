"""Client learning-rate schedules (``client.lr_schedule``): the server computes each
round's lr and sends it as ``client.lr``; the expected values are worked out by hand.

Scenario of the strategy tests: 6 clients, scripted sessions of 3 rounds ({0,1,2}, then
{3,4,5}, cycling), 7 rounds: sessions start in rounds 1, 4 and 7.
"""

import numpy as np
import pytest

from fedflex import keys
from fedflex.clients.client_app import app as client_app
from fedflex.clients.cohort_app import CohortTrainer
from fedflex.config import ClientConfig, ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import load_checkpoint, run_server, train_config
from fedflex.loader import load_scenario, warn_unused
from fedflex.lr_schedule import client_lr
from fedflex.records import record_key
from fedflex.results import read_metrics

BASE = [
    "num_clients=6",
    "rounds=7",
    "dataset.samples_per_client=30",
    "churn.kind=sessions",
    "churn.sessions=[[0,1,2],[3,4,5]]",
    "churn.rounds_per_session=3",
    "strategy.sampler.clients_per_round=3",
    "client.lr=0.1",
    "output.progress=off",
    "output.plots=false",
]
LR = record_key(keys.CLIENT, "lr")


@pytest.fixture(autouse=True)
def _isolated(isolated_cache):  # tests/conftest.py
    yield


class _Recording(LocalGrid):
    """Keeps (round, client.lr) of every train message it delivers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lrs: list[tuple[int, float]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == "train":
                config = m.content[keys.CONFIG]
                self.lrs.append((int(config[keys.SERVER_ROUND]), float(config[LR])))
        return super().send_and_receive(messages, timeout=timeout)


def _run(tmp_path, overrides, grid=None, resume=None):
    cfg = load_scenario(None, BASE + overrides)
    grid = grid or _Recording(client_app, cfg.num_clients)
    result = run_server(grid, cfg, tmp_path, resume=resume)
    return result, read_metrics(tmp_path), grid


def _per_round(sent):
    """round -> the one lr all of that round's messages carried."""
    out: dict[int, set] = {}
    for r, lr in sent:
        out.setdefault(r, set()).add(lr)
    assert all(len(v) == 1 for v in out.values()), out
    return [pytest.approx(out[r].pop()) for r in sorted(out)]


# ---------------------------------------------------------------------------- the formula
@pytest.mark.parametrize(
    "options, expected",
    [
        # exp by round: 0.1 * 0.5^(t-1)
        ({"lr_schedule": "round", "lr_decay": 0.5}, [0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125, 0.0015625]),
        # floor 0.01 from round 5 on (0.00625 < 0.01)
        ({"lr_schedule": "round", "lr_decay": 0.5, "lr_min": 0.01}, [0.1, 0.05, 0.025, 0.0125, 0.01, 0.01, 0.01]),
        # restarts at the session starts 1, 4, 7
        ({"lr_schedule": "session", "lr_decay": 0.5}, [0.1, 0.05, 0.025, 0.1, 0.05, 0.025, 0.1]),
        # poly, power 1, H 4, floor 0.02: 0.08 (1 - t/4) + 0.02 = 0.1, 0.08, 0.06; restart
        (
            {"lr_schedule": "session", "lr_shape": "poly", "lr_power": 1.0, "lr_horizon": 4, "lr_min": 0.02},
            [0.1, 0.08, 0.06, 0.1, 0.08, 0.06, 0.1],
        ),
        # poly, power 2, H 2, by round: 0.1 (1 - t/2)^2 = 0.1, 0.025, then 0 from t = H on
        ({"lr_schedule": "round", "lr_shape": "poly", "lr_power": 2.0, "lr_horizon": 2}, [0.1, 0.025, 0, 0, 0, 0, 0]),
    ],
)
def test_client_lr_by_hand(options, expected):
    client = ClientConfig(lr=0.1, **options)
    starts = {1: 1, 2: 1, 3: 1, 4: 4, 5: 4, 6: 4, 7: 7}
    assert [client_lr(client, r, starts[r]) for r in range(1, 8)] == pytest.approx(expected)


def test_authors_schedule_values():
    # 0.0004 * (1 - t/50)^0.9 + 0.0006: t = 0 -> 0.001, t = 49 -> 0.0004 * 0.02^0.9 + 0.0006
    client = ClientConfig(lr=0.001, lr_schedule="session", lr_shape="poly", lr_horizon=50, lr_min=0.0006)
    assert client_lr(client, 51, 51) == pytest.approx(0.001)
    assert client_lr(client, 100, 51) == pytest.approx(0.0004 * 0.02**0.9 + 0.0006)
    assert client_lr(client, 101, 101) == pytest.approx(0.001)


# ---------------------------------------------------------------------------- the strategy sends it
def test_constant_schedule_leaves_the_train_config_as_before(tmp_path):
    cfg = load_scenario(None, BASE)
    record = dict(train_config(cfg))
    assert record[LR] == 0.1
    # the same client entries as before the schedule existed: its options stay on the server
    assert sorted(k for k in record if k.startswith(keys.CLIENT + ".")) == [
        f"client.{k}"
        for k in ("batch-size", "epochs", "keep-optimizer-state", "lr", "momentum", "optimizer", "weight-decay")
    ]  # keep-optimizer-state: issue 16's other client option (off), sent as a training field
    _, rows, grid = _run(tmp_path, [])
    assert _per_round(grid.lrs) == [0.1] * 7
    assert all("client_lr" not in r for r in rows)


def test_session_schedule_is_sent_and_logged_every_round(tmp_path):
    _, rows, grid = _run(tmp_path, ["client.lr_schedule=session", "client.lr_decay=0.5"])
    expected = [0.1, 0.05, 0.025, 0.1, 0.05, 0.025, 0.1]
    assert _per_round(grid.lrs) == expected
    train = [r for r in rows if r["phase"] == "train"]
    assert [r["client_lr"] for r in train] == pytest.approx(expected)
    assert [r["round"] for r in train if r["session_started"]] == [1, 4, 7]


def test_session_aware_gradient_rounds_run_at_the_sessions_first_lr(tmp_path):
    overrides = ["strategy.initializer.name=session-aware", "client.lr_schedule=session", "client.lr_decay=0.5"]
    _, rows, grid = _run(tmp_path, overrides)
    init = [r for r in rows if r["phase"] == "session-init"]
    assert [r["round"] for r in init] == [4, 7]  # P = 1: from session 1 on
    assert [r["client_lr"] for r in init] == pytest.approx([0.1, 0.1])
    # the extra round's messages carry its session's first lr as well
    assert sorted({lr for r, lr in grid.lrs if r == 4}) == pytest.approx([0.1])


def test_resumed_run_sends_the_same_lrs(tmp_path):
    overrides = ["client.lr_schedule=session", "client.lr_decay=0.5", "output.checkpoint_every=1"]
    _, _, full = _run(tmp_path / "full", overrides)
    # stop after round 5 (inside session 1), then resume from its checkpoint
    _run(tmp_path / "part", overrides + ["rounds=5"])
    checkpoint = load_checkpoint(tmp_path / "part")
    assert checkpoint["round"] == 5
    _, _, rest = _run(tmp_path / "part", overrides, resume=checkpoint)
    assert _per_round(rest.lrs) == _per_round([s for s in full.lrs if s[0] > 5])  # 0.025, 0.1


def test_vectorised_cohort_trains_with_the_sent_lr(tmp_path):
    overrides = ["client.lr_schedule=round", "client.lr_decay=0.5", "rounds=3"]
    a, _, _ = _run(tmp_path / "plain", overrides)
    cohort = _Recording(client_app, 6, train_batch=CohortTrainer("on", cohort_size=3))
    b, _, cohort = _run(tmp_path / "cohort", overrides, grid=cohort)
    assert cohort.train_batch.last_mode == "cohort"
    for key in a.arrays:
        np.testing.assert_allclose(a.arrays[key].numpy(), b.arrays[key].numpy(), rtol=1e-4, atol=1e-6)
    # and the schedule matters: a constant lr ends elsewhere
    c, _, _ = _run(tmp_path / "constant", ["rounds=3"])
    assert any(not np.allclose(a.arrays[k].numpy(), c.arrays[k].numpy()) for k in a.arrays)


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "override, key, fragment",
    [
        ("client.lr_schedule=cosine", "client.lr_schedule", "must be one of constant, round, session"),
        ("client.lr_shape=step", "client.lr_shape", "must be one of exp, poly"),
        ("client.lr_decay=0", "client.lr_decay", "must be > 0 and <= 1"),
        ("client.lr_decay=1.5", "client.lr_decay", "must be > 0 and <= 1"),
        ("client.lr_power=0", "client.lr_power", "must be > 0"),
        ("client.lr_horizon=-1", "client.lr_horizon", "must be >= 0"),
        ("client.lr_min=-0.1", "client.lr_min", "must be >= 0"),
    ],
)
def test_bad_schedule_values_name_the_key(override, key, fragment):
    with pytest.raises(ConfigError) as info:
        load_scenario(None, [override])
    assert info.value.key == key and fragment in str(info.value)


def test_schedule_combinations_that_cannot_work():
    with pytest.raises(ConfigError, match=r"client.lr_min = 0.5: must be <= client.lr \(0.1\)"):
        load_scenario(None, ["client.lr=0.1", "client.lr_schedule=round", "client.lr_min=0.5"])
    with pytest.raises(ConfigError, match="lr_shape=poly needs lr_horizon >= 1"):
        load_scenario(None, ["client.lr_schedule=session", "client.lr_shape=poly"])


def test_server_steps_that_need_the_lr_take_the_rounds_from_the_strategys_facts():
    # BHerd's and FedCM's server steps and HiCS-FL's per-step estimate read the lr the
    # clients train with this round (RoundFacts), so a schedule is no longer refused
    from types import SimpleNamespace

    import numpy as np

    from fedflex.strategies.bherd import BHerdAggregator
    from fedflex.strategies.parts import RoundFacts

    load_scenario(None, ["client.lr_schedule=round", "strategy.local_rule.name=fedcm"])
    load_scenario(
        None, ["client.lr_schedule=round", "strategy.aggregator.name=bherd", "strategy.local_rule.name=bherd"]
    )
    part = BHerdAggregator(lr=0.1, alpha=0.5)
    assert part.round_lr(part.lr) == 0.1  # no strategy: its own
    part.bind(SimpleNamespace(facts=RoundFacts(round=3, online=np.arange(2), lr=0.025)))
    assert part.round_lr(part.lr) == 0.025


def test_schedule_options_the_schedule_ignores_are_warned_about():
    cfg = load_scenario(None, ["client.lr_decay=0.9"])
    assert warn_unused(cfg) == [
        "client.lr_decay=0.9 does nothing for client.lr_schedule constant (read by lr_schedule: round, session)"
    ]
    cfg = load_scenario(None, ["client.lr_schedule=round", "client.lr_power=2.0", "client.lr_decay=0.9"])
    assert warn_unused(cfg) == ["client.lr_power=2.0 does nothing for client.lr_shape exp (read by lr_shape: poly)"]
    cfg = load_scenario(
        None, ["client.lr_schedule=session", "client.lr_shape=poly", "client.lr_horizon=5", "client.lr_min=0.01"]
    )
    assert warn_unused(cfg) == []
