"""Loading a scenario: defaults <- YAML file <- dotlist overrides, old option spellings
mapped to the new ones (:data:`fedflex.options.ALIASES`), checked, and the warnings about
options the chosen parts do not read.

Scenario files are read with a YAML loader that refuses a key given twice; OmegaConf's
errors become one-line :class:`~fedflex.checks.ConfigError` s naming the key.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedflex.checks import ConfigError
from fedflex.config import SamplerConfig, ScenarioConfig, StrategyConfig
from fedflex.fedscale import read_device_profile
from fedflex.options import ALIASES
from fedflex.trace import read_trace

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- old spellings
def _deprecated(old: str, new: tuple[str, ...], warn: bool = True) -> str:
    message = f"{old} is deprecated (read for one more release): write {' and '.join(new)}"
    if warn:
        logger.warning(message)
    return message


def _is_section(value: Any) -> bool:
    return isinstance(value, (Mapping, DictConfig))


def alias_mapping(data: Mapping[str, Any], warn: bool = True) -> dict[str, Any]:
    """Return ``data`` (a scenario's nested mapping) with every old key of
    :data:`~fedflex.options.ALIASES` moved to its new place (a warning each, unless
    ``warn`` is False: e.g. reading the saved ``config.yaml`` of an earlier run).
    An old key that names several new ones (``strategy.sampler.ward``) sets those of the
    part the mapping names, when it names one.

    Raises
    ------
    ConfigError
        When a scenario gives an option in both spellings.
    """
    out = _plain(data)
    for old, new in ALIASES.items():
        *parents, leaf = old.split(".")
        node = out
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
            if node is None:
                break
        if not isinstance(node, dict) or leaf not in node or _is_section(node[leaf]):
            continue
        value = node.pop(leaf)
        _deprecated(old, new, warn)
        for target in _targets(new, node.get("name")):
            *tparents, tleaf = target.split(".")
            tnode = out
            for key in tparents:
                tnode = tnode.setdefault(key, {})
            if tleaf in tnode and tnode[tleaf] != value:
                raise ConfigError(old, value, f"given again as {target} = {tnode[tleaf]!r}: keep only {target}")
            tnode[tleaf] = value
    return out


def _targets(new: tuple[str, ...], name: Any) -> tuple[str, ...]:
    """Of several new keys, those whose section the part named ``name`` reads (all when
    none or no name).
    """
    if len(new) == 1 or not isinstance(name, str):
        return new
    read = []
    for target in new:
        _, part, section, _ = target.split(".")
        options = getattr(_default_part(part), section, None)
        if options is not None and name in type(options).PARTS:
            read.append(target)
    return tuple(read) or new


def _default_part(part: str) -> Any:
    from fedflex import config

    return {
        "sampler": config.SamplerConfig,
        "aggregator": config.AggregatorConfig,
        "initializer": config.InitializerConfig,
        "local_rule": config.LocalRuleConfig,
    }[part]()


def _plain(data: Any) -> Any:
    if isinstance(data, DictConfig):
        data = OmegaConf.to_container(data)
    if isinstance(data, Mapping):
        return {k: _plain(v) for k, v in data.items()}
    return data


def alias_overrides(overrides: Iterable[str]) -> list[str]:
    """Dotlist overrides with every old key of :data:`~fedflex.options.ALIASES` written
    the new way (a warning each).
    """
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        new = ALIASES.get(key.strip())
        if sep and new and not value.lstrip().startswith("{"):
            _deprecated(key.strip(), new)
            out += [f"{target}={value}" for target in new]
        else:
            out.append(item)
    return out


# ---------------------------------------------------------------------------- loading
#: callables that return ``strategy.sampler`` sections the schema does not declare (section
#: -> options class): the part registry (``strategies/build.py``) adds its own when it is
#: imported, so that the core need not import the registry
SECTION_SOURCES: list[Callable[[], Mapping[str, type]]] = []


def scenario_schema() -> type[ScenarioConfig]:
    """Return the scenario's dataclass: :class:`ScenarioConfig`, its ``strategy.sampler``
    extended by the options section of each registered sampler it does not declare (a
    sampler added by its module and its line in ``strategies.build.SAMPLERS``), as the
    :data:`SECTION_SOURCES` say.
    """
    extra = {name: cls for source in SECTION_SOURCES for name, cls in source().items()}
    return _extended(tuple(sorted(extra.items()))) if extra else ScenarioConfig


@functools.lru_cache(maxsize=8)
def _extended(sections: tuple[tuple[str, type], ...]) -> type[ScenarioConfig]:
    """Return subclasses of the scenario's dataclasses whose sampler section has ``sections``."""
    sampler = dataclasses.make_dataclass(
        "SamplerConfig",
        [(name, cls, dataclasses.field(default_factory=cls)) for name, cls in sections],
        bases=(SamplerConfig,),
    )
    strategy = dataclasses.make_dataclass(
        "StrategyConfig", [("sampler", sampler, dataclasses.field(default_factory=sampler))], bases=(StrategyConfig,)
    )
    return dataclasses.make_dataclass(
        "ScenarioConfig", [("strategy", strategy, dataclasses.field(default_factory=strategy))], bases=(ScenarioConfig,)
    )


def load_scenario(
    path: Optional[str | Path | Mapping[str, Any]] = None, overrides: Iterable[str] = ()
) -> ScenarioConfig:
    """Load a scenario: defaults <- YAML file <- dotlist overrides; validate; return it.

    ``path`` may also be a mapping of scenario keys (a scenario built in code, e.g.
    ``dataclasses.asdict(cfg)``): it is checked as a file's content would be, and a
    relative ``churn.trace`` or ``system.profile`` resolves against the working directory (a
    file's own, against the file's folder).

    Raises
    ------
    ConfigError
        For an unknown key, a wrong type, a bad value or an unreadable file.
    """
    schema = OmegaConf.structured(scenario_schema())
    layers: list[DictConfig | ListConfig] = []
    file_paths: dict[str, Any] = {}  # the file's own churn.trace / system.profile: relative to the file
    if isinstance(path, Mapping):
        try:
            layers.append(OmegaConf.create(alias_mapping(path)))
        except OmegaConfBaseException as exc:
            raise _from_omegaconf(exc) from None
        path = None
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("scenario", str(path), "no such file")
        layers.append(OmegaConf.create(alias_mapping(read_yaml(p))))
        file_paths = {k: OmegaConf.select(layers[0], k, default=None) for k in ("churn.trace", "system.profile")}
    overrides = alias_overrides(overrides)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, None, "overrides are dotted.key=value")
    if overrides:
        try:
            layers.append(OmegaConf.from_dotlist(overrides))
        except OmegaConfBaseException as exc:
            raise ConfigError(overrides[0].split("=")[0], overrides[0], _first_line(exc)) from None
    try:
        merged = OmegaConf.merge(schema, *layers)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        error = _from_omegaconf(exc)
        if error.key == "scenario" and overrides:  # Omegaconf did not say which key: find it
            error = _culprit(schema, layers[:-1], overrides) or error
        raise error from None
    except TypeError:  # a mapping where a list goes (or the reverse): OmegaConf names no key
        raise _container_culprit(schema, layers) from None
    if not isinstance(cfg, ScenarioConfig):
        raise ConfigError("scenario", str(path), "did not load as a scenario")
    # validated once, as it was made (ScenarioConfig.__post_init__); the parts' combinations:
    # strategies.combinations.load_checked
    warn_unused(cfg)
    warn_measured(cfg)
    for key, section in (("churn.trace", cfg.churn), ("system.profile", cfg.system)):
        name = key.split(".")[1]
        if getattr(section, name):
            from_file = path is not None and file_paths.get(key) and not any(o.startswith(f"{key}=") for o in overrides)
            base = Path(path).resolve().parent if from_file and path is not None else Path.cwd()
            setattr(section, name, str((base / Path(getattr(section, name)).expanduser()).resolve()))
    try:
        if cfg.churn.kind == "trace":
            read_trace(cast(str, cfg.churn.trace), cfg.num_clients)  # set: checked by validate
    except ValueError as exc:
        raise ConfigError("churn.trace", cfg.churn.trace, str(exc)) from None
    try:
        if cfg.system.kind == "fedscale":
            read_device_profile(cfg.system.profile)
    except ValueError as exc:
        raise ConfigError("system.profile", cfg.system.profile, str(exc)) from None
    return cfg


