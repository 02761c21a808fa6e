"""vLLM's `--config FILE`: a YAML mapping of the command line's options (keys are flag names without
the dashes, `max-num-seqs` or `max_num_seqs`), read as the parser's defaults, so a flag given on the
command line still wins over the file, and the file over a manifest's `serve:` section."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import yaml

FLAG = "--config"


def config_path(argv: Sequence[str]) -> str | None:
    """The file `--config FILE` (or `--config=FILE`) names; the last one given."""
    path = None
    for i, arg in enumerate(argv):
        if arg == FLAG and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith(FLAG + "="):
            path = arg.removeprefix(FLAG + "=")
    return path


def apply_config_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Make the options of the file `argv` names with --config the defaults of `parser`; a file that
    cannot be read, or holds an option the parser lacks or a value it refuses, is a usage error
    naming the file and the key."""
    path = config_path(argv)
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
            setting = _value(action, value)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            parser.error(f"{where}: {key}: {exc}")
        if setting is not _UNSET:
            defaults[action.dest] = setting
    parser.set_defaults(**defaults)


_UNSET = object()


def _value(action: argparse.Action, value: Any) -> Any:
    """A YAML value as the command line would have given it to `action`."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return _bool(value)
    if action.nargs == 0:  # a switch (store_true, store_const): true sets it, false leaves it be
        return action.const if _bool(value) else _UNSET
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        items = value if isinstance(value, list) else [value]
        if action.nargs == "+" and not items:
            raise ValueError("needs at least one value")
        return [_one(action, v) for v in items]
    if isinstance(value, list | dict):
        raise ValueError(f"takes one value, got {type(value).__name__}")
    return _one(action, value)


def _one(action: argparse.Action, value: Any) -> Any:
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
