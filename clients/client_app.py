"""fedflex's Flower ClientApp: local training and evaluation on the node's partition.

Every message carries the task (data set, partition, model) as JSON and the training
settings; the worker caches the task (:mod:`clients.runtime`), so data are loaded once
per worker, never per message. The node's client id is its ``partition-id`` from the
node config, in simulation and in deployment alike; a deployment may also give a
``data-path``.
"""

from __future__ import annotations

import logging

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedflex import keys
from fedflex.clients.cohort_app import train_packed
from fedflex.clients.node import load_global, node_task, partition_id, train_one
from fedflex.evaluation import evaluate

logger = logging.getLogger(__name__)

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the message's local rule on this node's partition (:func:`clients.node.train_one`);
    a simulation's cohort message (several clients in one, :mod:`fedflex.launch.cohort_grid`)
    goes to :func:`clients.cohort_app.train_packed`.
    """
    if keys.COHORT_CLIENTS in msg.content[keys.CONFIG]:
        return train_packed(msg, context)
    return train_one(msg, context)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this node's training partition."""
    pid = partition_id(context)
    task = node_task(msg, context)
    load_global(task, msg)
    loss, acc, n = evaluate(task.model, task.train, task.client_indices(pid).to(task.device), loss=task.loss)
    metrics = MetricRecord(
        {keys.NUM_EXAMPLES: n, keys.EVAL_LOSS: loss, keys.EVAL_ACCURACY: acc, keys.PARTITION_ID: pid}
    )
    return Message(content=RecordDict({keys.METRICS: metrics}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Who is this node (its partition id, the client id fedflex uses everywhere); with
    ``want-loss``, also the loss of the sent model on its data (Power-of-Choice).
    """
    pid = partition_id(context)
    content = RecordDict({keys.CONFIG: ConfigRecord({keys.PARTITION_ID: pid})})
    config = msg.content.config_records.get(keys.CONFIG)
    if config is not None and bool(config.get(keys.WANT_LOSS, False)):
        task = node_task(msg, context)
        load_global(task, msg)
        loss, acc, n = evaluate(task.model, task.train, task.client_indices(pid).to(task.device), loss=task.loss)
        content[keys.METRICS] = MetricRecord(
            {keys.EVAL_LOSS: loss, keys.EVAL_ACCURACY: acc, keys.NUM_EXAMPLES: n, keys.PARTITION_ID: pid}
        )
    return Message(content=content, reply_to=msg)
