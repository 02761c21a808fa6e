"""`fastpath serve MODEL_OR_MANIFEST`: an OpenAI-compatible server for a model or a manifest.

- A MODEL (an HF checkpoint folder, `random:<preset>`) runs on fastpath.runtime.LLM.
- A MANIFEST (`*.yaml`) runs on the compiler's native engine (`native_llm`), its hooks read at run
  time; its `serve:` section gives the defaults and its name the served model's name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MANIFEST_SUFFIXES = (".yaml", ".yml")


def _parser(prog: str, defaults: dict[str, Any] | None) -> argparse.ArgumentParser:
    from fastpath.runtime.serve.cli import ServeArgumentParser, add_arguments

    parser = ServeArgumentParser(prog=prog, description="An OpenAI-compatible HTTP server for fastpath.")
    parser.add_argument(
        "target",
        metavar="MODEL_OR_MANIFEST",
        nargs="?",
        help="an HF folder, random:<preset>, or a manifest .yaml",
    )
    parser.add_argument("--model", dest="model_flag", help="the model, as vLLM's flag (or give it first)")
    add_arguments(parser, defaults)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, where --served-model-name (several names, vLLM's) may come before the model: it
    then took the model as one more name. A --config file's options are the parser's defaults, and
    its `model` gives way to one on the command line."""
    from fastpath.runtime.serve.config_file import apply_config_file

    apply_config_file(parser, argv)
    args = parser.parse_args(argv)
    names = args.served_model_name
    if (
        args.target is not None
        and args.model_flag is not None
        and args.model_flag == parser.get_default("model_flag")
    ):
        args.model_flag = None  # the file's model; the command line's wins
    if args.model_flag is not None:
        if args.target is not None:
            parser.error(f"the model is given twice: {args.target} and --model {args.model_flag}")
        args.target = args.model_flag
        return args
    # vLLM's `--served-model-name a b MODEL`: the option took the model as one more name. Only names
    # from the command line (a --config file's list is no place for the model).
    given = names is not parser.get_default("served_model_name")
    if args.target is None and given and isinstance(names, list) and len(names) > 1 and names[-1] in argv:
        args.target = names.pop()
    if args.target is None:
        parser.error("the following arguments are required: MODEL_OR_MANIFEST (or --model)")
    return args


def _is_manifest(target: str) -> bool:
    return target.endswith(MANIFEST_SUFFIXES)


def _manifest(path: str) -> tuple[Callable[..., Any], dict[str, Any], str]:
    """(engine factory, serve defaults, model name) of a manifest; ManifestError names a bad line."""
    from fastpath.compiler import native_llm
    from fastpath.compiler.resolve import resolve
    from fastpath.schema.loader import load_manifest

    lock = resolve(load_manifest(Path(path))).to_json()
    serve = dict(lock.get("serve") or {})
    return (lambda **kw: native_llm(path, **kw)), serve, serve.get("served_model_name") or lock["name"]


def serve_main(argv: Sequence[str] | None = None, prog: str = "fastpath serve") -> int:
    from fastpath.runtime.serve.cli import run

    argv = list(sys.argv[1:] if argv is None else argv)
    target = _parse(_parser(prog, None), argv).target
    if not _is_manifest(target):
        from fastpath.runtime import LLM

        args = _parse(_parser(prog, None), argv)
        return run(lambda **kw: LLM(target, **kw), args, model_name=target)
    from fastpath.schema.errors import ManifestError

    try:
        factory, defaults, model_name = _manifest(target)
    except ManifestError as exc:
        print(exc, file=sys.stderr)  # "file:line:col: error: ...", as the compiler prints it
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Parsed again so that the manifest's serve section is the default and a flag still wins.
    return run(factory, _parse(_parser(prog, defaults), argv), model_name=model_name)


def main(argv: Sequence[str] | None = None) -> int:
    """The `fastpath` console script; its one subcommand so far is `serve`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: fastpath serve MODEL_OR_MANIFEST [options]   (fastpath serve --help for options)")
        return 0 if argv else 2
    if argv[0] != "serve":
        print(f"fastpath: unknown command {argv[0]!r}; the commands are: serve", file=sys.stderr)
        return 2
    return serve_main(argv[1:])
