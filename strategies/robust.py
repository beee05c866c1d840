"""Byzantine-robust aggregation and update-norm clipping, with Flower's own functions.

- ``median``: the coordinate-wise median of the replies (Flower's ``FedMedian``; Yin et
  al., "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates", ICML
  2018, https://arxiv.org/abs/1803.01498);
- ``trimmed-mean``: per coordinate, the mean after cutting ``floor(beta n)`` replies off
  each tail (Flower's ``FedTrimmedAvg`` and its ``trim_mean``; same paper);
- ``krum`` / ``multikrum``: the reply (the m replies) whose summed squared distance to
  its n - f - 2 nearest replies is smallest, multikrum averaging them by examples
  (Flower's ``Krum`` / ``MultiKrum``: ``select_multikrum``, ``aggregate_arrayrecords``;
  Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
  Descent", NeurIPS 2017, https://arxiv.org/abs/1703.02757);
- ``bulyan``: multikrum selects theta = n - 2f replies, then per coordinate the mean of
  the theta - 2f values closest to their median (Flower's ``Bulyan``:
  ``select_multikrum``, ``aggregate_n_closest_weights``; El Mhamdi et al., "The Hidden
  Vulnerability of Distributed Learning in Byzantium", ICML 2018,
  https://arxiv.org/abs/1802.07927).

Flower's strategies take Messages, which exist only inside a run, so the aggregators
call the functions Flower's ``aggregate_train`` methods are made of on the replies'
float arrays (FedMedian's is one ``np.median`` call, which Flower has no function for).
Each steps x <- x + ``server_lr`` (agg - x); non-float entries (counters) keep the global
model's values, so no single client sets them.

:func:`clip_update` scales a client's update (reply - global model) down to a maximum L2
norm; :class:`~strategies.strategy.FedFlex` applies it to every reply before any part
sees it (``strategy.aggregator.clip_norm``), and :func:`clip_records` the rule records
made from that update by the same factor (SCAFFOLD's control-variate change). Where the
server's step reads a record instead of the clipped model (FedNova's ``fednova-d``,
BHerd's ``herd-g``) clipping cannot protect: :func:`clip_refusal` says why, and the
scenario is refused at load.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import OrderedDict
from logging import WARNING
from typing import Any, Mapping, Optional, cast

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fedflex import keys
from fedflex.arrays import is_float, numpy_to_record, record_to_numpy
from fedflex.config import AggregatorConfig
from fedflex.strategies.parts import Aggregator, Arrays, ClientUpdate, Federation


def clip_update(arrays: Arrays, global_arrays: Arrays, max_norm: float) -> tuple[Arrays, float]:
    """``arrays`` with its update ``arrays - global_arrays`` (float entries, as one
    vector) scaled down to L2 norm ``max_norm`` when longer; and the update's norm before.

    Examples
    --------
    >>> g = OrderedDict(w=np.zeros(2, np.float32))
    >>> out, norm = clip_update(OrderedDict(w=np.array([3.0, 4.0], np.float32)), g, 1.0)
    >>> norm, out["w"].tolist()
    (5.0, [0.6000000238418579, 0.800000011920929])
    """
    deltas = {k: arrays[k].astype(np.float64) - g for k, g in global_arrays.items() if is_float(g)}
    norm = float(np.sqrt(sum(float(np.sum(d * d)) for d in deltas.values())))
    if norm <= max_norm:
        return arrays, norm
    scale = max_norm / norm
    out: Arrays = OrderedDict()
    for k, a in arrays.items():
        out[k] = (global_arrays[k] + scale * deltas[k]).astype(a.dtype) if k in deltas else a
    return out, norm


def clip_records(update: ClientUpdate, scale: float, sent: Mapping[str, Mapping[str, np.ndarray]]) -> list[str]:
    """Scale the rule records of ``update`` as its model update was scaled (by ``scale`` < 1),
    in place; return the records clipped.

    SCAFFOLD (option II): the client's control-variate change is dc = (x - y) / (a lr) - c,
    c the server's control variate (``sent["scaffold-c"]``), so the update scaled by s
    makes dc' = s (dc + c) - c, exactly the record an honest client with that update sends.

    Examples
    --------
    >>> c = OrderedDict(w=np.ones(2, np.float32))
    >>> u = ClientUpdate(0, 1, OrderedDict(), extras={"scaffold-dc": OrderedDict(w=np.array([3.0, 5.0], np.float32))})
    >>> clip_records(u, 0.5, {"scaffold-c": c}), u.extras["scaffold-dc"]["w"].tolist()
    (['scaffold-dc'], [1.0, 2.0])
    """
    clipped = []
    control = sent.get(keys.SCAFFOLD_C)
    dc = update.extras.get(keys.SCAFFOLD_DC)
    if dc is not None and control is not None and all(k in control for k in dc):
        update.extras[keys.SCAFFOLD_DC] = OrderedDict(
            (k, (scale * (v.astype(np.float64) + control[k]) - control[k]).astype(v.dtype)) for k, v in dc.items()
        )
        clipped.append(keys.SCAFFOLD_DC)
    return clipped


def clip_refusal(aggregator: str, local_rule: str) -> Optional[str]:
    """Why ``clip_norm`` cannot protect ``aggregator`` with ``local_rule`` (None: it can):
    the server's step reads a record made from the update rather than the clipped model.

    Examples
    --------
    >>> clip_refusal("fedavg", "scaffold") is None, clip_refusal("fedavg", "fednova")
    (True, 'local rule fednova rebuilds every model from its fednova-d record, not the clipped model')
    """
    if aggregator == "bherd":
        return "aggregator bherd steps with the clients' gradient sums, not the clipped model"
    if local_rule == "fednova":
        return "local rule fednova rebuilds every model from its fednova-d record, not the clipped model"
    return None


class RobustAggregator(Aggregator):
    """Base of the robust aggregators: :meth:`combine` the replies' float arrays, then
    step x <- x + ``server_lr`` (agg - x); non-float entries keep the global model's.
    """

    DP_NOTE = "a robust aggregate is no average: its sensitivity is not clipping_norm / K"

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "RobustAggregator":
        """Return the aggregator with ``server_lr`` (a robust rule weighs no reply by its examples)."""
        return cls(server_lr=options.server_lr)

    def __init__(self, server_lr: float = 1.0) -> None:
        self.server_lr = server_lr
        self._metrics: dict[str, Any] = {}

    @abstractmethod
    def combine(self, server_round: int, models: list[Arrays], updates: list[ClientUpdate]) -> Optional[Arrays]:
        """Return the aggregate of ``models`` (float arrays only, one per update), or None to
        keep the model this round.
        """

    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the global model and the round's replies."""
        self._metrics = {}
        floats = [k for k, g in global_arrays.items() if is_float(g)]
        models = [OrderedDict((k, u.arrays[k]) for k in floats) for u in updates]
        agg = self.combine(server_round, models, updates)
        out: Arrays = OrderedDict()
        for key, g in global_arrays.items():
            if agg is None or key not in agg:
                out[key] = g.copy()
            else:
                a = np.asarray(agg[key], dtype=np.float64)
                out[key] = (a if self.server_lr == 1.0 else g + self.server_lr * (a - g)).astype(g.dtype)
        return out

    def round_metrics(self) -> dict[str, Any]:
        """Return this round's figures for the round's row of metrics.jsonl."""
        return self._metrics

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"{self.name}(server_lr={self.server_lr})"


