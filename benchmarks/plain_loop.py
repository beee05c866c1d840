"""The same federated workload as a plain single-process PyTorch loop (no Flower, no Ray).

Reference for benchmarks/overhead.py: same data, partition, model, client sampling
count, local epochs, batch size and optimiser as the scenario; one evaluation at the end.
"""

import argparse
import copy
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedflex.config import load_scenario
from fedflex.data import load_dataset
from fedflex.models import build_model
from fedflex.partition import partition_data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_scenario(args.scenario, args.overrides)
    t0 = time.perf_counter()
    data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)
    part = partition_data(cfg.partition, data, cfg.num_clients, cfg.seed)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, data.train.input_shape, data.train.num_classes)
    rng = np.random.default_rng(cfg.seed)
    indices = [torch.as_tensor(ix) for ix in part.indices]
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
                    rows = ix[pos]
                    opt.zero_grad()
                    F.cross_entropy(model(data.train.inputs(rows)), data.train.labels(rows)).backward()
                    opt.step()
            states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            weights.append(len(ix))
        w = torch.tensor(weights, dtype=torch.float64) / sum(weights)
        model.load_state_dict({k: sum(wi * s[k].double() for wi, s in zip(w, states)).to(states[0][k].dtype) for k in states[0]})
    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(data.test.inputs(torch.arange(i, min(i + 1000, len(data.test))))).argmax(1)
                 == data.test.labels(torch.arange(i, min(i + 1000, len(data.test))))).sum())
            for i in range(0, len(data.test), 1000)
        )
    print(f"plain loop: {cfg.rounds} rounds, test accuracy {correct / len(data.test):.4f}, {time.perf_counter() - t0:.1f}s in-loop")


if __name__ == "__main__":
    main()
