"""What a node does with one message: find its task, run a local rule, build the reply.

Shared by the ClientApp (:mod:`clients.client_app`, one client per message) and the
cohort trainer (:mod:`clients.cohort_app`, several clients per call), so that both read
messages and build replies the same way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import OrderedDict
from typing import Any, Callable, Mapping, Optional, cast

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedflex import keys
from fedflex.arrays import array_to_numpy, numpy_to_record
from fedflex.clients.rules import LOCAL_RULES, RuleInput, RuleOutput
from fedflex.clients.runtime import Task, get_task
from fedflex.clients.train import TrainSettings, drawn_settings, num_steps
from fedflex.config import ClientConfig, LocalRuleConfig
from fedflex.records import from_record
from fedflex.taskspec import TaskSpec

logger = logging.getLogger(__name__)


def partition_id(context: Context) -> int:
    """Return the partition id of this node (the client id fedflex uses)."""
    try:
        return int(context.node_config[keys.NODE_PARTITION_ID])
    except KeyError:
        raise ValueError(
            "this SuperNode has no partition-id: start it with --node-config 'partition-id=<id> num-partitions=<N>'"
        ) from None


def node_task(msg: Message, context: Context) -> Task:
    """Return the worker's task (data, model) for this message's task spec
    (:class:`~fedflex.taskspec.TaskSpec`), parsed and built once per worker and task.
    """
    config = msg.content[keys.CONFIG]
    data_path = context.node_config.get(keys.NODE_DATA_PATH)
    task = get_task(TaskSpec.entry(config), str(data_path) if data_path else None)
    num_partitions = context.node_config.get(keys.NODE_NUM_PARTITIONS)
    if num_partitions is not None and int(num_partitions) != task.num_clients:
        raise ValueError(
            f"node has num-partitions={num_partitions} but the scenario has num_clients={task.num_clients}"
        )
    return task


#: the last parse of each kind: (what, loss) -> (the config's items, the parsed value).
#: A round's train messages share one config: its hundred clients parse (and validate) it once.
_PARSED: dict[tuple[str, str], tuple[list, Any]] = {}


def _parsed(what: str, loss: str, config: Mapping[str, Any], parse: Callable[[], Any]) -> Any:
    """Return ``parse()``, or its value for a config with the same items (types included)
    as last time. The values are frozen or never changed by their users.
    """
    items = [(k, type(v), v) for k, v in config.items()]
    last = _PARSED.get((what, loss))
    if last is not None and last[0] == items:
        return last[1]
    value = parse()
    _PARSED[(what, loss)] = (items, value)
    return value


def settings_from_config(config: Mapping[str, Any], loss: str = "cross-entropy") -> TrainSettings:
    """Training settings from a train message's ConfigRecord (the scenario's
    :class:`~fedflex.config.ClientConfig` as the server wrote it) and the task's loss.
    """
    return _parsed(
        "settings",
        loss,
        config,
        lambda: TrainSettings.from_client(from_record(ClientConfig, config, keys.CLIENT), loss=loss),
    )


def rule_options(config: Mapping[str, Any]) -> LocalRuleConfig:
    """Return the local rule's options as its server half wrote them (defaults for the rest)."""
    return _parsed("rule", "", config, lambda: from_record(LocalRuleConfig, config, keys.LOCAL_RULE))


def load_global(task: Task, msg: Message) -> None:
    """Load the message's global model into the task's model.

    The tensors of the last record loaded are kept with the task: on the in-process grid a
    round's train messages share one content, so its hundred clients decode the model once.
    A record is the same one when it holds the same Array objects with the same data objects
    (an Array given new data is decoded again); ``load_state_dict`` copies, so the kept
    tensors are never written.
    """
    record = cast(ArrayRecord, msg.content[keys.ARRAYS])
    held = [(name, array, array.data) for name, array in record.items()]
    last = getattr(task, "_last_global", None)
    if (
        last is not None
        and len(last[0]) == len(held)
        and all(n == m and a is b and d is e for (n, a, d), (m, b, e) in zip(held, last[0]))
    ):
        tensors = last[1]
    else:
        tensors = _tensors(record)
        task._last_global = (held, tensors)
    task.model.load_state_dict(tensors, strict=True)


def _tensors(record: ArrayRecord) -> "OrderedDict[str, torch.Tensor]":
    """``record.to_torch_state_dict()``, read through :func:`fedflex.arrays.array_to_numpy`."""
    return OrderedDict((k, torch.from_numpy(array_to_numpy(a))) for k, a in record.items())


