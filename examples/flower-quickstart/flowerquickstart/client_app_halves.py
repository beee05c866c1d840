"""The quickstart ClientApp with fedflex's client halves (``clients.helpers.client_half``).

For the strategies whose server half needs more than a model back (BHerd, SCAFFOLD,
FedNova; FedDyn and FedCM for their full method; Flower's FedProx). ``train`` is
:func:`flowerquickstart.client_app.train` plus the two lines marked ``# fedflex``: the
import and ``@client_half`` under ``@app.train()``. The method is the one the train
message is for, so this one ClientApp serves the six strategies (and any other strategy,
whose messages pass through unchanged).

``app_mod`` is the unchanged quickstart ClientApp behind the same thing as a Flower mod
(``client_half_mod``); ``app_fednova_mod`` behind FedNova's own mod.
"""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedflex.clients.helpers import client_half, client_half_mod, fednova_mod  # fedflex
from flowerquickstart import client_app as plain
from flowerquickstart.task import Net, load_data
from flowerquickstart.task import train as train_fn

app = ClientApp()


def _setting(context: Context, key: str, default):
    return context.run_config.get(key, default)


@app.train()
@client_half  # fedflex
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


app.evaluate()(plain.evaluate)

#: Flower's quickstart ClientApp, unchanged, behind client_half's mod
app_mod = ClientApp(mods=[client_half_mod])
app_mod.train()(plain.train)
app_mod.evaluate()(plain.evaluate)

#: Flower's quickstart ClientApp, unchanged, behind FedNova's mod
app_fednova_mod = ClientApp(mods=[fednova_mod])
app_fednova_mod.train()(plain.train)
app_fednova_mod.evaluate()(plain.evaluate)
