"""The ClientApp, as Flower's quickstart-pytorch writes it: no fedflex in it."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flowerquickstart.task import Net, load_data
from flowerquickstart.task import test as test_fn
from flowerquickstart.task import train as train_fn

app = ClientApp()


def _setting(context: Context, key: str, default):
    return context.run_config.get(key, default)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainloader, _ = load_data(partition_id, num_partitions, _setting(context, "examples", 600))
    train_loss = train_fn(model, trainloader, _setting(context, "local-epochs", 1), msg.content["config"]["lr"], "cpu")
    model_record = ArrayRecord(model.state_dict())
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(trainloader.dataset)})
    return Message(content=RecordDict({"arrays": model_record, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local validation data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    _, valloader = load_data(partition_id, num_partitions, _setting(context, "examples", 600))
    eval_loss, eval_acc = test_fn(model, valloader, "cpu")
    metrics = MetricRecord({"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


torch.set_num_threads(1)