def warn_unused(cfg: ScenarioConfig) -> list[str]:
    """Warn (and return the warnings) for every part option set away from its default
    that the chosen part does not read, e.g. ``strategy.local_rule.fedprox.mu`` with rule sgd.
    """
    said = []
    for part in ("sampler", "aggregator", "initializer", "local_rule"):
        options = getattr(cfg.strategy, part)
        for option, value, owners in options.unused():
            said.append(
                f"strategy.{part}.{option}={value} does nothing for {part.replace('_', ' ')} {options.name} "
                f"(read by: {', '.join(owners)})"
            )
    for option, value, decider, readers in cfg.client.unused():
        said.append(
            f"client.{option}={value} does nothing for client.{decider} {getattr(cfg.client, decider)} "
            f"(read by {decider}: {', '.join(readers)})"
        )
    for message in said:
        logger.warning(message)
    return said


def warn_measured(cfg: ScenarioConfig) -> list[str]:
    """Warn (and return the warnings) for a valid combination measured to fail: FedAWARE
    (or the AWARE plug-in) solving over the momenta of offline clients under session churn.
    """
    said = []
    agg = cfg.strategy.aggregator
    if cfg.churn.kind == "sessions" and (agg.name == "fedaware" or agg.aware.enabled) and agg.aware.departed == "keep":
        said.append(
            "strategy.aggregator.aware.departed=keep: AWARE's min-norm solve keeps the momenta of the "
            "sessions that are offline; under churn.kind=sessions with a label set per session this "
            "stopped the model learning every other session (measured: docs/composition.md, setting (d)); "
            "departed=exclude leaves them out while their clients are offline"
        )
    for message in said:
        logger.warning(message)
    return said


