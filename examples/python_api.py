"""fedflex from Python: run the quickstart in memory, compare two samplers, read a run back.

    python examples/python_api.py

Runs three tiny quickstart simulations in one process (no Ray, a few seconds each) and
writes only the third, into a temporary directory that it removes at the end.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import fedflex
from fedflex.config import ChurnConfig

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
TINY = [
    "rounds=5",
    "num_clients=10",
    "dataset.samples_per_client=100",
    "simulation.backend=local",
    "output.progress=off",
]


def main() -> None:
    # 1. two samplers on the same scenario and seed, kept in memory
    for sampler in ("uniform", "pow-d"):
        run = fedflex.run(QUICKSTART, [*TINY, f"strategy.sampler.name={sampler}"])
        rounds, accuracy = run.curve("test_accuracy")
        print(
            f"{sampler:8s} status={run.status} final={run.summary['final_test_accuracy']:.4f} curve={accuracy.round(3)}"
        )

    # 2. a config built in code: checked and completed as it is made
    cfg = fedflex.ScenarioConfig(name="in-code", rounds=3, num_clients=6, churn=ChurnConfig(kind="markov"))
    cfg.simulation.backend = "local"
    cfg.output.progress = "off"
    print("Markov churn: min_session_rounds filled in as", cfg.churn.min_session_rounds)
    try:
        fedflex.ScenarioConfig(rounds=0)
    except fedflex.ConfigError as exc:
        print("refused:", exc)

    # 3. written to a directory (as `fedflex run --out`) and read back
    with tempfile.TemporaryDirectory() as tmp:
        written = fedflex.run(cfg, out=Path(tmp) / "run")
        loaded = fedflex.load_run(written.out)
        print("files:", sorted(p.name for p in written.out.iterdir()))
        print("provenance:", loaded.summary["provenance"])
        print("model:", {k: v.shape for k, v in loaded.model.items()})


if __name__ == "__main__":
    main()
