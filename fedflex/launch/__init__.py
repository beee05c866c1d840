"""The composition root: the one place that wires the core, the server side
(:mod:`strategies`) and the client side (:mod:`clients`) together.

- :mod:`.cli`: ``fedflex run`` / ``fedflex deploy`` (the console script);
- :mod:`.runner`: a scenario as a Flower simulation (Ray or in-process);
- :mod:`.local_grid`: the in-process grid (one node per client, no Ray);
- :mod:`.cohort_grid`: a round's train messages packed per Ray worker;
- :mod:`.deploy`: real federations of local processes (``fedflex deploy local``);
- :mod:`.study_cli`: ``fedflex sweep`` / ``fedflex compare`` (:mod:`fedflex.study`).

Nothing outside this package imports it; the core modules of :mod:`fedflex` never import
:mod:`strategies` or :mod:`clients`.
"""
