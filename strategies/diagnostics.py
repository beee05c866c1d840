"""Diagnostics every round reports, whatever the parts.

- ``e_lud``: empirical local update diversity, FedAWARE's metric (Zeng, Xu, Liu, Pan,
  Wang & Tang, "On the Power of Adaptive Weighted Aggregation in Heterogeneous
  Federated Learning and Beyond", 2023, https://arxiv.org/abs/2310.02702): how spread
  the clients' updates are around their mean, reported by the strategy for every
  aggregator (``e_lud`` in metrics.jsonl, ``e_ludd`` in summary.json).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from fedflex.arrays import is_float
from fedflex.strategies.parts import Arrays

BLOCK_BYTES = 32 * 2**20  # e_lud's float64 working block


def e_lud(global_arrays: Arrays, client_arrays: Sequence[Arrays]) -> Optional[float]:
    """Empirical local update diversity of one round (the paper's e-LUD).

    sqrt(mean_i ||g_i||^2) / ||mean_i g_i|| with g_i = x - x_i over the float entries,
    plain (unweighted) means over the clients whose uploads were aggregated.

    Returns
    -------
    float or None
        None when there is no upload or the mean update is zero (the ratio is undefined).
    """
    n = len(client_arrays)
    if n == 0:
        return None
    sum_sq = 0.0
    mean_sq = 0.0
    for key, x in global_arrays.items():
        if not is_float(x):
            continue
        x64 = np.asarray(x, dtype=np.float64).ravel()
        acc = np.zeros_like(x64)
        # the clients' updates of this entry as rows, in blocks of at most BLOCK_BYTES:
        # one numpy call per block instead of three per client (10,000-client runs)
        step = max(1, BLOCK_BYTES // max(1, x64.nbytes))
        for start in range(0, n, step):
            g = x64 - np.stack([np.asarray(arrays[key]).ravel() for arrays in client_arrays[start : start + step]])
            sum_sq += float(np.einsum("ij,ij->", g, g))
            acc += g.sum(axis=0)
        acc /= n
        mean_sq += float(acc @ acc)
    if mean_sq <= 0.0:
        return None
    return math.sqrt(sum_sq / n) / math.sqrt(mean_sq)
