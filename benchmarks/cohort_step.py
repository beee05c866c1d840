"""A round's local training one client at a time (``vectorize: off``) against one cohort
(``on``), the only work in which the two differ, and what ``vectorize: rule`` picks.

For models whose whole-process runs are dominated by something else on a CPU (``resnet18``:
the final evaluation of 10,000 test images takes minutes), this times the training path
alone: ``clients.train.local_train`` for each client against ``clients.cohort.train_cohort``
over the same clients, in chunks of what fits half the free memory (as the ClientApp
does). FMNIST-shaped random images (the time does not depend on the pixels), K clients of
``--examples`` each, ``--steps`` local steps of ``--batch``, SGD momentum 0.9; medians of
``--pairs`` alternating runs.

    python benchmarks/cohort_step.py --model resnet18 --norm group --clients 5 100 --steps 2
"""

import argparse
import copy
import statistics
import time

import torch

from fedflex.clients.cohort import CohortClient, cohort_chunk_size, train_cohort, vectorize_rule
from fedflex.clients.train import TrainSettings, local_train
from fedflex.config import ModelConfig
from fedflex.data import ArrayDataset
from fedflex.models import build_model

CPU = torch.device("cpu")


def _clients(lo: int, hi: int, examples: int) -> list[CohortClient]:
    return [
        CohortClient(torch.arange(c * examples, (c + 1) * examples), torch.Generator().manual_seed(c))
        for c in range(lo, hi)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--norm", default=None, help="resnet18's norm (group: GroupNorm, batchable)")
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 100])
    ap.add_argument("--examples", type=int, default=60, help="examples per client")
    ap.add_argument("--steps", type=int, default=2, help="local steps per client")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
    mcfg = ModelConfig(name=args.model, **({"norm": args.norm} if args.norm else {}))
    torch.manual_seed(0)
    model = build_model(mcfg, (1, 28, 28), 10)
    start = copy.deepcopy(model.state_dict())
    worker = copy.deepcopy(model)  # the model a worker trains its clients in, one after another
    settings = TrainSettings(steps=args.steps, batch_size=args.batch, lr=0.01, momentum=0.9)
    print(
        f"{args.model} {args.norm or ''}; {args.steps} steps of batch {args.batch}; threads {torch.get_num_threads()}"
    )
    print(f"{'K':>4} {'off s':>8} {'on s':>8} {'on/off':>7} {'chunk':>6}  rule")
    for k in args.clients:
        n = k * args.examples
        g = torch.Generator().manual_seed(1)
        data = ArrayDataset(
            torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=g),
            torch.randint(0, 10, (n,), generator=g),
            10,
            mean=(0.5,),
            std=(0.25,),
        )
        example = data.inputs(torch.zeros(1, dtype=torch.long))
        chunk = min(k, cohort_chunk_size(model, example, settings, CPU))
        choice, _ = vectorize_rule(model, example, CPU, k, args.batch, float(args.examples))

        def run(name: str, k: int = k, data: ArrayDataset = data, chunk: int = chunk) -> float:
            t0 = time.perf_counter()
            if name == "off":
                for c in _clients(0, k, args.examples):  # as the ClientApp: the global state into one model
                    worker.load_state_dict(start)
                    local_train(worker, data, c.indices, settings, c.generator, CPU, c.terms)
            else:
                for lo in range(0, k, chunk):
                    train_cohort(model, data, _clients(lo, min(k, lo + chunk), args.examples), settings, CPU)
            return time.perf_counter() - t0

        run("off"), run("on")  # warm-up: first-call costs (allocator, kernels) out of the pairs
        times: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(args.pairs):
            for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                times[name].append(run(name))
        a, b = statistics.median(times["off"]), statistics.median(times["on"])
        print(f"{k:>4} {a:>8.2f} {b:>8.2f} {b / a:>7.2f} {chunk:>6}  {choice}", flush=True)


if __name__ == "__main__":
    main()
