"""Reading the project's YAML inputs (gates/*.yaml, gates/build.yaml, vendor/pin.yaml): typed
field readers whose every failure is one BadInput line (exit 2) naming the file and the key.

    raw = load_yaml(path)                        # parsed YAML; FileNotFoundError is the caller's
    top = mapping(raw, where)                    # the document must be a mapping
    name = need(top, "name", str, where)         # required, of this type
    timeout = optional(top, "timeout", (int, float), where, 1800)
    models = str_list(top, "models", where)      # a list of strings ([] when absent)
    op = need(params, "op", str, where, section="params")   # errors say 'params.op'

`where` is the file (or the file and a position in it); `section` is the dotted path of the
mapping a key sits in, so that a message names the key the way the file spells it. A key
whose value is null reads as absent. Booleans are never numbers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Collection, Mapping

import yaml

from .errors import BadInput
from .textfile import read_text

Kind = type | tuple[type, ...]

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list",
               dict: "a mapping"}


def _label(key: str, section: str) -> str:
    return f"{section}.{key}" if section else key


def _describe(kind: Kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if set(kinds) == {int, float}:
        return "a number"
    return " or ".join(_TYPE_NAMES.get(k, f"a {k.__name__}") for k in kinds)


def _got(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is(value: Any, kind: Kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:  # YAML's true is not the number 1
        return False
    return isinstance(value, kinds)


def load_yaml(path: Path) -> Any:
    """The file's parsed YAML; a missing file raises FileNotFoundError (the caller words it)."""
    try:
        return yaml.safe_load(read_text(path))
    except yaml.YAMLError as exc:
        raise BadInput(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise BadInput(f"{path}: not valid YAML (nested too deeply)") from None


def mapping(value: Any, where: str, label: str = "") -> dict:
    """value itself must be a mapping: the document (label "") or a section of it."""
    if not isinstance(value, dict):
        raise BadInput(f"{where}: {f'{label!r} ' if label else ''}must be a mapping (got {_got(value)})")
    return value


def only(values: Mapping, allowed: Collection[str], where: str, *, section: str = "") -> None:
    """No keys but the allowed ones (a misspelt key is an error, not a silent default)."""
    extra = sorted(str(k) for k in set(values) - set(allowed))
    if extra:
        raise BadInput(f"{where}: unknown key(s) {', '.join(_label(k, section) for k in extra)} "
                       f"(allowed: {', '.join(sorted(allowed))})")


def need(values: Mapping, key: str, kind: Kind, where: str, *, section: str = "") -> Any:
    """values[key], which must be present and of this type."""
    if values.get(key) is None:
        raise BadInput(f"{where}: missing '{_label(key, section)}'")
    return optional(values, key, kind, where, section=section)


def optional(values: Mapping, key: str, kind: Kind, where: str, default: Any = None, *, section: str = "") -> Any:
    """values[key] when present (and of this type), else default."""
    value = values.get(key)
    if value is None:
        return default
    if not _is(value, kind):
        raise BadInput(f"{where}: '{_label(key, section)}' must be {_describe(kind)} (got {_got(value)})")
    return value


def choice(values: Mapping, key: str, choices: Collection[str], where: str, default: str | None = None, *,
           section: str = "") -> str:
    """values[key], one of choices (default when absent; required when there is no default)."""
    value = values.get(key)
    if value is None and default is not None:
        return default
    if value not in choices:
        raise BadInput(f"{where}: '{_label(key, section)}' must be one of {', '.join(choices)} (got {value!r})")
    return value


def str_list(values: Mapping, key: str, where: str, *, section: str = "", required: bool = False,
             numbers_as_text: bool = False) -> list[str]:
    """A list of strings ([] when absent; required: present and non-empty). numbers_as_text
    takes numbers too, as their text (command-line arguments: `-t 2`)."""
    value = values.get(key)
    scalar = (str, int, float) if numbers_as_text else str
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(_is(v, scalar) for v in value) or (required and not value):
        raise BadInput(f"{where}: '{_label(key, section)}' must be a {'non-empty ' if required else ''}list of "
                       f"strings")
    return [str(v) for v in value]


def str_map(values: Mapping, key: str, where: str, *, section: str = "", key_pattern: re.Pattern | None = None
            ) -> dict[str, str]:
    """A mapping of names to strings or numbers, the numbers as their text ({} when absent)."""
    label = _label(key, section)
    value = values.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and _is(v, (str, int, float))
                                              for k, v in value.items()):
        raise BadInput(f"{where}: '{label}' must map names to strings or numbers")
    for name in value:
        if key_pattern is not None and not key_pattern.match(name):
            raise BadInput(f"{where}: '{label}': {name!r} is not a valid name")
    return {k: str(v) for k, v in value.items()}


def hex_digest(value: Any, length: int, where: str, label: str) -> str:
    """A lowercase hex digest of this many digits (40: a git object id, 64: a sha256)."""
    if not isinstance(value, str) or not re.fullmatch(f"[0-9a-f]{{{length}}}", value):
        raise BadInput(f"{where}: '{label}' is not a lowercase hex digest: {value!r}")
    return value