def payload_of(msg: Message) -> dict:
    """Return the server's further array records (e.g. SCAFFOLD's c) as tensors."""
    return {name: _tensors(record) for name, record in msg.content.array_records.items() if name != keys.ARRAYS}


def rule_input(msg: Message, context: Context, task: Task, payload: Optional[dict] = None) -> RuleInput:
    """Everything a local rule gets for this message on this node (the model holds the
    weights loaded last; the caller loads the global model). ``payload``: the message's
    decoded further records when the caller has them (a cohort decodes them once).
    """
    pid = partition_id(context)
    config: Mapping[str, Any] = msg.content[keys.CONFIG]
    server_round = int(config[keys.SERVER_ROUND])
    options = rule_options(config)
    payload = payload_of(msg) if payload is None else payload
    fixed_order = options.fixed_order  # same batches every round
    seed = int(config[keys.SEED])
    generator = torch.Generator().manual_seed(seed * 1_000_003 + (0 if fixed_order else server_round * 10_007) + pid)
    indices = task.client_indices(pid)
    sent = settings_from_config(config, loss=task.loss)
    settings = drawn_settings(sent, seed=seed, server_round=server_round, client=pid, num_examples=len(indices))
    settings = capped_settings(settings, config, pid, len(indices))
    drawn = {}
    if settings is not sent:  # client.epochs_range / batch_size_range on: report what was drawn
        drawn = {keys.LOCAL_EPOCHS: settings.epochs, keys.LOCAL_BATCH_SIZE: settings.batch_size}
    return RuleInput(
        model=task.model,
        data=task.train,
        indices=indices,
        settings=settings,
        generator=generator,
        device=task.device,
        payload=payload,
        state=context.state,
        server_round=server_round,
        options=options,
        drawn=drawn,
    )


def capped_settings(settings: TrainSettings, config: Mapping[str, Any], client: int, n: int) -> TrainSettings:
    """Return ``settings`` cut to the local steps the server allows this client this round
    (``step-caps``, ``system.partial``: the first steps of its planned batches, those that
    fit the round's deadline); unchanged without a cap or when it does not bind.
    """
    caps = config.get(keys.STEP_CAPS)
    cap = json.loads(str(caps)).get(str(client)) if caps else None
    if cap is None or int(cap) >= num_steps(n, settings):
        return settings
    return dataclasses.replace(settings, steps=int(cap))


def rule_name(msg: Message) -> str:
    """Return the local rule the message names (refused when this client does not know it)."""
    name = rule_options(msg.content[keys.CONFIG]).name
    if name not in LOCAL_RULES:
        raise ValueError(f"unknown local rule {name!r}; this client knows {sorted(LOCAL_RULES)}")
    return name


def reply_records(model: torch.nn.Module, out: RuleOutput) -> RecordDict:
    """Return a train reply's array records: ``arrays`` (the rule's arrays, else ``model``'s
    state) and the rule's further records (``out.extras``), on the CPU.
    """
    arrays = out.arrays if out.arrays is not None else model.state_dict()
    content = RecordDict({keys.ARRAYS: _record(arrays)})
    for name, tensors in out.extras.items():
        content[name] = _record(tensors)
    return content


def _record(tensors: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """``ArrayRecord(tensors)`` (the same bytes), written through :func:`fedflex.arrays.numpy_to_record`."""
    return numpy_to_record({k: v.detach().cpu().numpy() for k, v in tensors.items()})


def build_reply(msg: Message, pid: int, task: Task, out: RuleOutput, drawn: Optional[dict] = None) -> Message:
    """Return the train reply: the local model (or the rule's arrays), the rule's further array
    records and the metrics (with ``drawn``: the epochs / batch size this client drew,
    :attr:`clients.rule_io.RuleInput.drawn`).
    """
    content = reply_records(task.model, out)
    metrics = {
        keys.NUM_EXAMPLES: out.result.num_examples,
        keys.NUM_STEPS: out.result.num_steps,
        keys.TRAIN_LOSS: out.result.train_loss,
        keys.PARTITION_ID: pid,
        **(drawn or {}),
        **out.metrics,
    }
    content[keys.METRICS] = MetricRecord(metrics)
    return Message(content=content, reply_to=msg)


def train_one(msg: Message, context: Context) -> Message:
    """Run the message's local rule on this node's partition; reply with the local model,
    the rule's further array records and the metrics.
    """
    task = node_task(msg, context)
    rule = LOCAL_RULES[rule_name(msg)]
    load_global(task, msg)
    inp = rule_input(msg, context, task)
    return build_reply(msg, partition_id(context), task, rule(inp), inp.drawn)
