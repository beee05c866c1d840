"""fedflex's Flower ClientApp: local training and evaluation on the node's partition.

Every message carries the task (data set, partition, model) as JSON and the training
settings; the worker caches the task (:mod:`clients.runtime`), so data are loaded once
per worker, never per message. The node's client id is its ``partition-id`` from the
node config, in simulation and in deployment alike; a deployment may also give a
``data-path``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.rules import LOCAL_RULES, RuleInput, RuleOutput
from clients.runtime import Task, get_task
from clients.train import TrainSettings
from fedflex import keys
from fedflex.evaluation import evaluate

logger = logging.getLogger(__name__)

app = ClientApp()


def _partition_id(context: Context) -> int:
    try:
        return int(context.node_config[keys.NODE_PARTITION_ID])
    except KeyError:
        raise ValueError(
            "this SuperNode has no partition-id: start it with --node-config 'partition-id=<id> num-partitions=<N>'"
        ) from None


def _task(msg: Message, context: Context) -> Task:
    config = msg.content[keys.CONFIG]
    data_path = context.node_config.get(keys.NODE_DATA_PATH)
    task = get_task(str(config[keys.TASK]), str(data_path) if data_path else None)
    num_partitions = context.node_config.get(keys.NODE_NUM_PARTITIONS)
    if num_partitions is not None and int(num_partitions) != task.num_clients:
        raise ValueError(
            f"node has num-partitions={num_partitions} but the scenario has num_clients={task.num_clients}"
        )
    return task


def settings_from_config(config: ConfigRecord) -> TrainSettings:
    """Training settings from a train message's ConfigRecord."""
    steps = int(config[keys.STEPS])
    return TrainSettings(
        epochs=int(config[keys.EPOCHS]),
        steps=None if steps < 0 else steps,
        batch_size=int(config[keys.BATCH_SIZE]),
        optimizer=str(config[keys.OPTIMIZER]),
        lr=float(config[keys.LR]),
        momentum=float(config[keys.MOMENTUM]),
        weight_decay=float(config[keys.WEIGHT_DECAY]),
        rule=str(config[keys.LOCAL_RULE]),
        proximal_mu=float(config[keys.PROXIMAL_MU]),
    )


def _load_global(task: Task, msg: Message) -> None:
    state = msg.content[keys.ARRAYS].to_torch_state_dict()
    task.model.load_state_dict(state, strict=True)


def _payload(msg: Message) -> dict:
    """The server's further array records (e.g. SCAFFOLD's c) as tensors."""
    return {
        name: record.to_torch_state_dict() for name, record in msg.content.array_records.items() if name != keys.ARRAYS
    }


def _rule_input(msg: Message, context: Context, task: Task, payload: Optional[dict] = None) -> RuleInput:
    """Everything a local rule gets for this message on this node (the model holds the
    weights loaded last; the caller loads the global model). ``payload``: the message's
    decoded further records when the caller has them (a cohort decodes them once)."""
    pid = _partition_id(context)
    config = msg.content[keys.CONFIG]
    server_round = int(config[keys.SERVER_ROUND])
    settings = dataclasses.replace(settings_from_config(config), loss=task.loss)
    payload = _payload(msg) if payload is None else payload
    fixed_order = bool(config.get(keys.FIXED_ORDER, False))  # same batches every round
    generator = torch.Generator().manual_seed(
        int(config[keys.SEED]) * 1_000_003 + (0 if fixed_order else server_round * 10_007) + pid
    )
    return RuleInput(
        model=task.model,
        data=task.train,
        indices=task.client_indices(pid),
        settings=settings,
        generator=generator,
        device=task.device,
        payload=payload,
        state=context.state,
        server_round=server_round,
        options=dict(config),
    )


def _rule_name(msg: Message) -> str:
    name = str(msg.content[keys.CONFIG][keys.LOCAL_RULE])
    if name not in LOCAL_RULES:
        raise ValueError(f"unknown local rule {name!r}; this client knows {sorted(LOCAL_RULES)}")
    return name


def _reply(msg: Message, pid: int, task: Task, out: RuleOutput) -> Message:
    """The train reply: the local model (or the rule's arrays), the rule's further array
    records and the metrics."""
    arrays = out.arrays if out.arrays is not None else task.model.state_dict()
    content = RecordDict({keys.ARRAYS: ArrayRecord({k: v.detach().cpu() for k, v in arrays.items()})})
    for name, tensors in out.extras.items():
        content[name] = ArrayRecord({k: v.detach().cpu() for k, v in tensors.items()})
    metrics = {
        keys.NUM_EXAMPLES: out.result.num_examples,
        keys.NUM_STEPS: out.result.num_steps,
        keys.TRAIN_LOSS: out.result.train_loss,
        keys.PARTITION_ID: pid,
        **out.metrics,
    }
    content[keys.METRICS] = MetricRecord(metrics)
    return Message(content=content, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the message's local rule on this node's partition; reply with the local model,
    the rule's further array records and the metrics. A simulation's cohort message
    (several clients in one, :mod:`fedflex.cohort_grid`) goes to
    :func:`clients.cohort_app.train_packed`."""
    if keys.COHORT_CLIENTS in msg.content[keys.CONFIG]:
        from clients.cohort_app import train_packed

        return train_packed(msg, context)
    task = _task(msg, context)
    rule = LOCAL_RULES[_rule_name(msg)]
    _load_global(task, msg)
    inp = _rule_input(msg, context, task)
    return _reply(msg, _partition_id(context), task, rule(inp))


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this node's training partition."""
    pid = _partition_id(context)
    task = _task(msg, context)
    _load_global(task, msg)
    loss, acc, n = evaluate(task.model, task.train, task.client_indices(pid).to(task.device), loss=task.loss)
    metrics = MetricRecord(
        {keys.NUM_EXAMPLES: n, keys.EVAL_LOSS: loss, keys.EVAL_ACCURACY: acc, keys.PARTITION_ID: pid}
    )
    return Message(content=RecordDict({keys.METRICS: metrics}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Who is this node (its partition id, the client id fedflex uses everywhere); with
    ``want-loss``, also the loss of the sent model on its data (Power-of-Choice)."""
    pid = _partition_id(context)
    content = RecordDict({keys.CONFIG: ConfigRecord({keys.PARTITION_ID: pid})})
    config = msg.content.config_records.get(keys.CONFIG)
    if config is not None and bool(config.get(keys.WANT_LOSS, False)):
        task = _task(msg, context)
        _load_global(task, msg)
        loss, acc, n = evaluate(task.model, task.train, task.client_indices(pid).to(task.device), loss=task.loss)
        content[keys.METRICS] = MetricRecord(
            {keys.EVAL_LOSS: loss, keys.EVAL_ACCURACY: acc, keys.NUM_EXAMPLES: n, keys.PARTITION_ID: pid}
        )
    return Message(content=content, reply_to=msg)
