"""How a scenario runs and what it writes: ``evaluation``, ``simulation``, ``system`` (the
simulated clock), ``deployment`` and ``output``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fedflex.checks import ConfigError
from fedflex.checks import choice as _choice
from fedflex.checks import join as _join
from fedflex.checks import number as _num


@dataclass
class EvaluationConfig:
    """Server-side evaluation of the global model on the test set every ``every`` rounds
    (and always after the last round).

    ``online_labels``: also report ``online_accuracy``, the accuracy on the test examples
    whose label some online client holds (the churn paper's metric). summary.json lists,
    per session transition, the mean accuracy over the ``transition_window`` rounds from
    the transition on.

    ``stop_at_accuracy``: end the run after the first evaluated round whose test accuracy
    reaches this value (0 = never; for rounds-to-target studies). summary.json then has
    ``stopped_early: true`` and ``rounds`` counts the rounds run. ``stop_smoothing``
    (odd window, 0 = off): run on until the Savitzky-Golay-smoothed accuracy curve
    (that window, polynomial order ``stop_smoothing_order``; HiCS-FL's plots use 13 and 3)
    has also reached the target at a point its window fully covers, so that both the raw
    and the smoothed rounds-to-target are known exactly (about window / 2 rounds more;
    after a resume the smoothing sees only the rounds since the resume, so the run may
    stop later, never earlier).

    ``stop_on_divergence``: end the run (``"status": "diverged"``, exit code 3) after a
    round whose replies were all rejected for NaN / Inf values, or whose global model or
    test loss is not finite; the rows, plots and model up to that round are kept. False:
    run on (a round without usable replies keeps the model).

    ``per_class`` (default on): each evaluated row gets ``class_accuracy`` (the test
    accuracy of each class) and ``worst_class_accuracy``; summary.json the final round's
    confusion matrix; the run directory ``confusion.png``. ``per_client``: ``off``
    (default: a row would hold a value per client), ``online`` or ``all``: each such
    client's accuracy on its own test split, ``client_test_size`` test examples drawn
    once (seeded) in its training labels' proportions (the test set has no per-client
    split of its own), from the same forward pass: rows get ``client_accuracy`` ([client,
    accuracy] pairs) and its mean, std, and the mean of the worst and of the best 10%
    of those clients (:mod:`fedflex.evaluation`).
    """

    every: int = 1
    batch_size: int = 1000
    online_labels: bool = False
    transition_window: int = 10
    stop_at_accuracy: float = 0.0
    stop_smoothing: int = 0
    stop_smoothing_order: int = 3
    stop_on_divergence: bool = True
    per_class: bool = True
    per_client: str = "off"
    client_test_size: int = 200

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "every", self.every, ge=1)
        _choice(path, "per_client", self.per_client, ("off", "online", "all"))
        _num(path, "client_test_size", self.client_test_size, ge=1)
        _num(path, "stop_at_accuracy", self.stop_at_accuracy, ge=0, le=1)
        _num(path, "stop_smoothing", self.stop_smoothing, ge=0)
        if self.stop_smoothing and self.stop_smoothing % 2 == 0:
            raise ConfigError(_join(path, "stop_smoothing"), self.stop_smoothing, "must be 0 (off) or an odd window")
        _num(path, "stop_smoothing_order", self.stop_smoothing_order, ge=0)
        if self.stop_smoothing and self.stop_smoothing_order >= self.stop_smoothing:
            raise ConfigError(
                _join(path, "stop_smoothing_order"),
                self.stop_smoothing_order,
                f"must be < stop_smoothing ({self.stop_smoothing})",
            )
        _num(path, "batch_size", self.batch_size, ge=1)
        _num(path, "transition_window", self.transition_window, ge=1)


@dataclass
class SimulationConfig:
    """How ``fedflex run`` simulates the federation.

    ``backend``: ``auto`` (default: ``ray`` when ``ray_address`` names a cluster, else
    ``local``; the resolved value is what config.yaml records), ``ray`` (Flower's
    simulation runtime: a Ray worker pool runs the ClientApp; ``num_cpus`` / ``num_gpus``
    per virtual client, fractions pack several per core or GPU) or ``local`` (the same
    ServerApp and ClientApp handlers in one process, a round's clients in cohorts or one
    after another, no Ray). On one machine ``local`` is the faster (issue 46, docs/scale.md:
    no Ray start-up, no message per client; torch uses every core for each step), so it is
    the default there; ``ray`` spreads clients over the processes of a cluster.

    ``vectorize``: train the clients of a round as batched cohorts
    (:mod:`clients.cohort`): ``rule`` (default) decides once per run, before round 1, by
    a fixed rule of the model, the device, the clients per round and the batch
    (:func:`clients.cohort.vectorize_rule`, no timing) and records its decision as
    ``vectorize_choice`` in the resolved config (config.yaml, which a resumed run reads):
    a resumed run and a re-run of the saved config train the same way, bit for bit.
    ``on`` always where the rule and model allow it, ``off`` one client at a time,
    ``auto`` times a step both ways once and predicts every round the faster way
    (logged; cohorts agree with one-by-one training to float rounding, not bit for bit,
    so ``auto``'s timing-based choice makes a run repeat only to float rounding). ``on``,
    ``off`` and ``rule`` repeat bit for bit (with ``cohort_size`` set when memory is
    tight: the chunking follows free memory). BHerd / GraB rounds and BatchNorm models
    always train one client at a time. ``vectorize_choice``: ``on`` / ``off``, what
    ``rule`` decided (set by the run; null: decide; ignored and cleared with another
    ``vectorize``). ``cohort_size``: most clients per batched computation (0: as many as
    fit half the device's free memory).
    On the ``ray`` backend a round's clients travel as one cohort message per Ray worker
    (:mod:`fedflex.launch.cohort_grid`); a real SuperNode is one client.

    ``ray_address``: attach the Ray backend to a running Ray cluster (``auto``, or the
    head's ``host:port`` from ``ray start --head``) instead of starting one in this
    process; every machine of the cluster needs fedflex installed and the data.
    """

    backend: str = "auto"
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    timeout: float = 3600.0
    vectorize: str = "rule"
    vectorize_choice: Optional[str] = None
    cohort_size: int = 0
    ray_address: Optional[str] = None

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "backend", self.backend, ("auto", "ray", "local"))
        if self.backend == "auto":  # resolved here: config.yaml (and a resume) says which ran
            self.backend = "ray" if self.ray_address else "local"
        # YAML 1.1 reads a bare on / off as a boolean, which OmegaConf then writes as a string
        bools = {"True": "on", "true": "on", "False": "off", "false": "off"}
        self.vectorize = bools.get(self.vectorize, self.vectorize)
        _choice(path, "vectorize", self.vectorize, ("rule", "auto", "on", "off"))
        if self.vectorize != "rule":
            self.vectorize_choice = None  # only rule records a choice
        elif self.vectorize_choice is not None:
            self.vectorize_choice = bools.get(str(self.vectorize_choice), str(self.vectorize_choice))
            _choice(path, "vectorize_choice", self.vectorize_choice, ("on", "off"))
        _num(path, "cohort_size", self.cohort_size, ge=0)
        _num(path, "num_cpus", self.num_cpus, gt=0)
        _num(path, "num_gpus", self.num_gpus, ge=0)
        _num(path, "timeout", self.timeout, gt=0)

    def cohorts(self) -> str:
        """How the run trains its clients: ``on``, ``off`` or ``auto``; ``rule`` gives its
        recorded choice (``off`` before the run made it).
        """
        if self.vectorize == "rule":
            return self.vectorize_choice or "off"
        return self.vectorize

    def cohorts_key(self) -> str:
        """Return the key that set :meth:`cohorts` (for error messages)."""
        return "simulation.vectorize_choice" if self.vectorize == "rule" else "simulation.vectorize"


@dataclass
class SystemConfig:
    """A system model on a simulated clock (simulation only; ``kind: none``, the default,
    keeps rounds as they are): each client has a compute speed and a bandwidth, drawn
    once per run; a client's round takes its local steps (``client.epochs`` x its batches)
    times ``step_s`` / its speed, plus its train message and its reply over its
    bandwidth. The server waits for every reply, or until ``deadline_s`` (replies later
    than it are stragglers: missing, not rejected), or for the first ``keep_first``;
    ``dropout`` is the chance that a sampled client drops out mid-round (its reply is
    missing too). ``partial`` (with a deadline; FLGo's completeness, FedNova's variable
    local work): a client whose planned steps would miss the deadline trains the first
    steps of them that fit, and its reply counts; without it, it is a straggler. Rows get
    ``sim_round_s`` and ``sim_clock_s``, and the ids of the ``stragglers``, ``dropouts``
    and (``partial``) ``partial`` clients (:mod:`fedflex.launch.system_grid`).

    ``kind: lognormal``: speeds and bandwidths are log-normal with median 1 and
    ``bandwidth`` bytes/s, log-sigmas ``speed_sigma`` and ``bandwidth_sigma`` (FLGo's and
    FedScale's heterogeneity, as a parametric default where no device profile is given).
    ``kind: fedscale``: each client's compute (ms per sample) and bandwidth (kbps) from
    ``profile``, a FedScale ``client_device_capacity`` file (pickle or JSON; a relative path
    resolves against the scenario file's folder), timed as FedScale does
    (:mod:`fedflex.fedscale`); ``step_s`` and the ``*_sigma`` / ``bandwidth`` keys are then
    not read.
    """

    kind: str = "none"
    profile: str = ""
    step_s: float = 0.01
    speed_sigma: float = 0.5
    bandwidth: float = 1e6
    bandwidth_sigma: float = 0.5
    deadline_s: float = 0.0
    keep_first: int = 0
    dropout: float = 0.0
    partial: bool = False

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "kind", self.kind, ("none", "lognormal", "fedscale"))
        if self.kind == "fedscale" and not self.profile:
            raise ConfigError(f"{path}.profile", self.profile, "kind fedscale needs a FedScale device-capacity file")
        _num(path, "step_s", self.step_s, gt=0)
        _num(path, "speed_sigma", self.speed_sigma, ge=0)
        _num(path, "bandwidth", self.bandwidth, gt=0)
        _num(path, "bandwidth_sigma", self.bandwidth_sigma, ge=0)
        _num(path, "deadline_s", self.deadline_s, ge=0)
        _num(path, "keep_first", self.keep_first, ge=0)
        _num(path, "dropout", self.dropout, ge=0, lt=1)
        if self.partial and not self.deadline_s:
            raise ConfigError(f"{path}.partial", self.partial, "cuts local work to a deadline: set deadline_s > 0")


@dataclass
class DeploymentConfig:
    """Waiting on a real federation (``flwr run`` on a SuperLink, ``fedflex deploy
    local``). In simulation every node exists from the start and answers, so these only
    bound waits that end at once.

    ``round_timeout``: seconds a round waits for the replies of the sampled SuperNodes
    (``null``: ``simulation.timeout``). A SuperNode that crashed is noticed by the
    SuperLink only after two missed heartbeats (about 60 s with Flower's defaults); its
    pending message then returns an error reply, so a round ends at the latest after
    ``round_timeout`` or that delay. Keep it above a node's normal reply time: a
    message that timed out is still processed by its node, which then lags behind.
    ``wait_for_nodes``: before round 1, wait until this many client ids have a live
    SuperNode (0: start at once with whoever is connected), at most ``wait_timeout``
    seconds. ``query_timeout``: seconds to wait for a new SuperNode to say its
    partition id.
    """

    round_timeout: Optional[float] = None
    wait_for_nodes: int = 0
    wait_timeout: float = 300.0
    query_timeout: float = 60.0

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "round_timeout", self.round_timeout, gt=0, optional=True)
        _num(path, "wait_for_nodes", self.wait_for_nodes, ge=0)
        _num(path, "wait_timeout", self.wait_timeout, ge=0)
        _num(path, "query_timeout", self.query_timeout, gt=0)


# tracker name -> (the module it needs, the fedflex extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}


def _missing_module(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


@dataclass
class OutputConfig:
    """Where results go: ``dir`` (default ``runs/<name>-<timestamp>``), PNG plots, progress.

    ``checkpoint_every``: save the server state (global model, parts' state, session
    tracker, round) every k rounds to ``checkpoint.npz`` (0: never); ``fedflex run
    --resume DIR`` continues from it. The final model is always saved (``model.npz``).

    ``trackers``: experiment trackers that also receive the run (:mod:`fedflex.tracking`):
    ``tensorboard`` (event files in ``DIR/tensorboard``), ``mlflow`` (``MLFLOW_TRACKING_URI``,
    else ``DIR/mlflow.db``), ``wandb`` (``WANDB_MODE=offline`` keeps it local). Each needs
    its package: ``pip install 'fedflex[tensorboard]'`` (or ``[mlflow]``, ``[wandb]``).
    """

    dir: Optional[str] = None
    plots: bool = True
    progress: str = "auto"  # auto | bar | lines | off
    checkpoint_every: int = 10
    trackers: list[str] = field(default_factory=list)

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        if self.progress in ("False", "false"):  # YAML reads a bare `off` as false
            self.progress = "off"
        _choice(path, "progress", self.progress, ("auto", "bar", "lines", "off"))
        _num(path, "checkpoint_every", self.checkpoint_every, ge=0)
        key = _join(path, "trackers")
        if isinstance(self.trackers, str):
            raise ConfigError(key, self.trackers, "must be a list of tracker names, e.g. [tensorboard]")
        for name in self.trackers:
            _choice(path, "trackers", name, tuple(TRACKERS))
            module, extra = TRACKERS[name]
            if _missing_module(module):
                raise ConfigError(
                    key, name, f"tracker {name} needs the {module} package: pip install 'fedflex[{extra}]'"
                )
        if len(set(self.trackers)) < len(self.trackers):
            raise ConfigError(key, list(self.trackers), "names a tracker twice")
