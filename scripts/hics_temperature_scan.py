"""How HiCS-FL's entropy estimate depends on the temperature T, on real FMNIST.

Every client of ``scenarios/hics_fmnist.yaml`` (setting (2), 50 clients, min_size 240)
trains its local epochs once from one common initialisation of the paper's CNN with the
scenario's optimiser settings (override them: ``--set client.momentum=0.9
client.weight_decay=5e-4``); for each T the script prints the variance and range of the
estimates H(softmax(db / T)) over the clients and their Spearman correlation with the
true label entropy, and the mean |db| (the scale T has to match, docs/hics-fl.md).

    python scripts/hics_temperature_scan.py
    python scripts/hics_temperature_scan.py --set client.momentum=0.9 client.weight_decay=5e-4
    python scripts/hics_temperature_scan.py --at-rounds 0 10 40 80 --set client.momentum=0.9 ...

``--at-rounds``: the clients train from the global model of a FedAvg run (K random
clients a round, plain mean) after that many rounds, for the bias estimate and the two
scale-free ones (``unit``: db / ||db||, ``per-step``: db / (lr x steps)).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedflex.data import load_dataset  # noqa: E402
from fedflex.loader import load_scenario  # noqa: E402
from fedflex.models import build_model, output_bias_key  # noqa: E402
from fedflex.partition import partition_data  # noqa: E402
from fedflex.strategies.hics import entropy, scaled_update, softmax  # noqa: E402


def local_update(model, start, x, y, c, order, key, steps_out: list) -> np.ndarray:
    """Train ``model`` from ``start`` on (x, y) for the scenario's epochs; its new state."""
    model.load_state_dict(start)
    opt = torch.optim.SGD(model.parameters(), lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
    steps = 0
    for _ in range(c.epochs):
        perm = torch.randperm(len(y), generator=order)
        for b in range(0, len(y), c.batch_size):
            rows = perm[b : b + c.batch_size]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
            opt.step()
            steps += 1
    steps_out.append(steps)
    return {k: v.clone() for k, v in model.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "hics_fmnist.yaml")
    parser.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=[0.0005, 0.001, 0.0025, 0.005, 0.0084, 0.01, 0.018, 0.025, 0.05],
        help="temperatures of the bias estimate",
    )
    parser.add_argument(
        "--scale-free-temperatures",
        type=float,
        nargs="+",
        default=[0.03, 0.05, 0.1, 0.2, 0.3, 0.5],
        help="temperatures of the unit and per-step estimates",
    )
    parser.add_argument(
        "--at-rounds",
        type=int,
        nargs="+",
        default=[0],
        help="measure after these many rounds of FedAvg with K random clients (0: the initial model)",
    )
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="scenario overrides")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_scenario(args.scenario, args.set)
    data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)
    part = partition_data(cfg.partition, data, cfg.num_clients, cfg.seed)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.train.input_shape, data.train.num_classes)
    key = output_bias_key(model)
    glob = {k: v.clone() for k, v in model.state_dict().items()}
    order = torch.Generator().manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    c = cfg.client
    k = cfg.strategy.sampler.clients_per_round
    xs = [data.train.inputs(part.indices[i]) for i in range(cfg.num_clients)]
    ys = [data.train.labels(part.indices[i]) for i in range(cfg.num_clients)]
    truth = part.entropies()
    print(
        f"lr {c.lr}, momentum {c.momentum}, weight decay {c.weight_decay}, {c.epochs} epochs, batch {c.batch_size}; "
        f"every client trains once from the global model after R rounds of FedAvg (K = {k}, random)"
    )
    done = 0
    rows: list[str] = []
    for at in sorted(args.at_rounds):
        while done < at:  # FedAvg rounds: K random clients, plain mean
            picks = rng.choice(cfg.num_clients, size=k, replace=False)
            states = [local_update(model, glob, xs[i], ys[i], c, order, key, []) for i in picks]
            glob = {n: sum(s[n].double() for s in states).div(len(states)).to(glob[n].dtype) for n in glob}
            done += 1
        steps: list[int] = []
        db = np.stack(
            [
                (local_update(model, glob, xs[i], ys[i], c, order, key, steps)[key] - glob[key]).numpy()
                for i in range(cfg.num_clients)
            ]
        ).astype(np.float64)
        steps_arr = np.asarray(steps)
        for estimate, temps in (
            ("bias", args.temperatures),
            ("unit", args.scale_free_temperatures),
            ("per-step", args.scale_free_temperatures),
        ):
            v = np.stack([scaled_update(db[i], estimate, c.lr, steps_arr[i]) for i in range(len(db))])
            for t in temps:
                h = entropy(softmax(v, t))
                rows.append(
                    f"| {at} | {estimate} | {t:g} | {h.var():.3f} | {h.min():.2f}-{h.max():.2f} "
                    f"| {spearmanr(h, truth).statistic:.2f} |"
                )
        print(f"round {at}: mean |db| {np.abs(db).mean():.5f}", flush=True)
    print("| round | estimate | T | variance of the estimates | range | Spearman with the true label entropy |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
