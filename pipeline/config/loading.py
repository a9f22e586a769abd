"""Loading a :class:`Config`: defaults <- YAML file <- ``--set a.b=c`` overrides, each value
checked against its field's type, then validated.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.config.schema import REMOVED_KEYS, Config
from pipeline.core.errors import ConfigError


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check ``value`` against a field annotation, converting only lossless cases (int->float)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key} has the wrong type")
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if isinstance(value, str):
            value = [value]  # --set eval.sts=dev.csv: one item
        if not isinstance(value, list):
            raise ConfigError(f"{key} must be a list (got {value!r})")
        return [_coerce(item, item_type, f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        key_type, value_type = typing.get_args(annotation)
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping (got {value!r})")
        return {
            _coerce(k, key_type, f"{key} key"): _coerce(v, value_type, f"{key}.{k}") for k, v in value.items()
        }
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if value is False and "off" in allowed:
            return "off"  # YAML 1.1 reads an unquoted off (train.compile: off) as false
        if value not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, allowed))} (got {value!r})")
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false (got {value!r})")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer (got {value!r})")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # YAML 1.1 reads 1e-4 (no dot) as a string; it is plainly meant as a number.
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number (got {value!r})")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} must be a string (got {value!r})")
    if dataclasses.is_dataclass(annotation):
        return _build(annotation, value, key)
    raise ConfigError(f"{key}: unsupported field type {annotation!r}")


def _build(cls: type, mapping: Any, prefix: str) -> Any:
    where = prefix or "config"
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where} must be a mapping (got {mapping!r})")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in mapping:
        if key not in names:
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if dotted in REMOVED_KEYS:
                raise ConfigError(f"{dotted} is no longer a config key: {REMOVED_KEYS[dotted]}")
            raise ConfigError(
                f"unknown config key {dotted!r} (known under {where}: {', '.join(sorted(names))})"
            )
    kwargs = {}
    for name in names:
        if name in mapping:
            dotted = f"{prefix}.{name}" if prefix else name
            kwargs[name] = _coerce(mapping[name], hints[name], dotted)
    return cls(**kwargs)


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=c`` -> (``a.b``, YAML-parsed ``c``), so ``3`` is an int and ``null`` is None."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value (got {text!r})")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set expects key=value (got {text!r})")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _override_path(key: str) -> list[str]:
    """``a.b.c`` as the path of keys it sets. Below a mapping field (``train.label_selector``)
    the rest is one key, dots and all: ``train.label_selector.ray.io/node-group`` sets the
    label ``ray.io/node-group``."""
    parts = key.split(".")
    cls: Any = Config
    for i, part in enumerate(parts[:-1]):
        if not dataclasses.is_dataclass(cls) or part not in {f.name for f in dataclasses.fields(cls)}:
            break
        hint = typing.get_type_hints(cls)[part]
        if typing.get_origin(hint) is dict:
            return [*parts[: i + 1], ".".join(parts[i + 1 :])]
        cls = hint
    return parts


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load defaults <- YAML file <- ``--set`` overrides, then type-check and validate.

    Raises:
        ConfigError: naming the first bad key.
    """
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        tree = loaded or {}
    for item in overrides:
        key, value = parse_override(item)
        nested: dict[str, Any] = {}
        cursor = nested
        parts = _override_path(key)
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = value
        _merge(tree, nested)
    return _build(Config, tree, "").validate()


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
