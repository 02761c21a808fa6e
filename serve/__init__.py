"""fastpath.serve: the `fastpath serve` command (and `python -m fastpath.serve`).

It sits above every other layer: a MODEL runs on `fastpath.runtime.LLM`, a MANIFEST on
`fastpath.compiler.native_llm` (hooks read at run time). The server itself is
`fastpath.runtime.serve`, which a generated package uses directly.
"""
