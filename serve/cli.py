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
    from fastpath.runtime.serve.cli import add_arguments

    parser = argparse.ArgumentParser(prog=prog, description="An OpenAI-compatible HTTP server for fastpath.")
    parser.add_argument(
        "target", metavar="MODEL_OR_MANIFEST", help="an HF folder, random:<preset>, or a manifest .yaml"
    )
    add_arguments(parser, defaults)
    return parser


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
    target = _parser(prog, None).parse_args(argv).target
    if not _is_manifest(target):
        from fastpath.runtime import LLM

        args = _parser(prog, None).parse_args(argv)
        return run(lambda **kw: LLM(target, **kw), args, model_name=target)
    from fastpath.schema.errors import ManifestError

    try:
        factory, defaults, model_name = _manifest(target)
    except (ManifestError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Parsed again so that the manifest's serve section is the default and a flag still wins.
    return run(factory, _parser(prog, defaults).parse_args(argv), model_name=model_name)


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
