"""What every local rule takes and returns, and helpers several rules share.

:class:`RuleInput` / :class:`RuleOutput` are the rule interface (re-exported by
:mod:`clients.rules`, whose :data:`~clients.rules.LOCAL_RULES` registry maps rule names
to functions ``RuleInput -> RuleOutput``), :class:`RuleSteps` (a rule written as start /
train / finish, so that one client or a batched cohort can run it) and
:func:`load_state` (tensors a rule keeps in the node state).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeAlias, cast

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fedflex.clients.train import StepTerms, TrainResult, TrainSettings, local_train
from fedflex.config import LocalRuleConfig
from fedflex.data import ArrayDataset


@dataclass
class RuleInput:
    """What a local rule is given: the model holding the global weights, the data, the settings and the options."""

    # model, data and generator are None for a user's own loop (clients.helpers): only start / finish run there
    model: Optional[nn.Module]  # holds the global weights on ``device``
    data: Optional[ArrayDataset]
    indices: torch.Tensor
    settings: TrainSettings
    generator: Optional[torch.Generator]
    device: torch.device
    payload: dict[str, "OrderedDict[str, torch.Tensor]"] = field(default_factory=dict)
    state: Optional[RecordDict] = None  # the node's persistent context state
    server_round: int = 0
    options: LocalRuleConfig = field(default_factory=LocalRuleConfig)  # the rule's options, as sent
    drawn: dict[str, Any] = field(default_factory=dict)  # epochs / batch size drawn this round (reply metrics)


@dataclass
class RuleOutput:
    """What a local rule returns: the training result, its further array records and metrics."""

    result: TrainResult
    extras: dict[str, "OrderedDict[str, torch.Tensor]"] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    arrays: Optional["OrderedDict[str, torch.Tensor]"] = None  # None: the model's state dict


Params: TypeAlias = "OrderedDict[str, torch.Tensor]"


@dataclass
class RuleStart:
    """What a rule computed before training: the terms each step adds (``terms``) and
    anything its :attr:`RuleSteps.finish` needs (``context``).
    """

    terms: StepTerms = field(default_factory=StepTerms)
    context: Any = None


@dataclass(frozen=True)
class RuleSteps:
    """A local rule written around one plain training loop, so that the loop can run
    one client at a time (:func:`clients.train.local_train`) or a cohort of clients at
    once (:mod:`clients.cohort`) with the same rule code.

    ``start(inp, x)``: ``x`` holds the start (global) parameters, which must not be
    changed; returns the :class:`RuleStart`. ``finish(inp, start, x, y, result)``:
    ``y`` holds the trained parameters; returns the :class:`RuleOutput` (``arrays=None``:
    send the model's state).
    """

    start: Callable[["RuleInput", Params], RuleStart]
    finish: Callable[["RuleInput", RuleStart, Params, Params, TrainResult], "RuleOutput"]

    def run(self, inp: "RuleInput") -> "RuleOutput":
        """Return the rule, one client at a time, training ``inp.model`` in place."""
        assert inp.model is not None and inp.data is not None and inp.generator is not None  # a node's data
        params = OrderedDict(inp.model.named_parameters())
        x = OrderedDict((k, p.detach().clone()) for k, p in params.items())
        begun = self.start(inp, x)
        result = local_train(
            inp.model, inp.data, inp.indices, inp.settings, inp.generator, inp.device, begun.terms, inp.state
        )
        y = OrderedDict((k, p.detach()) for k, p in params.items())
        return self.finish(inp, begun, x, y, result)


def load_state(state: Optional[RecordDict], name: str, like: "OrderedDict[str, torch.Tensor]", device) -> dict:
    """Tensors stored in the node state under ``name``, or zeros shaped like ``like``."""
    if state is not None and name in state.array_records:
        stored = cast(ArrayRecord, state[name]).to_torch_state_dict()
        if list(stored) == list(like) and all(stored[k].shape == like[k].shape for k in like):
            return {k: stored[k].to(device) for k in like}
    return {k: torch.zeros_like(p.detach()) for k, p in like.items()}
