"""Which local steps does BHerd's herding keep, and how far is the herded step from the
mean gradient? A diagnostic for docs/bherd.md ("Why the CNN diverges at lr 0.01").

Runs plain FedAvg (full participation, E = 1, the scenario's batch size) for ``--rounds``
rounds and, for every client and round, records all tau local gradients, runs BHerd's
selection (Algorithm 2 on the centred Gram matrix, k = round(alpha tau)) on them and
prints: the relative gap ||g/k - mean(z)|| / ||mean(z)|| (``herd_gap`` in metrics.jsonl),
||mean(z)||, the length ratio ||g/k|| / ||mean(z)|| and the cosine between g/k and mean(z),
the mean position of the selected steps (0 = first step, 1 = last), the share
of selected steps from the first quarter of the epoch, and the mean gradient norm in each
quarter of the epoch. FedAvg's trajectory is used (not BHerd's) so that the figures
describe the gradients, not a diverging run.

    python scripts/bherd_gradient_positions.py --lr 0.01 --rounds 4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedflex.clients.bherd import centered_gram, herd_k, herd_select  # noqa: E402
from fedflex.data import load_dataset  # noqa: E402
from fedflex.loader import load_scenario  # noqa: E402
from fedflex.models import build_model  # noqa: E402
from fedflex.partition import partition_data  # noqa: E402

CASE2 = ["partition.scheme=label-groups", "partition.label_groups=[[0,5],[1,6],[2,7],[3,8],[4,9]]"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "bherd_fmnist_cnn.yaml")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--iid", action="store_true", help="Case 1 instead of Case 2")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_scenario(args.scenario, [] if args.iid else CASE2)
    data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)
    part = partition_data(cfg.partition, data, cfg.num_clients, cfg.seed)
    x, y = data.train.inputs(), data.train.labels()
    loss_fn = torch.nn.functional.cross_entropy
    torch.manual_seed(cfg.seed)
    shape = data.train.input_shape
    global_model = build_model(cfg.model, shape, data.train.num_classes)
    order = torch.Generator().manual_seed(cfg.seed)
    batch = cfg.client.batch_size
    for rnd in range(1, args.rounds + 1):
        average = [torch.zeros_like(p) for p in global_model.parameters()]
        for c in range(cfg.num_clients):
            model = build_model(cfg.model, shape, data.train.num_classes)
            model.load_state_dict(global_model.state_dict())
            idx = torch.as_tensor(part.indices[c])
            perm = idx[torch.randperm(len(idx), generator=order)]
            grads = []
            for b in range(len(perm) // batch):
                rows = perm[b * batch : (b + 1) * batch]
                model.zero_grad()
                loss_fn(model(x[rows]), y[rows]).backward()
                grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
                with torch.no_grad():
                    for p in model.parameters():
                        p -= args.lr * p.grad
            z = torch.stack(grads)
            tau = len(z)
            k = herd_k(args.alpha, tau)
            sel = herd_select(centered_gram(z), k)
            mean = z.mean(0)
            herded = z[sel].sum(0) / k
            gap = float((herded - mean).norm() / mean.norm())
            ratio = float(herded.norm() / mean.norm())
            cos = float(herded @ mean / (herded.norm() * mean.norm()))
            pos = np.array(sel) / max(tau - 1, 1)
            quarters = [float(z[i * tau // 4 : (i + 1) * tau // 4].norm(dim=1).mean()) for i in range(4)]
            print(
                f"round {rnd} client {c}: herd_gap {gap:.2f}  |mean z| {float(mean.norm()):.3f}  "
                f"|g/k| / |mean z| {ratio:.2f}  cos(g/k, mean z) {cos:.2f}  "
                f"selected: mean position {pos.mean():.2f}, from the first quarter {np.mean(pos < 0.25):.2f}  "
                f"|z| by quarter {np.round(quarters, 2).tolist()}",
                flush=True,
            )
            with torch.no_grad():
                for a, p in zip(average, model.parameters()):
                    a += p / cfg.num_clients
        with torch.no_grad():
            for p, a in zip(global_model.parameters(), average):
                p.copy_(a)


if __name__ == "__main__":
    main()