class _DuplicateKey(Exception):
    """A mapping key the loader refuses: given twice, or not a name."""


def _unique_key_loader(names_only: bool = True):
    """Return a yaml SafeLoader class that refuses a key given twice in one mapping, a list or
    mapping as a key, and (``names_only``) any key that is not a string (built on first use:
    yaml is imported only when a file is read).
    """
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            mark = key_node.start_mark
            where = f"line {mark.line + 1} column {mark.column + 1}"
            if not isinstance(key_node, yaml.ScalarNode):  # [1, 2]: is YAML, but no key of ours
                raise _DuplicateKey(f"a {type(key).__name__} as a key ({where}); keys are names")
            if names_only and not isinstance(key, str):  # ~:, 1:, true: are no scenario key
                raise _DuplicateKey(f"key {key!r} ({where}) is not a name; scenario keys are names such as rounds")
            if key in seen:
                raise _DuplicateKey(f"key {key!r} given twice (line {seen[key] + 1}, and {where})")
            seen[key] = mark.line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


def read_yaml(p: Path, names_only: bool = True) -> dict:
    """Return a scenario file's mapping; syntax errors name the line and column, a key given
    twice names both lines, a top level that is not a mapping is refused, and so is a key that
    is not a string unless ``names_only`` is false (a study's variant may be named 0.1).
    """
    import yaml

    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("scenario", str(p), f"cannot be read ({exc})") from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader(names_only))
    except _DuplicateKey as exc:
        raise ConfigError("scenario", str(p), str(exc)) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError("scenario", str(p), f"not valid YAML ({where}{exc.problem or exc.context})") from None
    except yaml.YAMLError as exc:
        raise ConfigError("scenario", str(p), f"not valid YAML ({_first_line(exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            "scenario",
            str(p),
            f"the top level must be a mapping of keys (name: ..., rounds: ...), not a {type(data).__name__}",
        )
    return data


def _culprit(schema, file_layers: list, overrides: list[str]) -> Optional[ConfigError]:
    """Return the first override that fails on its own, as a ConfigError naming its key."""
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            OmegaConf.to_object(OmegaConf.merge(schema, *file_layers, OmegaConf.from_dotlist([item])))
        except OmegaConfBaseException as exc:
            return ConfigError(key, value, _first_line(exc))
    return None


def _container_culprit(schema, layers: list) -> ConfigError:
    """Return a ConfigError naming the key whose value is a mapping where the schema has a
    list, or a list where it has a mapping (OmegaConf's merge raises a bare TypeError).
    """

    def find(key: str, value: Any) -> Optional[ConfigError]:
        try:
            node = OmegaConf.select(schema, key, default=None)
        except OmegaConfBaseException:
            node = None
        if isinstance(node, ListConfig) and isinstance(value, dict):
            return ConfigError(key, value, "must be a list, not a mapping")
        if isinstance(node, DictConfig) and isinstance(value, list):
            return ConfigError(key, value, "must be a mapping of keys, not a list")
        for name, child in value.items() if isinstance(value, dict) else ():
            found = find(f"{key}.{name}", child)
            if found is not None:
                return found
        return None

    for layer in layers:
        data = OmegaConf.to_container(layer)
        for name, value in data.items() if isinstance(data, dict) else ():
            found = find(str(name), value)
            if found is not None:
                return found
    return ConfigError("scenario", None, "a mapping where a list goes, or a list where a mapping goes")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _from_omegaconf(exc: OmegaConfBaseException) -> ConfigError:
    key = getattr(exc, "full_key", None) or "scenario"
    msg = _first_line(exc)
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        allowed = "unknown key"
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        known = _known_keys(parent)
        if known:
            allowed += "; known keys here: " + ", ".join(known)
        return ConfigError(key, getattr(exc, "key", key), allowed)
    value = getattr(exc, "value", None) if hasattr(exc, "value") else None
    return ConfigError(key, value, msg)


def _known_keys(parent: str) -> list[str]:
    node: Any = ScenarioConfig
    for part in [p for p in parent.split(".") if p]:
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in fields:
            return []
        default = fields[part].default_factory if fields[part].default_factory is not dataclasses.MISSING else None
        node = default() if callable(default) else None
        if node is None or not dataclasses.is_dataclass(node):
            return []
        node = type(node)
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def to_yaml(cfg: ScenarioConfig) -> str:
    """Return the fully resolved scenario as YAML (what ``config.yaml`` holds)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
