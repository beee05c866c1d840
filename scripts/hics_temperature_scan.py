"""How HiCS-FL's entropy estimate depends on the temperature T, on real FMNIST.

Every client of ``scenarios/hics_fmnist.yaml`` (setting (2), 50 clients, min_size 240)
trains its local epochs once from one common initialisation of the paper's CNN with the
scenario's optimiser settings (override them: ``--set client.momentum=0.9
client.weight_decay=5e-4``); for each T the script prints the variance and range of the
estimates H(softmax(db / T)) over the clients and their Spearman correlation with the
true label entropy, and the mean |db| (the scale T has to match, docs/hics-fl.md).

    python scripts/hics_temperature_scan.py
    python scripts/hics_temperature_scan.py --set client.momentum=0.9 client.weight_decay=5e-4
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

from fedflex.config import load_scenario  # noqa: E402
from fedflex.data import load_dataset  # noqa: E402
from fedflex.models import build_model, output_bias_key  # noqa: E402
from fedflex.partition import partition_data  # noqa: E402
from strategies.hics import entropy, softmax  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "hics_fmnist.yaml")
    parser.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=[0.0005, 0.001, 0.0025, 0.005, 0.0084, 0.01, 0.018, 0.025, 0.05],
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
    start = {k: v.clone() for k, v in model.state_dict().items()}
    order = torch.Generator().manual_seed(cfg.seed)
    c = cfg.client
    dbs = []
    for client in range(cfg.num_clients):
        idx = part.indices[client]
        x, y = data.train.inputs(idx), data.train.labels(idx)
        model.load_state_dict(start)
        opt = torch.optim.SGD(model.parameters(), lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
        for _ in range(c.epochs):
            perm = torch.randperm(len(idx), generator=order)
            for b in range(0, len(idx), c.batch_size):
                rows = perm[b : b + c.batch_size]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
                opt.step()
        dbs.append((model.state_dict()[key] - start[key]).numpy().astype(np.float64))
    db = np.stack(dbs)
    truth = part.entropies()
    print(
        f"lr {c.lr}, momentum {c.momentum}, weight decay {c.weight_decay}, {c.epochs} epochs, batch {c.batch_size}: "
        f"mean |db| {np.abs(db).mean():.5f}"
    )
    print("| T | variance of the estimates | range | Spearman with the true label entropy |")
    print("|---|---|---|---|")
    for t in args.temperatures:
        h = entropy(softmax(db, t))
        print(f"| {t:g} | {h.var():.3f} | {h.min():.2f}-{h.max():.2f} | {spearmanr(h, truth).statistic:.2f} |")


if __name__ == "__main__":
    main()
