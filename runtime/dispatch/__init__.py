"""Host dispatch, the Python side: `HostDispatcher` over a host-dispatch extension (the native
`fastpath.runtime._hostdispatch`, or a generated package's, with its mode fixed at compile time)."""
