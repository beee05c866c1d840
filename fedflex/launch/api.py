"""fedflex as a Python library: ``fedflex.run`` and ``fedflex.load_run``.

    import fedflex

    run = fedflex.run("scenarios/quickstart.yaml", ["rounds=5", "simulation.backend=local"])
    run.summary["final_test_accuracy"], run.rows[-1]["test_accuracy"], run.model["linear.weight"]

Without ``out`` the run stays in memory (rows, summary, final model): nothing is
written, no results directory and no checkpoint, plot or tracker file. With ``out`` it
writes the same directory as ``fedflex run --out`` and returns it read back.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

import numpy as np

from fedflex.config import ConfigError, ScenarioConfig
from fedflex.loader import load_scenario
from fedflex.results import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE, MemoryRecorder, read_metrics, unusable_out_dir

Scenario = Union[str, Path, ScenarioConfig, Mapping[str, Any]]


@dataclass
class Run:
    """One run's results.

    Attributes
    ----------
    rows
        One dict per round, as in metrics.jsonl (``round``, ``test_accuracy``, ...).
    summary
        As in summary.json (``status``, ``final_test_accuracy``, ``provenance``, ...).
    model
        The final global model: parameter name -> NumPy array (None if the run saved none).
    config
        The fully resolved scenario as plain data (what config.yaml holds).
    out
        The results directory, or None for a run kept in memory.
    """

    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    model: Optional[dict[str, np.ndarray]]
    config: dict[str, Any]
    out: Optional[Path] = None

    @property
    def status(self) -> Optional[str]:
        """``completed``, ``degraded``, ``interrupted``, ``diverged`` or ``failed``."""
        return self.summary.get("status")

    def curve(self, field: str = "test_accuracy") -> tuple[np.ndarray, np.ndarray]:
        """Return ``(rounds, values)`` of a metric over the train rounds that have it."""
        points = [
            (r["round"], r[field]) for r in self.rows if r.get("phase", "train") == "train" and r.get(field) is not None
        ]
        rounds, values = zip(*points) if points else ((), ())
        return np.asarray(rounds, dtype=np.int64), np.asarray(values, dtype=np.float64)

    def state_dict(self) -> dict[str, Any]:
        """Return the final model as a torch state dict (``model.load_state_dict(run.state_dict())``)."""
        import torch

        if self.model is None:
            raise ValueError("this run has no final model")
        return {k: torch.from_numpy(np.array(v)) for k, v in self.model.items()}


def scenario_config(scenario: Scenario, overrides: Iterable[str] = ()) -> ScenarioConfig:
    """Return a validated, complete config from a YAML path, a :class:`ScenarioConfig` or a
    mapping of scenario keys, with dotlist ``overrides`` on top.

    Raises
    ------
    ConfigError
        Naming the key, for an unknown key, a wrong type or a bad value.
    """
    overrides = [overrides] if isinstance(overrides, str) else list(overrides)
    if isinstance(scenario, ScenarioConfig):
        scenario = dataclasses.asdict(scenario)  # checked again: it may have been changed since it was made
    if isinstance(scenario, Mapping):
        return load_scenario(scenario, overrides)
    if isinstance(scenario, (str, Path)):
        return load_scenario(scenario, overrides)
    raise TypeError(f"scenario must be a YAML path, a ScenarioConfig or a dict, not {type(scenario).__name__}")


def run(
    scenario: Scenario, overrides: Iterable[str] = (), out: Optional[Union[str, Path]] = None, verbose: bool = False
) -> Run:
    """Run a scenario in simulation and return its results.

    Parameters
    ----------
    scenario
        A scenario YAML path, a :class:`~fedflex.config.ScenarioConfig` or a dict of
        scenario keys (missing keys take their defaults).
    overrides
        OmegaConf dotlist, e.g. ``["rounds=5", "client.lr=0.05"]``.
    out
        A new or empty results directory to write (as ``fedflex run --out``); None
        (default): nothing is written, the results stay in memory (``output.dir`` is
        not used then; trackers need a directory).
    verbose
        Flower's INFO logs (quiet otherwise).

    Raises
    ------
    ConfigError
        A bad scenario, override or ``out``, naming the key; nothing was run or written.
    """
    from fedflex.strategies.combinations import check_parts  # the API wires both sides, as the CLI does

    cfg = scenario_config(scenario, overrides)
    check_parts(cfg)
    from fedflex.launch import runner  # torch and Flower: after the cheap checks

    if out is None:
        if cfg.output.trackers:
            raise ConfigError(
                "output.trackers", list(cfg.output.trackers), "trackers write files: give fedflex.run an out= directory"
            )
        recorder = MemoryRecorder()
        runner.run(cfg, None, verbose=verbose, recorder=recorder)
        config = json.loads(json.dumps(dataclasses.asdict(cfg)))
        return Run(rows=recorder.rows, summary=recorder.summary, model=recorder.model, config=config)
    out = Path(out)
    problem = unusable_out_dir(out, option="the directory")
    if problem:
        raise ConfigError("out", str(out), problem)
    runner.run(cfg, out, verbose=verbose)
    return load_run(out)


def load_run(out: Union[str, Path]) -> Run:
    """Return a results directory read back (``fedflex run`` / ``fedflex.run(..., out=DIR)``).

    Raises
    ------
    FileNotFoundError
        When ``out`` has no metrics.jsonl (not a results directory).
    """
    import yaml

    out = Path(out)
    rows = read_metrics(out)
    summary_path = out / SUMMARY_FILE
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    config_path = out / CONFIG_FILE
    config = (yaml.safe_load(config_path.read_text()) or {}) if config_path.is_file() else {}
    model = None
    if (out / MODEL_FILE).is_file():
        with np.load(out / MODEL_FILE) as npz:
            model = {k: npz[k] for k in npz.files}
    return Run(rows=rows, summary=summary, model=model, config=config, out=out)
