"""Kept for one release: the baseline parts moved to :mod:`strategies.baseline`."""

from fedflex.strategies.baseline import *  # noqa: F401,F403
from fedflex.strategies.baseline import UniformSampler  # noqa: F401 - benchmarks/sampler_cost.py
