"""fedflex's strategies inside Flower's differential-privacy wrappers.

Flower's central-DP wrappers (:class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideFixedClipping`,
its client-side twin with :func:`flwr.clientapp.mod.fixedclipping_mod`, and the adaptive
clipping pair; McMahan et al. 2018, https://arxiv.org/abs/1710.06963) clip each client's
model update to ``clipping_norm`` (on the server, or on the client) and add Gaussian
noise of standard deviation ``noise_multiplier x clipping_norm / num_sampled_clients`` to
the *aggregate*. They call the wrapped strategy's ``configure_train`` /
``aggregate_train`` / ``configure_evaluate`` / ``aggregate_evaluate`` / ``summary``, so
every fedflex strategy runs inside them; but the noise protects only what is computed
from the aggregate. Whatever a method keeps or decides per client (HiCS-FL's entropy
estimates, FedAWARE's momenta and weights, a server optimiser's moments, SessionAware's
gradient rounds) is computed before the noise, from clipped but un-noised updates (or,
for losses and extra rounds, from replies the wrapper never sees), and steers what is
released. :func:`check_dp_wrapper` says so once per run (a warning naming each such
part) and refuses the methods the wrappers break: those whose replies carry more than
the model (SCAFFOLD, FedNova, BHerd: the server-side wrapper would clip their extra
records as if they were the model, ``fixedclipping_mod`` rejects them), and, with
client-side clipping, those whose train messages carry more than the model (SCAFFOLD's
control variate, FedCM's momentum: ``fixedclipping_mod`` rejects them).
See ``docs/flower-strategies.md`` ("Differential privacy").
"""

from __future__ import annotations

import gc
from logging import WARNING
from typing import TYPE_CHECKING, Any, Optional

from flwr.app import Message
from flwr.common import log
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from fedflex.strategies.parts import Part, ServerRule

if TYPE_CHECKING:
    from fedflex.strategies.strategy import FedFlex

#: Flower's DP wrappers that clip on the server (they keep the model sent as ``current_arrays``)
SERVER_SIDE = (DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyServerSideAdaptiveClipping)
#: Flower's DP wrappers whose clients clip (``fixedclipping_mod`` / ``adaptiveclipping_mod``)
CLIENT_SIDE = (DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyClientSideAdaptiveClipping)


def find_dp_wrapper(strategy: "FedFlex") -> Optional[Any]:
    """Return the Flower DP wrapper that holds ``strategy`` (as its ``strategy``), or None.

    Flower's wrappers do not tell the strategy they wrap, and a user who wraps a fedflex
    strategy in one of Flower's classes (as with Flower's own strategies) may not tell it
    either (``FedFlex.wrapper``). The strategy looks when its ``configure_train`` runs
    round 1 (of each run) from a loop other than its own ``start``: among the objects
    that refer to it (:func:`gc.get_referrers`), not in the caller's stack frames.
    """
    for holder in gc.get_referrers(strategy):
        if isinstance(holder, SERVER_SIDE + CLIENT_SIDE) and holder.strategy is strategy:
            return holder
    return None


def under_dp(strategy: "FedFlex", wrapper: Any, messages: list[Message], checked: Any) -> Any:
    """Inside ``wrapper`` (one of Flower's DP wrappers): refuse what it breaks, warn what
    its noise does not cover (:func:`check_dp_wrapper`, once per wrapper: ``checked`` is
    the one already checked); a server-side wrapper clips each reply against the model
    this round's ``messages`` carry (SessionAware may have replaced the one the wrapper
    was given). Returns the wrapper now checked.
    """
    if checked is not wrapper:
        check_dp_wrapper(strategy, wrapper, messages)
    if isinstance(wrapper, SERVER_SIDE) and messages:
        wrapper.current_arrays = strategy.engine.global_record()
    return wrapper


def _part_notes(strategy: "FedFlex") -> list[str]:
    """Return what each of the strategy's parts (wrapped ones included) computes per client
    outside the noise: its class's ``DP_NOTE`` (None: nothing; undeclared: a generic line).
    """
    notes = []
    for top in strategy.parts:
        part: Optional[Part] = top
        while part is not None:
            if part.DP_NOTE is not None:
                name = part.options.name if isinstance(part, ServerRule) else part.name
                notes.append(part.DP_NOTE or f"part {name} keeps per-client state")
            part = getattr(part, "base", None)
    return notes


def check_dp_wrapper(strategy: "FedFlex", wrapper: Any, messages: list[Message]) -> None:
    """Refuse what ``wrapper`` breaks; warn what its noise does not cover (see the module).

    Raises
    ------
    ValueError
        A method whose replies carry more than the model, or, under client-side
        clipping, whose train messages do.
    """
    name, kind = type(strategy).__name__, type(wrapper).__name__
    records = strategy.reply_limits.records
    if records:
        raise ValueError(
            f"{name} cannot run inside {kind}: its replies carry {', '.join(records)} besides the model, "
            "which Flower's DP wrappers clip as a model (server side) or reject (fixedclipping_mod)"
        )
    extra = sorted({k for m in messages for k in m.content.array_records if k != strategy.arrayrecord_key})
    if extra and isinstance(wrapper, CLIENT_SIDE):
        raise ValueError(
            f"{name} cannot run inside {kind}: its train messages carry {', '.join(extra)} besides the model, "
            "and Flower's clipping mods reject a message with more than one ArrayRecord"
        )
    notes = _part_notes(strategy)
    if notes:
        log(
            WARNING,
            "%s inside %s: the DP noise covers the aggregate only; not covered: %s",
            name,
            kind,
            "; ".join(dict.fromkeys(notes)),
        )
    if getattr(strategy, "rounds", 0) is None and strategy.engine.run.num_rounds is None:
        log(
            WARNING,
            "%s inside %s: Flower's loop does not tell the strategy num_rounds; pass rounds=num_rounds "
            "(schedules such as HiCS-FL's annealing use it)",
            name,
            kind,
        )
