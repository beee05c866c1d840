"""The ServerApp, as Flower's quickstart-pytorch writes it; the strategy line is the
one-line swap (``FedAvg(...)`` -> a fedflex strategy)."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result, Strategy

from fedflex.churn import Availability, MarkovChurn
from fedflex.strategies import HiCSFL
from flowerquickstart.task import Net, load_centralized, test

app = ServerApp()


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate the global model on the server's test set."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    loss, accuracy = test(model, load_centralized(), "cpu")
    return MetricRecord({"accuracy": accuracy, "loss": loss})


def run(grid: Grid, context: Context, strategy: Strategy) -> Result:
    """``strategy.start`` with the run config's rounds and learning rate."""
    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": context.run_config.get("lr", 0.01)}),
        num_rounds=context.run_config.get("num-server-rounds", 3),
        evaluate_fn=global_evaluate,
    )


def churn(grid: Grid, context: Context) -> Availability | None:
    """The availability schedule ``churn = "markov"`` turns on (None: every node is online).

    In simulation Flower keeps every SuperNode connected, so churn is a schedule over the
    strategy's client ids 0..N-1 (in simulation: the nodes' partition ids).
    """
    if context.run_config.get("churn", "none") == "none":
        return None
    num_nodes = len(list(grid.get_node_ids()))
    p_leave, p_join = context.run_config.get("churn-p-leave", 0.3), context.run_config.get("churn-p-join", 0.3)
    return MarkovChurn(num_nodes, p_leave=p_leave, p_join=p_join, seed=0)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the strategy, save the final model."""
    fraction_train = context.run_config.get("fraction-train", 0.5)
    availability = churn(grid, context)  # optional: None without churn = "markov"
    strategy = HiCSFL(fraction_train=fraction_train, availability=availability)  # was: FedAvg(fraction_train=...)
    result = run(grid, context, strategy)
    torch.save(result.arrays.to_torch_state_dict(), "final_model.pt")
