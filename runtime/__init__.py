"""fastpath.runtime: the native baseline engine."""
