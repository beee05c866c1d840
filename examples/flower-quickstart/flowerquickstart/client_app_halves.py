"""The quickstart ClientApp with fedflex's client halves (``clients.helpers``).

For the strategies whose server half needs more than a model back (BHerd, SCAFFOLD,
FedNova; FedDyn and FedCM for their full method; Flower's FedProx). The only change to
:mod:`flowerquickstart.client_app` is the three lines marked ``# fedflex``: the helper is
built from the message, wraps the unchanged ``train()`` call, and builds the reply. The
run config's ``client-half`` names the method (``BHerd``, ``SCAFFOLD``, ``FedNova``,
``FedDyn``, ``FedCM``, ``FedProx``); the ServerApp runs the strategy of the same name.

``app_fednova_mod`` is the unchanged quickstart ClientApp behind FedNova's mod.
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedflex.clients.helpers import HALVES, fednova_mod
from flowerquickstart import client_app as plain
from flowerquickstart.task import Net, load_data
from flowerquickstart.task import train as train_fn

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local data, with the method's client half."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainloader, _ = load_data(partition_id, num_partitions, context.run_config.get("examples", 600))
    epochs = context.run_config.get("local-epochs", 1)
    helper = HALVES[context.run_config.get("client-half", "BHerd")].from_message(msg, model, context)  # fedflex
    with helper:  # fedflex
        train_loss = train_fn(model, trainloader, epochs, msg.content["config"]["lr"], "cpu")
    content = helper.reply(len(trainloader.dataset), {"train_loss": train_loss})  # fedflex
    return Message(content=content, reply_to=msg)


app.evaluate()(plain.evaluate)

#: Flower's quickstart ClientApp, unchanged, behind FedNova's mod
app_fednova_mod = ClientApp(mods=[fednova_mod])
app_fednova_mod.train()(plain.train)
app_fednova_mod.evaluate()(plain.evaluate)
