"""The agent: performs an order's step at the remote service, within the step's deadline.

- ``remote``: the HTTP call with its retry policy (data beside the call it governs).
- ``agent``: one request in, at most one response out; nothing past complete-by.
- ``blueprint``: the Functions binding.
"""
