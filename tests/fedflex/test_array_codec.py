"""fedflex.arrays' Array codec against Flower's own: the same bytes as ``Array(ndarray)``,
the same arrays as ``Array.numpy()``, and Flower's path for anything else."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from fedflex.arrays import array_to_numpy, numpy_to_array, numpy_to_record, record_to_numpy

RNG = np.random.default_rng(0)
CASES = {
    "conv weight": RNG.normal(size=(16, 1, 5, 5)).astype(np.float32),
    "0-d counter": np.array(7, dtype=np.int64),
    "0-d float": np.array(3.0, dtype=np.float32),
    "bool": np.array([True, False, True]),
    "float16": RNG.normal(size=5).astype(np.float16),
    "float64 matrix": RNG.normal(size=(3, 4)),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "big-endian": np.arange(6, dtype=">i4").reshape(2, 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_encoding_is_flowers_byte_for_byte(name):
    a = CASES[name]
    ours, flowers = numpy_to_array(a), Array(a)
    assert (ours.dtype, ours.shape, ours.stype, ours.data) == (
        flowers.dtype,
        flowers.shape,
        flowers.stype,
        flowers.data,
    )


@pytest.mark.parametrize("name", list(CASES))
def test_decoding_gives_flowers_array_writable(name):
    flowers = Array(CASES[name])
    got, want = array_to_numpy(flowers), flowers.numpy()
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert got.flags.writeable and got.flags.c_contiguous


def test_a_transposed_array_is_sent_in_c_order():
    t = RNG.normal(size=(3, 4)).T  # Fortran-ordered view
    got = array_to_numpy(numpy_to_array(t))
    assert np.array_equal(got, t) and got.shape == (4, 3)


def test_a_fortran_ordered_array_from_flower_is_read_by_flower():
    f = np.asfortranarray(RNG.normal(size=(3, 4)))
    flowers = Array(f)  # its header says fortran_order: True
    assert np.array_equal(array_to_numpy(flowers), f)


def test_bytes_that_disagree_with_dtype_and_shape_go_through_flowers_reader():
    # an Array whose fields claim (2, 2) while its .npy holds 4 values in (4,): Flower reads (4,)
    honest = Array(np.arange(4, dtype=np.float32))
    lying = Array(dtype="float32", shape=(2, 2), stype="numpy.ndarray", data=honest.data)
    assert array_to_numpy(lying).shape == lying.numpy().shape == (4,)


def test_records_round_trip_in_order():
    arrays = {"b": CASES["conv weight"], "a": CASES["0-d counter"]}
    back = record_to_numpy(numpy_to_record(arrays))
    assert list(back) == ["b", "a"] and all(np.array_equal(back[k], arrays[k]) for k in arrays)


def test_a_record_is_flowers_array_by_array():
    arrays = {k.replace(" ", "_"): v for k, v in CASES.items()}
    ours = numpy_to_record(arrays)
    flowers = {k: Array(v) for k, v in arrays.items()}
    assert list(ours) == list(flowers)
    assert all((ours[k].dtype, ours[k].shape, ours[k].data) == (a.dtype, a.shape, a.data) for k, a in flowers.items())
