"""Guided decoding: requests constrained by a JSON schema, a regex, a choice or a grammar (xgrammar or llguidance)."""

from .backends import install_line, off_message, resolve_backend
from .spec import GrammarError, GuidedSpec, parse_spec

__all__ = ["GrammarError", "GuidedSpec", "install_line", "off_message", "parse_spec", "resolve_backend"]
