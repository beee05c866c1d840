"""Tests for fedflex.partition: the split schemes, the Partition record and its cache."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import fedflex.partition.cache as partition_cache
from fedflex.config import PartitionConfig
from fedflex.partition import (
    Partition,
    cached_partition,
    default_cache_dir,
    dirichlet_partition,
    iid_partition,
    label_entropy,
    label_set_partition,
    make_partition,
    mixed_dirichlet_partition,
    session_label_sets,
    shard_partition,
)

# 10 labels x 100 examples, label-sorted: example i has label i // 100
LABELS = np.repeat(np.arange(10), 100)
LN2, LN10 = math.log(2), math.log(10)


def labels_of(part: Partition) -> list[set[int]]:
    return [set(s) for s in part.client_labels]


def assert_disjoint(indices: list[np.ndarray]) -> np.ndarray:
    flat = np.concatenate(indices)
    assert len(np.unique(flat)) == len(flat), "an example went to two clients"
    return flat


# ---------------------------------------------------------------------------- label_entropy
def test_label_entropy_of_two_equal_labels_is_ln2():
    # Prepare
    counts = np.array([[5, 5, 0]])

    # Execute
    h = label_entropy(counts)

    # Assert: -2 * 0.5 ln 0.5 = ln 2; the empty label adds 0 * log 0 = 0
    assert h == pytest.approx([LN2])


def test_label_entropy_of_one_label_is_zero():
    # Prepare / Execute
    h = label_entropy(np.array([[10, 0]]))

    # Assert
    assert h == pytest.approx([0.0])


def test_label_entropy_of_uniform_ten_labels_is_ln10():
    # Prepare / Execute
    h = label_entropy(np.full((1, 10), 7))

    # Assert
    assert h == pytest.approx([LN10])


def test_label_entropy_of_empty_row_is_zero_and_rows_are_independent():
    # Prepare
    counts = np.array([[0, 0, 0], [1, 1, 1]])

    # Execute
    h = label_entropy(counts)

    # Assert
    assert h == pytest.approx([0.0, math.log(3)])


def test_label_entropy_rejects_negative_counts():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="non-negative"):
        label_entropy(np.array([[1, -1]]))


# ---------------------------------------------------------------------------- Partition
def test_partition_views_follow_label_counts():
    # Prepare
    part = Partition(indices=[np.array([3, 1]), np.array([2])], label_counts=np.array([[1, 1], [0, 1]]))

    # Execute
    client_labels, sizes, entropies = part.client_labels, part.sizes, part.entropies()

    # Assert: indices come back sorted int64
    assert client_labels == [frozenset({0, 1}), frozenset({1})]
    assert sizes.tolist() == [2, 1]
    assert entropies == pytest.approx([LN2, 0.0])
    assert part.indices[0].tolist() == [1, 3]
    assert part.indices[0].dtype == np.int64


def test_partition_rejects_counts_of_the_wrong_shape():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="num_clients=2"):
        Partition(indices=[np.array([0]), np.array([1])], label_counts=np.zeros((3, 2)))


def test_npz_round_trip_gives_an_equal_partition(tmp_path: Path):
    # Prepare
    part = make_partition(PartitionConfig(scheme="dirichlet", alpha=0.5), LABELS, 7, 10, seed=3)
    path = tmp_path / "sub" / "p.npz"

    # Execute
    part.to_npz(path)
    loaded = Partition.from_npz(path)

    # Assert
    assert loaded == part
    assert [p.dtype for p in loaded.indices] == [np.int64] * 7
    assert list(path.parent.iterdir()) == [path], "temporary file left behind"


def test_from_npz_rejects_a_file_that_is_not_a_partition(tmp_path: Path):
    # Prepare
    path = tmp_path / "other.npz"
    np.savez(path, something=np.arange(3))

    # Execute / Assert
    with pytest.raises(ValueError, match="not a partition"):
        Partition.from_npz(path)


# ---------------------------------------------------------------------------- iid
def test_iid_sizes_differ_by_at_most_one():
    # Prepare: 1000 = 334 + 333 + 333

    # Execute
    indices = iid_partition(LABELS, 3, seed=0)

    # Assert
    assert [len(ix) for ix in indices] == [334, 333, 333]


def test_iid_covers_every_example_once():
    # Prepare / Execute
    indices = iid_partition(LABELS, 3, seed=0)

    # Assert
    flat = assert_disjoint(indices)
    assert sorted(flat.tolist()) == list(range(1000))


def test_iid_is_random_not_contiguous():
    # Prepare / Execute
    part = make_partition(PartitionConfig(scheme="iid"), LABELS, 2, 10, seed=0)

    # Assert: a contiguous cut of the label-sorted set would give labels 0-4 / 5-9
    assert labels_of(part) == [set(range(10))] * 2


def test_more_clients_than_examples_is_refused():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="5 examples"):
        make_partition(PartitionConfig(scheme="iid"), LABELS[:5], 6, 10, seed=0)


# ---------------------------------------------------------------------------- determinism
SCHEMES = [
    PartitionConfig(scheme="iid"),
    PartitionConfig(scheme="dirichlet", alpha=0.5),
    PartitionConfig(scheme="shards", labels_per_client=2),
    PartitionConfig(scheme="mixed-dirichlet", alphas=[0.01, 1.0]),
    PartitionConfig(scheme="label-sets", pattern="two-shard"),
    PartitionConfig(scheme="label-sets", pattern="sessions", alpha=0.3, overlap=0.2),
    PartitionConfig(scheme="label-sets", pattern="half"),
]
SCHEME_IDS = ["iid", "dirichlet", "shards", "mixed", "two-shard", "sessions", "half"]


@pytest.mark.parametrize("cfg", SCHEMES, ids=SCHEME_IDS)
def test_same_seed_gives_the_same_partition(cfg: PartitionConfig):
    # Prepare / Execute
    first = make_partition(cfg, LABELS, 10, 10, seed=5)
    second = make_partition(cfg, LABELS, 10, 10, seed=5)

    # Assert
    assert first == second


@pytest.mark.parametrize("cfg", SCHEMES, ids=SCHEME_IDS)
def test_another_seed_gives_another_partition(cfg: PartitionConfig):
    # Prepare / Execute
    first = make_partition(cfg, LABELS, 10, 10, seed=5)
    second = make_partition(cfg, LABELS, 10, 10, seed=6)

    # Assert
    assert first != second


@pytest.mark.parametrize("cfg", SCHEMES, ids=SCHEME_IDS)
def test_no_example_goes_to_two_clients(cfg: PartitionConfig):
    # Prepare / Execute
    part = make_partition(cfg, LABELS, 10, 10, seed=1)

    # Assert: and label_counts agree with the indices
    assert_disjoint(part.indices)
    for ix, row in zip(part.indices, part.label_counts):
        assert np.bincount(LABELS[ix], minlength=10).tolist() == row.tolist()


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "mixed-dirichlet", "shards"])
def test_schemes_that_use_every_example_cover_the_set(scheme: str):
    # Prepare
    cfg = PartitionConfig(scheme=scheme, alpha=0.3, alphas=[0.1, 10.0], labels_per_client=3)

    # Execute
    part = make_partition(cfg, LABELS, 10, 10, seed=2)

    # Assert
    assert part.sizes.sum() == 1000
    assert part.label_counts.sum(axis=0).tolist() == [100] * 10


# ---------------------------------------------------------------------------- dirichlet
def test_tiny_alpha_gives_clients_about_one_label():
    # Prepare: Dirichlet(0.001) puts each label (almost) wholly on one client
    cfg = PartitionConfig(scheme="dirichlet", alpha=0.001, min_size=1)

    # Execute
    part = make_partition(cfg, LABELS, 10, 10, seed=0)

    # Assert: ln 10 = 2.30 for a uniform client; two labels at most give ln 2 = 0.69
    assert part.entropies().mean() < 0.5
    assert part.sizes.min() >= 1


def test_huge_alpha_gives_nearly_uniform_clients():
    # Prepare
    cfg = PartitionConfig(scheme="dirichlet", alpha=1000.0)

    # Execute
    part = make_partition(cfg, LABELS, 10, 10, seed=0)

    # Assert
    assert part.entropies().min() > LN10 - 0.05


def test_dirichlet_respects_min_size():
    # Prepare / Execute
    indices = dirichlet_partition(LABELS, 10, alpha=0.1, seed=4, min_size=20)

    # Assert
    assert min(len(ix) for ix in indices) >= 20


def test_dirichlet_needs_positive_alpha():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_partition(LABELS, 3, alpha=0.0, seed=0)


# ---------------------------------------------------------------------------- shards
@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_give_each_client_exactly_k_labels(k: int):
    # Prepare / Execute
    part = make_partition(PartitionConfig(scheme="shards", labels_per_client=k), LABELS, 12, 10, seed=0)

    # Assert
    assert [len(s) for s in part.client_labels] == [k] * 12


def test_shards_first_label_of_client_i_is_i_mod_c():
    # Prepare / Execute: class_assignment_mode="first-deterministic"
    part = make_partition(PartitionConfig(scheme="shards", labels_per_client=2), LABELS, 12, 10, seed=0)

    # Assert
    assert all(i % 10 in labels for i, labels in enumerate(labels_of(part)))


def test_shards_refuse_more_labels_than_classes():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="labels_per_client = 11"):
        shard_partition(LABELS, 5, 11, seed=0)


# ---------------------------------------------------------------------------- mixed-dirichlet
def test_mixed_dirichlet_gives_each_group_an_equal_part():
    # Prepare: 2 alphas -> 2 groups of 5 clients, 500 examples each

    # Execute
    indices = mixed_dirichlet_partition(LABELS, 10, [0.001, 1000.0], seed=0)

    # Assert
    assert sum(len(ix) for ix in indices[:5]) == 500
    assert sum(len(ix) for ix in indices[5:]) == 500


def test_mixed_dirichlet_entropy_follows_the_group_alpha():
    # Prepare
    cfg = PartitionConfig(scheme="mixed-dirichlet", alphas=[0.001, 1000.0])

    # Execute
    h = make_partition(cfg, LABELS, 10, 10, seed=0).entropies()

    # Assert: 5 clients over 10 labels hold ~2 labels (ln 2) at alpha 0.001, ~all 10 at 1000
    assert h[:5].max() < h[5:].min()
    assert h[5:].min() > LN10 - 0.05


def test_mixed_dirichlet_tiny_alpha_leaves_no_client_empty():
    # Prepare: HiCS-FL setting (2): 5 groups of 10 clients
    cfg = PartitionConfig(scheme="mixed-dirichlet", alphas=[0.001, 0.002, 0.005, 0.01, 0.2])
    labels = np.repeat(np.arange(10), 500)

    # Execute
    part = make_partition(cfg, labels, 50, 10, seed=0)

    # Assert: the 0.001 group holds about one label per client
    assert part.sizes.min() >= 1
    assert part.entropies()[:10].mean() < 0.5


def test_mixed_dirichlet_needs_a_multiple_of_the_group_count():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="multiple of len"):
        mixed_dirichlet_partition(LABELS, 7, [0.1, 1.0], seed=0)


# ---------------------------------------------------------------------------- label sets (v1)
def test_half_gives_labels_0_4_to_first_half_and_5_9_to_second():
    # Prepare / Execute
    part = make_partition(PartitionConfig(scheme="label-sets", pattern="half"), LABELS, 10, 10, seed=0)

    # Assert: 5 labels x 100 examples / 5 clients = 100 per client, 20 of each label
    assert labels_of(part) == [set(range(5))] * 5 + [set(range(5, 10))] * 5
    assert part.sizes.tolist() == [100] * 10
    assert set(part.label_counts[part.label_counts > 0].tolist()) == {20}


def test_partial_overlap_shares_labels_4_and_5():
    # Prepare / Execute
    indices, layout = label_set_partition(LABELS, 10, "partial-overlap", seed=0, num_classes=10)
    counts = np.stack([np.bincount(LABELS[ix], minlength=10) for ix in indices])

    # Assert: sets 0-5 and 4-9; the shared labels are halved between the client halves
    assert layout.label_sets == [[0, 1, 2, 3, 4, 5], [4, 5, 6, 7, 8, 9]]
    assert [set(np.flatnonzero(r).tolist()) for r in counts] == [set(range(6))] * 5 + [set(range(4, 10))] * 5
    assert counts[:5, 4].sum() == counts[5:, 4].sum() == 50
    assert counts[:5, 0].sum() == 100


def test_distinct_gives_client_i_label_i():
    # Prepare / Execute
    part = make_partition(PartitionConfig(scheme="label-sets", pattern="distinct"), LABELS, 10, 10, seed=0)

    # Assert
    assert labels_of(part) == [{i} for i in range(10)]
    assert part.sizes.tolist() == [100] * 10


def test_distinct_cycles_labels_when_clients_outnumber_them():
    # Prepare / Execute
    part = make_partition(PartitionConfig(scheme="label-sets", pattern="distinct"), LABELS, 20, 10, seed=0)

    # Assert: clients i and i + 10 share label i, 50 examples each
    assert labels_of(part) == [{i % 10} for i in range(20)]
    assert part.sizes.tolist() == [50] * 20


def test_two_shard_gives_two_labels_each_and_halves_every_label():
    # Prepare / Execute
    part = make_partition(PartitionConfig(scheme="label-sets", pattern="two-shard"), LABELS, 10, 10, seed=0)

    # Assert: every label in 2 shards of 50, held by 2 clients
    assert [len(s) for s in part.client_labels] == [2] * 10
    assert (part.label_counts > 0).sum(axis=0).tolist() == [2] * 10
    assert set(part.label_counts[part.label_counts > 0].tolist()) == {50}


def test_unknown_pattern_is_refused():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="pattern = 'quarter'"):
        label_set_partition(LABELS, 4, "quarter", seed=0)


# ---------------------------------------------------------------------------- label sets (v2 sessions)
@pytest.mark.parametrize(
    ("overlap", "set_a", "set_b"),
    [
        (0.0, [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]),  # half split
        (0.2, [0, 1, 2, 3, 4], [4, 5, 6, 7, 8]),  # G = floor(10 / 1.8) = 5, O = 1
        (0.5, [0, 1, 2, 3, 4, 5], [3, 4, 5, 6, 7, 8]),  # G = floor(10 / 1.5) = 6, O = 3
    ],
)
def test_session_label_sets_alternate_two_sets_with_the_overlap(overlap, set_a, set_b):
    # Prepare / Execute
    sets = session_label_sets(10, 6, overlap)

    # Assert
    assert sets == [set_a, set_b] * 3
    assert len(set(set_a) & set(set_b)) / len(set_a) == pytest.approx(overlap)


def test_sessions_pattern_keeps_each_half_inside_its_label_set():
    # Prepare: 20 clients (two groups of 10), overlap 0.2 -> A = 0-4, B = 4-8, 9 unused
    cfg = PartitionConfig(scheme="label-sets", pattern="sessions", alpha=0.3, overlap=0.2, num_label_sets=6)

    # Execute
    part = make_partition(cfg, LABELS, 20, 10, seed=0)

    # Assert: label 4 halved between the groups; each client the same quota
    # (group A: 4 x 100 + 50 = 450 examples / 10 clients = 45)
    assert all(s <= set(range(5)) for s in labels_of(part)[:10])
    assert all(s <= set(range(4, 9)) for s in labels_of(part)[10:])
    assert part.label_counts[:, 9].sum() == 0
    assert part.label_counts[:10, 4].sum() == part.label_counts[10:, 4].sum() == 50
    assert part.sizes.tolist() == [45] * 20


def test_sessions_layout_lists_one_label_set_per_session():
    # Prepare / Execute
    _, layout = label_set_partition(
        LABELS, 20, "sessions", seed=0, num_classes=10, alpha=0.3, overlap=0.0, num_label_sets=6
    )

    # Assert
    assert layout.groups == [list(range(10)), list(range(10, 20))]
    assert layout.session_labels == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]] * 3


def test_sessions_small_alpha_is_more_skewed_than_large_alpha():
    # Prepare
    labels = np.repeat(np.arange(10), 400)

    def sessions(alpha: float) -> PartitionConfig:
        return PartitionConfig(scheme="label-sets", pattern="sessions", alpha=alpha)

    # Execute
    skewed = make_partition(sessions(0.05), labels, 20, 10, seed=0)
    even = make_partition(sessions(100.0), labels, 20, 10, seed=0)

    # Assert: 5 labels per group, ln 5 = 1.61 at most
    assert skewed.entropies().mean() < even.entropies().mean()
    assert even.entropies().mean() > math.log(5) - 0.1


# ---------------------------------------------------------------------------- natural and errors
def test_natural_uses_the_given_split():
    # Prepare
    natural = [np.array([5, 0]), np.array([999])]

    # Execute
    part = make_partition(PartitionConfig(scheme="natural"), LABELS, 2, 10, seed=0, natural=natural)

    # Assert
    assert [ix.tolist() for ix in part.indices] == [[0, 5], [999]]
    assert labels_of(part) == [{0}, {9}]


def test_natural_without_a_split_is_refused():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="natural"):
        make_partition(PartitionConfig(scheme="natural"), LABELS, 2, 10, seed=0)


def test_natural_split_sharing_an_example_is_refused():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="more than one client"):
        make_partition(PartitionConfig(scheme="natural"), LABELS, 2, 10, 0, natural=[np.array([1]), np.array([1])])


def test_labels_outside_the_classes_are_refused():
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match=r"0\.\.4"):
        make_partition(PartitionConfig(scheme="iid"), LABELS, 2, 5, seed=0)


# ---------------------------------------------------------------------------- cache
def test_cached_partition_equals_make_partition(tmp_path: Path):
    # Prepare
    cfg = PartitionConfig(scheme="dirichlet", alpha=0.5)

    # Execute
    cached = cached_partition(cfg, LABELS, 5, 10, seed=1, cache_dir=tmp_path)

    # Assert
    assert cached == make_partition(cfg, LABELS, 5, 10, seed=1)
    assert len(list(tmp_path.glob("partition-dirichlet-*.npz"))) == 1


def test_cached_partition_loads_from_disk_the_second_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Prepare
    cfg = PartitionConfig(scheme="iid")
    first = cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("recomputed instead of loading the cache")

    monkeypatch.setattr(partition_cache, "make_partition", refuse)

    # Execute
    second = cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)

    # Assert
    assert second == first


def test_cache_key_changes_with_seed_and_labels(tmp_path: Path):
    # Prepare
    cfg = PartitionConfig(scheme="iid")

    # Execute
    cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)
    cached_partition(cfg, LABELS, 4, 10, seed=2, cache_dir=tmp_path)
    cached_partition(cfg, LABELS[::-1].copy(), 4, 10, seed=1, cache_dir=tmp_path)

    # Assert
    assert len(list(tmp_path.glob("*.npz"))) == 3


def test_unreadable_cache_file_is_recomputed(tmp_path: Path):
    # Prepare
    cfg = PartitionConfig(scheme="iid")
    cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    path.write_bytes(b"not a zip file")

    # Execute
    part = cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)

    # Assert: recomputed and rewritten
    assert part == make_partition(cfg, LABELS, 4, 10, seed=1)
    assert Partition.from_npz(path) == part


def _garble(raw: bytes) -> bytes:
    """Every byte of the middle third inverted (the zip's CRC no longer matches)."""
    a, b = len(raw) // 3, 2 * len(raw) // 3
    return raw[:a] + bytes(255 - x for x in raw[a:b]) + raw[b:]


@pytest.mark.parametrize(
    "damage",
    [lambda raw: raw[: len(raw) // 2], lambda raw: b"", _garble],
    ids=["truncated", "emptied", "garbled"],
)
def test_damaged_cache_file_is_recomputed_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage):
    # Prepare
    cfg = PartitionConfig(scheme="iid")
    cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    path.write_bytes(damage(path.read_bytes()))

    # Execute
    part = cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)

    # Assert: recomputed, rewritten, and said so
    assert part == make_partition(cfg, LABELS, 4, 10, seed=1)
    assert Partition.from_npz(path) == part
    assert "is unreadable" in caplog.text and "recomputing it" in caplog.text


def _write_partition_file(path: Path, indices: list[list[int]]) -> None:
    """A well-formed partition file holding ``indices`` (label counts of LABELS; an index
    past its end counts as the last label)."""
    counts = np.stack([np.bincount(np.take(LABELS, ix, mode="clip"), minlength=10) for ix in indices])
    offsets = np.concatenate([[0], np.cumsum([len(ix) for ix in indices])]).astype(np.int64)
    flat = np.array([i for ix in indices for i in ix], dtype=np.int64)
    np.savez(path, flat=flat, offsets=offsets, label_counts=counts)


@pytest.mark.parametrize(
    "indices, reason",
    [
        ([[0, 1], [2], [3], [1000]], "indices outside 0..999"),  # LABELS has 1000 examples
        ([[0, 1], [2], [3]], "3 clients, not 4"),
        ([[0, 1], [1], [3], [4]], "given to a client twice, or to two clients"),
    ],
    ids=["out-of-range", "wrong-clients", "duplicate"],
)
def test_inconsistent_cache_file_is_recomputed_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, indices, reason
):
    # Prepare: a well-formed file with wrong indices in the place of the real one
    cfg = PartitionConfig(scheme="iid")
    cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    _write_partition_file(path, indices)

    # Execute
    part = cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)

    # Assert
    assert part == make_partition(cfg, LABELS, 4, 10, seed=1)
    assert Partition.from_npz(path) == part
    assert reason in caplog.text and "recomputing it" in caplog.text


