"""The task spec every train message carries: what a client needs to rebuild the task.

The third typed wire contract, beside the client's training settings
(:class:`~fedflex.config.ClientConfig`) and the local rule's options
(:class:`~fedflex.config.LocalRuleConfig`), which travel through
:func:`fedflex.records.to_record` / :func:`~fedflex.records.from_record`: the server
writes ``TaskSpec.of(cfg).to_record()`` into a train message's config
(:func:`fedflex.launch.server.train_config`), the client reads
:meth:`TaskSpec.from_record` back (``clients/runtime.py``).

It travels as one entry, :data:`fedflex.keys.TASK`, of stable JSON (sorted keys): its
sections hold lists (``partition.label_groups``, ``model.hidden``) that flat ConfigRecord
entries cannot, and a worker keys its cached task (data, partition, model) on that one
string, which every message of a run shares, so a round's clients parse and build it once.
A field the entry lacks inside a section takes the class default; a required field it
lacks, or a field this version does not know, is a :class:`TaskSpecError`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from fedflex import keys
from fedflex.config import DatasetConfig, ModelConfig, PartitionConfig, ScenarioConfig


class TaskSpecError(ValueError):
    """A train message's task spec is missing or does not parse; the message names the field."""


#: the sections of a task spec and their classes
_SECTIONS: dict[str, type] = {"dataset": DatasetConfig, "partition": PartitionConfig, "model": ModelConfig}


@dataclass
class TaskSpec:
    """The data set, partition and model sections of a scenario, its number of clients and
    seed, and the worker's ``device`` and ``num_threads`` (``client.device``,
    ``client.num_threads``): what a worker builds its task from.
    """

    dataset: DatasetConfig
    partition: PartitionConfig
    model: ModelConfig
    num_clients: int
    seed: int
    device: str = "auto"
    num_threads: int = 0

    @classmethod
    def of(cls, cfg: ScenarioConfig) -> TaskSpec:
        """Return the task spec of scenario ``cfg``."""
        return cls(
            dataset=cfg.dataset,
            partition=cfg.partition,
            model=cfg.model,
            num_clients=cfg.num_clients,
            seed=cfg.seed,
            device=cfg.client.device,
            num_threads=cfg.client.num_threads,
        )

    def to_record(self) -> dict[str, str]:
        """Return the ConfigRecord entry that carries this spec: :data:`~fedflex.keys.TASK` -> stable JSON."""
        return {keys.TASK: json.dumps(dataclasses.asdict(self), sort_keys=True)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TaskSpec:
        """Return the spec a train message's config record carries (:meth:`to_record`).

        Raises
        ------
        TaskSpecError
            The record has no task entry, or it does not parse (naming the field).
        """
        return cls.from_entry(cls.entry(record))

    @staticmethod
    def entry(record: Mapping[str, Any]) -> str:
        """Return the record's task entry as sent (equal entries, equal specs: what a worker
        keys its cached task on).

        Raises
        ------
        TaskSpecError
            The record has no task entry, or it is not a string.
        """
        text = record.get(keys.TASK)
        if not isinstance(text, str):
            raise TaskSpecError(
                f"the train message's config has no {keys.TASK!r} entry (the task spec: a string of JSON), "
                f"got {type(text).__name__}"
            )
        return text

    @classmethod
    def from_entry(cls, text: str) -> TaskSpec:
        """Return the spec of one task entry (the JSON :meth:`to_record` writes).

        Raises
        ------
        TaskSpecError
            Not a JSON object, a required field missing, or a field this version does not know.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise TaskSpecError(f"{keys.TASK}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise TaskSpecError(f"{keys.TASK}: a JSON object expected, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise TaskSpecError(f"{keys.TASK}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(fields)})")
        required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise TaskSpecError(f"{keys.TASK}: missing field(s) {', '.join(missing)} (required: {', '.join(required)})")
        kwargs: dict[str, Any] = {name: _section(name, section, data[name]) for name, section in _SECTIONS.items()}
        kwargs.update(num_clients=int(data["num_clients"]), seed=int(data["seed"]))
        if "device" in data:
            kwargs["device"] = str(data["device"])
        if "num_threads" in data:
            kwargs["num_threads"] = int(data["num_threads"])
        return cls(**kwargs)


def _section(name: str, cls: type, value: Any) -> Any:
    """Return section ``name`` of a task entry as ``cls`` (missing fields: the class defaults)."""
    if not isinstance(value, dict):
        raise TaskSpecError(f"{keys.TASK}.{name}: a JSON object expected, got {type(value).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise TaskSpecError(f"{keys.TASK}.{name}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(known)})")
    return cls(**value)
