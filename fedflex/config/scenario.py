"""One complete scenario: every section, and the rules between sections, checked once
when it is made (:meth:`ScenarioConfig.validate`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fedflex.checks import ConfigError
from fedflex.checks import join as _join
from fedflex.checks import number as _num
from fedflex.config.churn import ChurnConfig
from fedflex.config.client import ClientConfig
from fedflex.config.data import DatasetConfig, PartitionConfig
from fedflex.config.model import TEXT_MODELS, ModelConfig
from fedflex.config.run import DeploymentConfig, EvaluationConfig, OutputConfig, SimulationConfig, SystemConfig
from fedflex.config.strategy import StrategyConfig


@dataclass
class ScenarioConfig:
    """One complete experiment.

    Built in code (``ScenarioConfig(rounds=5, churn=ChurnConfig(kind="markov"))``), it is
    validated and its unset defaults are filled at construction: a bad value raises
    :class:`ConfigError` naming the key.
    """

    name: str = "scenario"
    seed: int = 0
    num_clients: int = 20
    rounds: int = 20
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    churn: ChurnConfig = field(default_factory=ChurnConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        # a config built in code (ScenarioConfig(rounds=5, ...)) is checked and its
        # unset defaults (e.g. churn.min_session_rounds) filled as it is made
        self.validate()

    def _check_text_model(self) -> None:
        """Check that a text model reads token ids of an ``hf`` dataset; its embedding table has one row
        per id the tokenizer can emit (filled in when unset); LSTMs cannot be batched.
        """
        if self.model.name not in TEXT_MODELS:
            return
        if self.dataset.name != "hf":
            raise ConfigError(
                "model.name",
                self.model.name,
                f"reads token ids: use it with dataset.name=hf and a text input_column, not {self.dataset.name}",
            )
        rows = self.dataset.vocab_size + DatasetConfig.NUM_SPECIAL_TOKENS
        if self.model.vocab_size is None:
            self.model.vocab_size = rows
        elif self.model.vocab_size != rows:
            raise ConfigError(
                "model.vocab_size",
                self.model.vocab_size,
                f"must be dataset.vocab_size + {DatasetConfig.NUM_SPECIAL_TOKENS} = {rows} (or unset)",
            )
        if self.model.name == "text-lstm" and self.simulation.cohorts() == "on":
            raise ConfigError(
                self.simulation.cohorts_key(),
                "on",
                "model text-lstm cannot be trained as a batched cohort (torch.func.vmap has no rule for "
                "LSTM layers); use vectorize=off (or auto, which trains it one client at a time)",
            )

    def validate(self, path: str = "") -> None:
        """Check every section and the cross-section rules; raise :class:`ConfigError` naming the key."""
        _num(path, "seed", self.seed, ge=0)
        _num(path, "num_clients", self.num_clients, ge=1)
        _num(path, "rounds", self.rounds, ge=1)
        if self.strategy.sampler.clients_per_round is None:
            self.strategy.sampler.clients_per_round = min(5, self.num_clients)
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            if hasattr(sub, "validate"):
                sub.validate(_join(path, f.name))
        if self.partition.scheme == "natural" and self.dataset.name == "hf" and not self.dataset.client_column:
            raise ConfigError(
                "partition.scheme",
                "natural",
                "dataset hf splits naturally by a column: set dataset.client_column (writer, speaker, user id)",
            )
        if self.partition.scheme == "natural" and self.dataset.name not in ("synthetic", "hf"):
            raise ConfigError(
                "partition.scheme",
                "natural",
                f"dataset {self.dataset.name} has no natural split; "
                "use iid, dirichlet, shards, mixed-dirichlet or label-sets",
            )
        self._check_text_model()
        if self.deployment.wait_for_nodes > self.num_clients:
            raise ConfigError(
                "deployment.wait_for_nodes",
                self.deployment.wait_for_nodes,
                f"must be <= num_clients ({self.num_clients})",
            )
        batch_norm = self.model.name == "cnn-fmnist-authors" or (
            self.model.name == "resnet18" and self.model.norm == "batch"
        )
        if self.simulation.cohorts() == "on" and batch_norm:
            fix = "use model.norm=group, or " if self.model.name == "resnet18" else "use "
            raise ConfigError(
                self.simulation.cohorts_key(),
                "on",
                f"model {self.model.name} keeps BatchNorm running statistics, which a "
                f"batched cohort cannot keep per client; {fix}vectorize=auto / off",
            )
        if self.strategy.sampler.clients_per_round > self.num_clients:
            raise ConfigError(
                "strategy.sampler.clients_per_round",
                self.strategy.sampler.clients_per_round,
                f"must be <= num_clients ({self.num_clients})",
            )
        if self.strategy.sampler.min_clients > self.num_clients:
            raise ConfigError(
                "strategy.sampler.min_clients",
                self.strategy.sampler.min_clients,
                f"must be <= num_clients ({self.num_clients})",
            )
        for s, ids in enumerate(self.churn.sessions):
            for cid in ids:
                if not 0 <= cid < self.num_clients:
                    raise ConfigError(
                        f"churn.sessions[{s}]", list(ids), f"client ids must lie in 0..{self.num_clients - 1}"
                    )
        if self.partition.scheme == "mixed-dirichlet" and self.num_clients % len(self.partition.alphas):
            raise ConfigError(
                "num_clients",
                self.num_clients,
                f"mixed-dirichlet needs a multiple of len(partition.alphas) = {len(self.partition.alphas)}",
            )
