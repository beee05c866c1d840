"""Hugging Face datasets (fedflex.hf): sources, tokenising, natural splits, text models in
runs, and the shipped text / natural-client scenarios at small size, on data the tests
write themselves."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import fedflex
from fedflex.config import ConfigError, DatasetConfig, load_scenario
from fedflex.data import DataNotFoundError, check_data_fits, load_dataset
from fedflex.hf import PAD_ID, UNK_ID, Tokenizer

ROOT = Path(__file__).parents[2]
AGNEWS = ROOT / "scenarios" / "agnews.yaml"
FEMNIST = ROOT / "scenarios" / "femnist.yaml"
THUCNEWS = ROOT / "scenarios" / "thucnews.yaml"
SHAKESPEARE = ROOT / "scenarios" / "shakespeare.yaml"

# each class draws its words from its own list plus shared filler: a linear model separates them
TOPICS = {
    0: "ball goal team match score win coach",
    1: "stock market bank price trade profit share",
    2: "vote election party senate law policy court",
    3: "chip software phone robot data cloud code",
}
FILLER = "the a of and to in on".split()


def _texts(n: int, seed: int) -> dict[str, list]:
    """``n`` short texts in 4 classes (labels in turn 0, 1, 2, 3, 0, ...)."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        y = i % 4
        words = TOPICS[y].split() + FILLER
        texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
        labels.append(y)
    return {"text": texts, "label": labels}


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A data root with ``ag_news/`` (save_to_disk: 400 train, 80 test texts) and the same
    texts as CSV, JSON lines and Parquet files; caches inside tmp_path."""
    import datasets

    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDFLEX_DATA", str(tmp_path / "data"))
    root = tmp_path / "data"
    train, test = datasets.Dataset.from_dict(_texts(400, 0)), datasets.Dataset.from_dict(_texts(80, 1))
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(root / "ag_news"))
    for split, part in (("train", train), ("test", test)):
        part.to_csv(str(root / "files" / f"{split}.csv"), index=False)
        part.to_json(str(root / "files" / f"{split}.jsonl"), lines=True)
        part.to_parquet(str(root / "files" / f"{split}.parquet"))
    return root


def _hf(**kw) -> DatasetConfig:
    cfg = DatasetConfig(name="hf", vocab_size=40, max_len=12, **kw)
    cfg.validate("dataset")
    return cfg


# ---------------------------------------------------------------------------- tokenizer
def _tok(**kw) -> DatasetConfig:
    return _hf(path="unused", **kw)


def test_vocabulary_holds_the_most_frequent_tokens_ties_by_text():
    # Prepare: counts a 3, b 2, c 1, d 1 (lower-cased); two places in the vocabulary
    cfg = _tok(tokenizer="vocab")
    cfg.vocab_size, cfg.max_len = 2, 5

    # Execute
    tok = Tokenizer.fit(cfg, ["B a A", "c a b", "D"])

    # Assert: a -> 2, b -> 3, the rest unknown (1); padded on the right with 0
    assert tok.vocab == ["a", "b"]
    assert tok.encode("a c b") == [2, UNK_ID, 3, PAD_ID, PAD_ID]


def test_truncation_and_padding_sides():
    # Prepare: vocabulary a, b, c, d (each once: text order)
    cfg = _tok()
    cfg.vocab_size, cfg.max_len = 4, 3
    texts = ["a b c d"]

    # Execute / Assert: ids a 2, b 3, c 4, d 5
    cfg.truncation, cfg.padding = "right", "right"
    assert Tokenizer.fit(cfg, texts).encode("a b c d") == [2, 3, 4]
    cfg.truncation = "left"
    assert Tokenizer.fit(cfg, texts).encode("a b c d") == [3, 4, 5]
    cfg.padding = "left"
    assert Tokenizer.fit(cfg, texts).encode("d") == [0, 0, 5]


def test_character_tokens_keep_spaces_and_case_when_asked():
    # Prepare
    cfg = _tok(token_unit="chars", lowercase=False)
    cfg.max_len = 4

    # Execute
    tok = Tokenizer.fit(cfg, ["aA a"])

    # Assert: a x2, ' ' x1, A x1; ties by text: ' ' (32) < 'A' (65)
    assert tok.vocab == ["a", " ", "A"]
    assert tok.encode("A a") == [4, 3, 2, 0]


def test_hashing_tokenizer_ids_are_crc32_buckets():
    # Prepare: 10 buckets
    import zlib

    cfg = _tok(tokenizer="hashing")
    cfg.vocab_size, cfg.max_len = 10, 2

    # Execute
    ids = Tokenizer.fit(cfg, ["anything"]).encode("ball ball")

    # Assert: the same bucket twice, 2 + crc32 mod 10, and no vocabulary kept
    assert ids == [2 + zlib.crc32(b"ball") % 10] * 2
    assert 2 <= ids[0] <= 11


# ---------------------------------------------------------------------------- sources
def test_directory_and_csv_jsonl_parquet_files_give_the_same_tensors(data_root):
    # Execute
    from_dir = load_dataset(_hf(path="ag_news"), 4, 0)
    loaded = {
        ext: load_dataset(_hf(train_files=[f"files/train.{ext}"], test_files=[f"files/test.{ext}"]), 4, 0)
        for ext in ("csv", "jsonl", "parquet")
    }

    # Assert: 400 / 80 texts, 4 classes, token ids [N, 12], identical from every source
    assert (len(from_dir.train), len(from_dir.test), from_dir.train.num_classes) == (400, 80, 4)
    assert from_dir.train.x.dtype == torch.int64 and from_dir.train.input_shape == (12,)
    for ext, data in loaded.items():
        assert torch.equal(data.train.x, from_dir.train.x), ext
        assert torch.equal(data.train.y, from_dir.train.y), ext
        assert torch.equal(data.test.x, from_dir.test.x), ext


def test_tokens_and_vocabulary_are_cached_and_served_without_the_source_reader(data_root, monkeypatch):
    # Prepare
    import fedflex.hf

    cfg = _hf(path="ag_news")
    first = load_dataset(cfg, 4, 0)
    monkeypatch.setattr(fedflex.hf, "_open", lambda *a: pytest.fail("the source was read again"))

    # Execute
    again = load_dataset(_hf(path="ag_news"), 4, 0)

    # Assert: one cache file and its vocabulary beside it: the 35 distinct words (4 topics x 7
    # + 7 filler words) fit in 40 places
    assert len(list((data_root / "fedflex-tensors").glob("hf-*.pt"))) == 1
    vocab = json.loads(next((data_root / "fedflex-tensors").glob("hf-*.vocab.json")).read_text())
    assert len(vocab["tokens"]) == 35 and (vocab["pad"], vocab["unk"]) == (0, 1)
    assert torch.equal(again.train.x, first.train.x) and torch.equal(again.test.y, first.test.y)


def test_a_source_without_a_test_split_holds_out_test_fraction(data_root):
    # Prepare: only the training CSV
    cfg = _hf(train_files=["files/train.csv"], test_fraction=0.25)

    # Execute
    data = load_dataset(cfg, 4, 0)

    # Assert: 100 of the 400 held out
    assert (len(data.train), len(data.test)) == (300, 100)


def test_a_missing_column_names_the_key_and_the_columns(data_root):
    with pytest.raises(ConfigError) as info:
        load_dataset(_hf(path="ag_news", input_column="body"), 4, 0)
    assert info.value.key == "dataset.input_column"
    assert "its columns are text, label" in str(info.value)


def test_an_unknown_dataset_name_is_refused_at_load():
    with pytest.raises(ConfigError) as info:
        load_scenario(None, ["dataset.name=ag_news"])
    assert info.value.key == "dataset.name" and "hf" in str(info.value)


def test_no_local_copy_and_no_network_is_one_line_naming_what_to_provide(data_root, monkeypatch):
    # Prepare: the hub made unreachable the way HF_HUB_OFFLINE=1 does (no network here either)
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = _hf(path="no_such_dir", hub="fancyzhx/ag_news")

    # Execute
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(cfg, 4, 0)

    # Assert: one line; it names the place looked at, the hub failure and what to provide
    message = str(info.value)
    assert "\n" not in message
    assert str(data_root / "no_such_dir") in message
    assert "the hub could not be reached" in message
    assert "provide dataset.path=" in message and "dataset.train_files=" in message


def test_hf_needs_a_source():
    with pytest.raises(ConfigError, match="needs a source"):
        load_scenario(None, ["dataset.name=hf"])


# ---------------------------------------------------------------------------- natural
@pytest.fixture
def writers(tmp_path, monkeypatch):
    """A tiny FEMNIST: 60 grey 28x28 images of 3 writers (w0: 10, w1: 20, w2: 30), 4 classes,
    as save_to_disk in <data root>/femnist (one split, like flwrlabs/femnist)."""
    import datasets

    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDFLEX_DATA", str(tmp_path / "data"))
    rng = np.random.default_rng(0)
    writer = ["w0"] * 10 + ["w1"] * 20 + ["w2"] * 30
    label = [i % 4 for i in range(60)]
    images = [(rng.random((28, 28)) * 60 + 50 * y).astype(np.uint8) for y in label]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "character": datasets.ClassLabel(num_classes=4),
            "writer_id": datasets.Value("string"),
        }
    )
    table = datasets.Dataset.from_dict({"image": images, "character": label, "writer_id": writer}, features=features)
    datasets.DatasetDict({"train": table}).save_to_disk(str(tmp_path / "data" / "femnist"))
    return writer


def test_natural_split_gives_one_client_per_writer(writers):
    # Prepare: 10% held out: 6 images, 54 train
    cfg = load_scenario(FEMNIST, ["num_clients=3", "strategy.sampler.clients_per_round=2"]).dataset

    # Execute
    data = load_dataset(cfg, 3, 0)

    # Assert: images [N, 1, 28, 28] uint8, 4 classes; every training example in exactly one of
    # three clients, each client one writer (the held-out draw removed 6 in all)
    assert data.train.x.shape == (54, 1, 28, 28) and data.train.num_classes == 4
    sizes = sorted(len(ix) for ix in data.natural_partition)
    assert sum(sizes) == 54 and len(sizes) == 3
    assert np.array_equal(np.sort(np.concatenate(data.natural_partition)), np.arange(54))


def test_num_clients_is_checked_against_the_natural_clients(writers):
    # Prepare
    cfg = load_scenario(FEMNIST, ["num_clients=5", "strategy.sampler.clients_per_round=2"])
    data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)

    # Execute / Assert
    with pytest.raises(ConfigError) as info:
        check_data_fits(cfg, data)
    assert info.value.key == "num_clients"
    assert "gives 3 clients: set num_clients=3" in str(info.value)


def test_femnist_scenario_runs_on_writers_under_a_fedscale_trace(writers, tmp_path):
    # Prepare: writers 0 and 2 online in rounds 1-2, writer 1 from round 2 (FedScale clock,
    # 60 s per round: see test_fedscale.py for the mapping)
    from fedflex.fedscale import convert, write_trace

    trace = {
        "10": {"active": [0], "inactive": [70], "finish_time": 10_000},
        "11": {"active": [60], "inactive": [1000], "finish_time": 10_000},
        "12": {"active": [0], "inactive": [60], "finish_time": 10_000},
    }
    write_trace(convert(trace, 60, 3), tmp_path / "trace.csv")
    overrides = [
        "num_clients=3",
        "rounds=3",
        "strategy.sampler.clients_per_round=2",
        "churn.kind=trace",
        f"churn.trace={tmp_path / 'trace.csv'}",
        "evaluation.every=1",
        "output.progress=off",
    ]

    # Execute
    run = fedflex.run(FEMNIST, overrides)

    # Assert: three rounds ran; the online clients were (0, 2), (0, 1, 2), (1)
    assert [r["round"] for r in run.rows] == [1, 2, 3]
    assert [r["online"] for r in run.rows] == [[0, 2], [0, 1, 2], [1]]


# ---------------------------------------------------------------------------- training
def _tiny(*extra: str) -> list[str]:
    return [
        "num_clients=8",
        "rounds=3",
        "partition.alpha=1.0",
        "partition.min_size=1",
        "dataset.vocab_size=40",
        "dataset.max_len=12",
        "client.epochs=1",
        "client.batch_size=16",
        "strategy.sampler.clients_per_round=4",
        "output.progress=off",
        *extra,
    ]


def test_agnews_scenario_learns_the_tiny_texts(data_root):
    # Execute: the shipped scenario, its ag_news/ directory at small size
    run = fedflex.run(AGNEWS, _tiny("simulation.vectorize=off"))

    # Assert: accuracy rises well above chance (0.25) within three rounds
    accuracy = [r["test_accuracy"] for r in run.rows]
    assert accuracy[-1] > 0.6 and accuracy[-1] > accuracy[0]
    assert run.model["fc_out.bias"].shape == (4,)
    assert run.model["body.embedding.weight"].shape == (42, 64)  # vocab_size 40 + padding + unknown


def test_cohorts_train_the_embedding_bag_as_one_by_one(data_root):
    # Execute
    one_by_one = fedflex.run(AGNEWS, _tiny("simulation.vectorize=off"))
    cohorts = fedflex.run(AGNEWS, _tiny("simulation.vectorize=on"))

    # Assert: equal to float rounding
    np.testing.assert_allclose(
        cohorts.model["body.embedding.weight"], one_by_one.model["body.embedding.weight"], atol=1e-5
    )


@pytest.mark.parametrize(
    "parts",
    [
        ["strategy.local_rule.name=scaffold"],
        ["strategy.local_rule.name=fedprox", "strategy.local_rule.mu=0.01"],
        ["strategy.aggregator.name=bherd", "strategy.local_rule.name=bherd", "client.steps=4"],
        ["strategy.sampler.name=hics", "model.name=text-cnn", "model.text_hidden=8"],
        pytest.param(  # an LSTM with Adam: slow (~10 s), the text-cnn entry covers the path by default
            ["model.name=text-lstm", "model.text_hidden=8", "dataset.padding=left", "client.optimizer=adam"],
            marks=pytest.mark.slow,
        ),
    ],
    ids=["scaffold", "fedprox", "bherd", "hics-text-cnn", "text-lstm-adam"],
)
def test_rules_and_models_run_on_text(data_root, parts):
    # Execute
    run = fedflex.run(AGNEWS, _tiny("client.lr=0.05", *parts))

    # Assert: three finished rounds with finite losses
    assert [r["round"] for r in run.rows] == [1, 2, 3]
    assert all(np.isfinite(r["test_loss"]) for r in run.rows)


def test_text_lstm_refuses_forced_cohorts():
    with pytest.raises(ConfigError, match="vmap has no rule for LSTM") as info:
        load_scenario(THUCNEWS, ["simulation.vectorize=on"])
    assert info.value.key == "simulation.vectorize"


def test_text_models_need_token_ids(writers):
    # Prepare: an image dataset with a text model, and a text model without hf
    cfg = load_scenario(FEMNIST, ["num_clients=3", "strategy.sampler.clients_per_round=2"])
    data = load_dataset(cfg.dataset, 3, 0)
    cfg.model.name = "embedding-bag"

    # Execute / Assert
    with pytest.raises(ConfigError, match="gives inputs of shape \\(1, 28, 28\\)"):
        check_data_fits(cfg, data)
    with pytest.raises(ConfigError, match="use it with dataset.name=hf"):
        load_scenario(None, ["model.name=text-cnn"])


def test_shakespeare_scenario_predicts_next_characters_per_speaker(tmp_path, monkeypatch):
    # Prepare: 2 speakers, 80-character windows, the next character as a string label
    import datasets

    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDFLEX_DATA", str(tmp_path / "data"))
    line = "to be or not to be that is the question " * 4
    rows = {"x": [], "y": [], "character_id": []}
    for i in range(60):
        rows["x"].append(line[i : i + 80])
        rows["y"].append(line[i + 80])
        rows["character_id"].append("HAMLET" if i < 30 else "OPHELIA")
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "data" / "shakespeare"))

    # Execute
    run = fedflex.run(
        SHAKESPEARE,
        [
            "num_clients=2",
            "rounds=1",
            "model.text_hidden=8",
            "strategy.sampler.clients_per_round=2",
            "output.progress=off",
        ],
    )

    # Assert: the labels are the distinct next characters (14 in the line: 13 letters + space)
    assert run.model["fc_out.bias"].shape == (len(set(line)),)
    assert run.rows[0]["round"] == 1
