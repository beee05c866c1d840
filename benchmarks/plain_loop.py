"""The same federated workload as a plain single-process PyTorch loop (no Flower, no Ray).

Reference for benchmarks/overhead.py: same data, partition, model, client sampling
count, local epochs, batch size and optimiser as the scenario; one evaluation at the end.
"""

import argparse
import copy
import dataclasses
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedflex.data import load_dataset
from fedflex.loader import load_scenario
from fedflex.models import build_model
from fedflex.partition import partition_data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: data and model live there")
    args = parser.parse_args()
    cfg = load_scenario(args.scenario, args.overrides)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)
    part = partition_data(cfg.partition, data, cfg.num_clients, cfg.seed)
    train = dataclasses.replace(data.train, x=data.train.x.to(device), y=data.train.y.to(device))
    test = dataclasses.replace(data.test, x=data.test.x.to(device), y=data.test.y.to(device))
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.train.input_shape, data.train.num_classes).to(device)
    rng = np.random.default_rng(cfg.seed)
    indices = [torch.as_tensor(ix).to(device) for ix in part.indices]
    t_loop = time.perf_counter()
    c = cfg.client
    for rnd in range(1, cfg.rounds + 1):
        chosen = rng.choice(cfg.num_clients, size=cfg.strategy.sampler.clients_per_round, replace=False)
        global_state = copy.deepcopy(model.state_dict())
        states, weights = [], []
        for cid in chosen:
            model.load_state_dict(global_state)
            opt = torch.optim.SGD(model.parameters(), lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)
            g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + rnd * 10_007 + int(cid))
            ix = indices[cid]
            model.train()
            for _ in range(c.epochs):
                for pos in torch.randperm(len(ix), generator=g).split(c.batch_size):
                    rows = ix[pos.to(device)]
                    opt.zero_grad()
                    F.cross_entropy(model(train.inputs(rows)), train.labels(rows)).backward()
                    opt.step()
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            weights.append(len(ix))
        w = torch.tensor(weights, dtype=torch.float64) / sum(weights)
        model.load_state_dict(
            {k: sum(wi * s[k].double() for wi, s in zip(w, states)).to(states[0][k].dtype) for k in states[0]}
        )
    model.eval()
    with torch.no_grad():
        correct = sum(
            int(
                (
                    model(test.inputs(torch.arange(i, min(i + 1000, len(test)), device=device))).argmax(1)
                    == test.labels(torch.arange(i, min(i + 1000, len(test)), device=device))
                ).sum()
            )
            for i in range(0, len(test), 1000)
        )
    print(
        f"plain loop: {cfg.rounds} rounds on {device}, test accuracy {correct / len(test):.4f}, "
        f"{time.perf_counter() - t0:.1f}s after start-up, {time.perf_counter() - t_loop:.1f}s in the loop"
    )


if __name__ == "__main__":
    main()