def test_cache_file_whose_label_counts_do_not_match_its_indices_is_recomputed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    # Prepare: the right indices, but client 0's counts moved from label 0 to label 1
    cfg = PartitionConfig(scheme="iid")
    real = cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    counts = real.label_counts.copy()
    counts[0, 1] += counts[0, 0]
    counts[0, 0] = 0
    Partition(indices=real.indices, label_counts=counts).to_npz(path)

    # Execute
    part = cached_partition(cfg, LABELS, 4, 10, seed=1, cache_dir=tmp_path)

    # Assert
    assert part == real and np.array_equal(Partition.from_npz(path).label_counts, real.label_counts)
    assert "label counts that do not match its indices" in caplog.text


def test_default_cache_dir_follows_fedflex_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Prepare
    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path))

    # Execute
    directory = default_cache_dir()

    # Assert
    assert directory == tmp_path / "partitions"


def test_half_iid_is_bherds_case_3():
    # Prepare: 20 examples of each of 10 labels, 5 clients
    y = np.repeat(np.arange(10), 20)

    # Execute
    indices, layout = label_set_partition(y, 5, "half-iid", seed=0, num_classes=10)
    counts = np.stack([np.bincount(y[ix], minlength=10) for ix in indices])

    # Assert: labels 0-4 over clients 0-2 evenly (20 = 7 + 7 + 6 of each), labels 5-9 in
    # blocks {5, 6, 7} and {8, 9} whole on clients 3 and 4
    assert counts[:3, :5].tolist() == [[7] * 5, [7] * 5, [6] * 5]
    assert counts[:3, 5:].sum() == 0
    assert counts[3].tolist() == [0] * 5 + [20, 20, 20, 0, 0]
    assert counts[4].tolist() == [0] * 8 + [20, 20]
    assert layout.label_sets == [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9]]
