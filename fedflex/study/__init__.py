"""Studies: many runs of one scenario, and what they say together.

- :mod:`.runs`: the state of a run directory (finished, resumable, failed), read from its files;
- :mod:`.sweep`: ``fedflex sweep``, a scenario over a grid of overrides and seeds;
- :mod:`.compare`: ``fedflex compare``, tables and seed-banded curves over groups of runs.

Core modules: they start runs as ``fedflex run`` processes and read run directories, and
import no strategy, no client and not :mod:`fedflex.launch`.
"""
