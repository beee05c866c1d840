"""A sweep member's process: where the ``fedflex`` it runs lives, its environment, and how
it ended. Shared by the local executor (:mod:`fedflex.study.sweep`) and the Ray one
(:mod:`fedflex.study.ray_executor`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def fedflex_root() -> str:
    """Return the folder holding the ``fedflex`` package that runs this sweep (its members run it too)."""
    return str(Path(__file__).resolve().parents[2])


def child_env(base: dict[str, str], root: str, threads: Optional[int]) -> dict[str, str]:
    """Return a member's environment: ``base`` with ``root`` first on ``PYTHONPATH`` and, when
    ``threads`` is given, ``OMP_NUM_THREADS`` and friends set to it.
    """
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    if threads is not None:
        env.update({var: str(threads) for var in THREAD_VARS})
    return env


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a member's process ended: its exit code, or None with a ``note`` when there is
    none (the member never started, or the machine that ran it was lost).
    """

    code: Optional[int]
    note: str = ""
