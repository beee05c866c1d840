"""CountSketch: feature hashing of long vectors to a fixed size, the update proxies that
Clustered Sampling (:mod:`strategies.clustered`) and DivFL (:mod:`strategies.divfl`)
store per client.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class CountSketch:
    """Feature hashing of vectors of any length P to ``dim`` numbers.

    ``y_j = sum_{i: h(i) = j} s(i) x_i`` with bucket ``h(i)`` uniform in ``0..dim-1`` and
    sign ``s(i) = +-1`` drawn once from ``seed`` (Charikar, Chen & Farach-Colton 2002;
    Weinberger et al. 2009): ``E[<y, y'>] = <x, x'>``. Vectors with ``P <= dim`` are
    returned unchanged (as float32).
    """

    def __init__(self, dim: int, seed: int) -> None:
        if dim < 1:
            raise ValueError(f"sketch dim = {dim}: must be >= 1")
        self.dim = dim
        self.seed = seed
        self._size: Optional[int] = None
        self._bucket = np.zeros(0, dtype=np.int64)
        self._sign = np.zeros(0, dtype=np.float64)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Return the sketch of ``x`` (flattened; short vectors are returned as they are)."""
        x = np.ravel(np.asarray(x, dtype=np.float64))
        if x.size <= self.dim:
            return x.astype(np.float32)
        if self._size != x.size:
            rng = np.random.default_rng(self.seed)
            self._bucket = rng.integers(0, self.dim, size=x.size)
            self._sign = rng.integers(0, 2, size=x.size).astype(np.float64) * 2.0 - 1.0
            self._size = x.size
        return np.bincount(self._bucket, weights=self._sign * x, minlength=self.dim).astype(np.float32)
