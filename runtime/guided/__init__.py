"""Guided decoding: requests constrained by a JSON schema, a regex or a grammar (xgrammar)."""

from .spec import GuidedSpec, parse_spec

__all__ = ["GuidedSpec", "parse_spec"]