def _stacked(models: list[Arrays]) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, np.stack([m[k] for m in models])) for k in models[0])


class MedianAggregator(RobustAggregator):
    """The coordinate-wise median of the replies (FedMedian)."""

    name = "median"

    def combine(self, server_round: int, models: list[Arrays], updates: list[ClientUpdate]) -> Arrays:
        """Combine the clients' models by this aggregator's robust rule."""
        return OrderedDict((k, np.median(s, axis=0)) for k, s in _stacked(models).items())


class TrimmedMeanAggregator(RobustAggregator):
    """Per coordinate, the mean without the ``floor(beta n)`` lowest and highest values
    (FedTrimmedAvg's ``trim_mean``).
    """

    name = "trimmed-mean"

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "TrimmedMeanAggregator":
        """Return the trimmed mean with ``trimmed_mean.beta``."""
        return cls(options.trimmed_mean.beta, server_lr=options.server_lr)

    def __init__(self, beta: float, server_lr: float = 1.0) -> None:
        super().__init__(server_lr)
        self.beta = beta

    def combine(self, server_round: int, models: list[Arrays], updates: list[ClientUpdate]) -> Arrays:
        """Combine the clients' models by this aggregator's robust rule."""
        self._metrics = {"trimmed_per_side": int(self.beta * len(models))}
        return OrderedDict((k, trim_mean(s, self.beta)) for k, s in _stacked(models).items())

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"trimmed-mean(beta={self.beta}, server_lr={self.server_lr})"


def _contents(models: list[Arrays], weights: list[float]) -> list[RecordDict]:
    """Return replies as the RecordDicts Flower's selection and averaging functions read."""
    return [
        RecordDict({keys.ARRAYS: numpy_to_record(m), keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: float(w)})})
        for m, w in zip(models, weights)
    ]


