"""Start-up of the in-process backend (issues 32, 46): it never imports Ray, whose import through
``flwr.simulation`` alone costs ~1.6 s of every run on this project's CPU, nor scipy's
clustering (0.3 s) when no sampler clusters, nor torch._dynamo (1.05 s: fedflex.lazy_dynamo)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_an_in_process_run_imports_neither_ray_nor_flowers_simulation_engine_nor_scipys_clustering():
    code = (
        "import sys, fedflex\n"
        "fedflex.run('scenarios/quickstart.yaml', ['rounds=1', 'simulation.backend=local'])\n"
        "print(sorted(m for m in ('ray', 'flwr.simulation', 'scipy.cluster', 'torch._dynamo') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
