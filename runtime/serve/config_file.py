"""vLLM's `--config FILE`: a YAML mapping of the command line's options (keys are flag names without
the dashes, `max-num-seqs` or `max_num_seqs`), read as the parser's defaults, so a flag given on the
command line still wins over the file, and the file over a manifest's `serve:` section."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

import yaml

FLAG = "--config"


def config_path(argv: Sequence[str], flags: Sequence[str] = (FLAG,)) -> str | None:
    """The file `--config FILE` (or `--config=FILE`) names; the last one given. `flags`: every option
    the parser has, so that an abbreviation argparse takes for --config (`--conf`) counts too."""
    path = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if not _means_config(name, flags):
            continue
        if eq:
            path = value
        elif i + 1 < len(argv):
            path = argv[i + 1]
    return path


def _means_config(name: str, flags: Sequence[str]) -> bool:
    if name == FLAG:
        return True
    # argparse's abbreviations: a prefix of one long option only (its ambiguous ones it refuses itself).
    return len(name) > 2 and FLAG.startswith(name) and [f for f in flags if f.startswith(name)] == [FLAG]


def apply_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Make the options of the file `argv` names with --config the defaults of `parser`; a file that
    cannot be read, or holds an option the parser lacks or a value it refuses, is a usage error
    naming the file and the key."""
    path = config_path(argv, list(parser._option_string_actions) if parser.allow_abbrev else (FLAG,))
    if path is None:
        return
    where = f"{FLAG} {path}"
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        parser.error(f"{where}: {exc.strerror or exc}")
    except yaml.YAMLError as exc:
        parser.error(f"{where}: not YAML: {exc}")
    if data is None:
        return
    if not isinstance(data, dict):
        parser.error(f"{where}: must be a mapping of option names to values, got {type(data).__name__}")
    actions = parser._option_string_actions  # argparse keeps no public map of its flags
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        action = actions.get(flag)
        if action is None or flag == FLAG or action.dest == "help":
            parser.error(f"{where}: {key!r} is not an option here ({parser.prog} --help lists them)")
        try:
            setting = _value(action, value, negated=flag.startswith("--no-"))
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            parser.error(f"{where}: {key}: {exc}")
        if setting is not _UNSET:
            defaults[action.dest] = setting
    parser.set_defaults(**defaults)


_UNSET = object()
_JSON_TYPES: dict[Callable[[str], Any], type] = {}


def takes_json(kind: type) -> Callable[[Callable[[str], Any]], Callable[[str], Any]]:
    """Mark an option's type as one that parses JSON text of `kind` (list or dict), so the file may give
    the option that YAML (vLLM's `allowed-origins: [...]`, `lora-modules: [{name: ..., path: ...}]`)."""

    def mark(type_: Callable[[str], Any]) -> Callable[[str], Any]:
        _JSON_TYPES[type_] = kind
        return type_

    return mark


def _value(action: argparse.Action, value: Any, negated: bool) -> Any:
    """A YAML value as the command line would have given it to `action`; `negated`: the key is a
    switch's --no- spelling, so true turns it off."""
    if value is None:
        raise ValueError("needs a value (an empty or null one is not taken)")
    if isinstance(action, argparse.BooleanOptionalAction):
        return _bool(value) != negated
    if action.nargs == 0:  # a switch (store_true, store_const): true sets it, false leaves it be
        return action.const if _bool(value) else _UNSET
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        items = value if isinstance(value, list) else [value]
        if action.nargs == "+" and not items:
            raise ValueError("needs at least one value")
        return [_one(action, v) for v in items]
    return _one(action, value)


def _one(action: argparse.Action, value: Any) -> Any:
    if value is None:
        raise ValueError("needs a value (an empty or null one is not taken)")
    if isinstance(value, list | dict):  # as JSON, where the flag takes JSON of that kind on the command line
        got = "list" if isinstance(value, list) else "mapping"
        kind = _JSON_TYPES.get(action.type)
        if kind is None:
            raise ValueError(f"takes one value, got a {got}")
        if not isinstance(value, kind):
            raise ValueError(f"takes a {'list' if kind is list else 'mapping'}, got a {got}")
        text = json.dumps(value, default=str)  # a YAML date or time as its text
    else:
        text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        converted = action.type(text) if action.type is not None else text
    except (TypeError, ValueError) as exc:  # argparse's own words; an ArgumentTypeError keeps its own
        if isinstance(exc, argparse.ArgumentTypeError):
            raise
        raise ValueError(f"invalid {getattr(action.type, '__name__', 'value')} value: {text!r}") from None
    if action.choices is not None and converted not in action.choices:
        raise ValueError(f"{value!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value