def _selected(contents: list[RecordDict], chosen: list[RecordDict], updates: list[ClientUpdate]) -> list[int]:
    return sorted(u.client for u, c in zip(updates, contents) if any(c is s for s in chosen))


class KrumAggregator(RobustAggregator):
    """Krum (``select``=1) or Multi-Krum: the ``select`` replies (None: n - f) with the
    smallest summed squared distance to their n - f - 2 nearest replies, averaged by
    examples (``weighted``) or plainly. The selected client ids are logged as
    ``krum_selected``.
    """

    name = "krum"

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "KrumAggregator":
        """Return Krum with ``krum.num_malicious``: one reply selected."""
        return cls(options.krum.num_malicious, select=1, server_lr=options.server_lr)

    def __init__(
        self, num_malicious: int, select: Optional[int] = 1, weighted: bool = True, server_lr: float = 1.0
    ) -> None:
        super().__init__(server_lr)
        self.name = "krum" if select == 1 else "multikrum"
        self.f, self.select, self.weighted = num_malicious, select, weighted

    def combine(self, server_round: int, models: list[Arrays], updates: list[ClientUpdate]) -> Arrays:
        """Combine the clients' models by this aggregator's robust rule."""
        n = len(models)
        if n < 2 * self.f + 3:
            log(
                WARNING,
                "round %d: %s: %d replies, fewer than 2f + 3 = %d for f=%d: no Byzantine guarantee this round",
                server_round,
                self.name,
                n,
                2 * self.f + 3,
                self.f,
            )
        m = min(n, self.select if self.select is not None else max(1, n - self.f))
        contents = _contents(models, [u.num_examples if self.weighted else 1.0 for u in updates])
        chosen = select_multikrum(contents, num_malicious_nodes=self.f, num_nodes_to_select=m)
        self._metrics = {"krum_selected": _selected(contents, chosen, updates)}
        return record_to_numpy(aggregate_arrayrecords(chosen, keys.NUM_EXAMPLES))

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        select = "" if self.name == "krum" else f", select={self.select or 'n - f'}, weighted={self.weighted}"
        return f"{self.name}(f={self.f}{select}, server_lr={self.server_lr})"


class MultiKrumAggregator(KrumAggregator):
    """Multi-Krum: :class:`KrumAggregator` selecting ``krum.num_selected`` replies (None: n - f)."""

    name = "multikrum"

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "MultiKrumAggregator":
        """Return Multi-Krum with ``krum.num_malicious`` and ``krum.num_selected``, weighted as asked."""
        krum = options.krum
        return cls(krum.num_malicious, select=krum.num_selected, weighted=options.weighted, server_lr=options.server_lr)


class BulyanAggregator(RobustAggregator):
    """Bulyan: multikrum selects theta = n - 2f replies; per coordinate, the mean of the
    theta - 2f selected values closest to their median. Needs n >= 4f + 3 replies; a
    round with fewer keeps the model (logged). Selected client ids: ``bulyan_selected``.
    """

    name = "bulyan"

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "BulyanAggregator":
        """Return Bulyan with ``krum.num_malicious``."""
        return cls(options.krum.num_malicious, server_lr=options.server_lr)

    def __init__(self, num_malicious: int, server_lr: float = 1.0) -> None:
        super().__init__(server_lr)
        self.f = num_malicious

    def combine(self, server_round: int, models: list[Arrays], updates: list[ClientUpdate]) -> Optional[Arrays]:
        """Combine the clients' models by this aggregator's robust rule."""
        n, f = len(models), self.f
        if n < 4 * f + 3:
            log(WARNING, "round %d: bulyan: %d replies, fewer than 4f + 3 = %d: model kept", server_round, n, 4 * f + 3)
            self._metrics = {"bulyan_selected": []}
            return None
        theta = n - 2 * f
        contents = _contents(models, [1.0] * n)
        chosen = select_multikrum(contents, num_malicious_nodes=f, num_nodes_to_select=theta)
        self._metrics = {"bulyan_selected": _selected(contents, chosen, updates)}
        names = list(models[0])
        selected = [list(record_to_numpy(cast(ArrayRecord, c[keys.ARRAYS])).values()) for c in chosen]
        medians = [np.median(np.stack(layer), axis=0) for layer in zip(*selected)]
        return OrderedDict(zip(names, aggregate_n_closest_weights(medians, selected, theta - 2 * f)))

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"bulyan(f={self.f}, server_lr={self.server_lr})"
