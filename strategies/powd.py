"""Power-of-Choice client selection.

Method: Yae Jee Cho, Jianyu Wang and Gauri Joshi, "Client Selection in Federated
Learning: Convergence Analysis and Power-of-Choice Selection Strategies", 2020,
https://arxiv.org/abs/2010.01243 (``pow-d``).

Each round the server draws a candidate set of ``d`` online clients without replacement,
proportionally to their data size (uniformly while no size is known; a client not yet
reported counts with the mean known size), sends them the current global model in a
QUERY round trip (the ClientApp answers with ``eval-loss``, the model's loss on its
training data) and keeps the K candidates with the highest loss (ties: candidate order,
which is random). ``d = 0`` means every online client (HiCS-FL's setting, d = N).
Candidates that do not answer are used only when fewer than K answered. With ``d <= K``
there is no choice to make: the query is skipped and this is size-weighted random
sampling.
"""

from __future__ import annotations

from logging import DEBUG, INFO, WARNING
from typing import Any, Optional, cast

import numpy as np
from flwr.common import log

from fedflex.options import MethodOptions, PowDOptions, resolve_options
from fedflex.strategies.baseline import query_losses
from fedflex.strategies.clustering import data_shares
from fedflex.strategies.parts import Arrays, ClientUpdate, Federation, Sampler


def highest_loss(candidates: np.ndarray, losses: dict[int, float], num: int) -> np.ndarray:
    """Return the ``num`` candidates with the highest loss (stable: ties keep candidate order);
    candidates without a loss fill the remaining places in candidate order.
    """
    answered = [int(c) for c in candidates if int(c) in losses]
    ranked = sorted(answered, key=lambda c: -losses[c])  # sorted() is stable
    silent = [int(c) for c in candidates if int(c) not in losses]
    return np.array((ranked + silent)[:num], dtype=np.int64)


class PowDSampler(Sampler):
    """Power-of-Choice (see the module docstring).

    Parameters
    ----------
    seed : int
        Seed of the sampler's generator.
    d : int
        Candidates per round; 0 means all online clients.
    clients_per_round : int, optional
        K, only to warn when ``d <= K`` leaves nothing to choose.
    """

    name = "pow-d"
    OPTIONS = PowDOptions
    SECTION = "powd"
    SEED_OFFSET = 12
    DP_NOTE = "Power-of-Choice samples by each candidate's local loss (an EVALUATE reply: not clipped, not noised)"

    @classmethod
    def build(cls, options: Optional[MethodOptions], federation: Federation) -> "PowDSampler":
        """Return the sampler for ``federation`` (K, for the warning when d leaves no choice)."""
        return cls(
            seed=federation.seed_of(cls),
            options=cast(Optional[PowDOptions], options),
            clients_per_round=federation.clients_per_round,
        )

    def __init__(
        self,
        *,
        seed: int,
        options: Optional[PowDOptions] = None,
        clients_per_round: Optional[int] = None,
        **fields: Any,
    ) -> None:
        d = resolve_options(PowDOptions, options, fields, "strategy.sampler.powd").d
        self.rng = np.random.default_rng(seed)
        self.d = d
        self.sizes: dict[int, int] = {}
        self.last_losses: dict[int, float] = {}
        self._last: dict[str, Any] = {}
        self._probed = False  # the first probe is said (INFO)
        if clients_per_round is not None and 0 < d <= clients_per_round:
            log(
                WARNING,
                "pow-d with d=%d <= K=%d leaves no choice: it amounts to sampling K clients by data size",
                d,
                clients_per_round,
            )

    def _sizes(self) -> dict[int, int]:
        sizes = dict(self.sizes)
        if self.ctx is not None:
            sizes.update(self.ctx.data_sizes())
        return sizes

    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Choose at most ``num`` of the ``online`` clients to train in ``server_round``."""
        online = np.asarray(online, dtype=np.int64)
        num = min(int(num), len(online))
        if num == 0:
            return np.zeros(0, dtype=np.int64)
        d = len(online) if self.d == 0 else min(max(self.d, num), len(online))
        sizes = self._sizes()
        p = data_shares(online, sizes) if sizes else None
        candidates = self.rng.choice(online, size=d, replace=False, p=p).astype(np.int64)
        if d <= num:
            return np.sort(candidates)
        if self.ctx is None:
            raise RuntimeError("pow-d needs the strategy's context (bind the sampler first)")
        if not self._probed:
            self._probed = True
            log(
                INFO,
                "pow-d: from round %d, %d candidate(s) a round report their loss on the global model "
                "(a QUERY to fedflex's ClientApp, an EVALUATE message to any other); the %d highest train",
                server_round,
                d,
                num,
            )
        losses = query_losses(self.ctx, server_round, candidates, self.sizes)
        if len(losses) < num:
            log(WARNING, "pow-d round %d: %d of %d candidates reported a loss", server_round, len(losses), d)
        self.last_losses = losses
        chosen = highest_loss(candidates, losses, num)
        picked = [losses[int(c)] for c in chosen if int(c) in losses]
        self._last = {
            "powd_candidates": int(d),
            "powd_mean_loss": float(np.mean(list(losses.values()))) if losses else float("nan"),
            "powd_chosen_loss": float(np.mean(picked)) if picked else float("nan"),
        }
        log(DEBUG, "pow-d round %d: %d candidates, chosen %s", server_round, d, chosen.tolist())
        return np.sort(chosen)

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        for u in updates:
            self.sizes[u.client] = u.num_examples

    def round_metrics(self) -> dict[str, Any]:
        """``powd_candidates`` (d), ``powd_mean_loss`` (mean loss the candidates reported
        on the global model) and ``powd_chosen_loss`` (mean over the K chosen): how much
        the loss query separated the chosen clients from the rest.
        """
        out, self._last = self._last, {}
        return out

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"pow-d(d={self.d or 'all online'})"

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {"rng": self.rng.bit_generator.state, "sizes": {str(c): n for c, n in self.sizes.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]
        self.sizes = {int(c): int(n) for c, n in state["sizes"].items()}
