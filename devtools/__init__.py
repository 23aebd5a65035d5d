"""Development tools for the local stack: never deployed, never imported by the app.

- ``devtools.azurite``: start Azurite (npm, pinned in package.json) on free loopback ports.
- the Service Bus emulator is a generic tool, ``tools.servicebus_emulator`` (it imports nothing
  from the app; ``devtools.localstack`` hands it the app's queues).
- the local Functions host is a generic tool too, ``tools.funchost``: ``devtools.localstack``
  runs it on this repository's ``function_app.py``.
- ``devtools.fake_remote``: the remote service the agents call, with fault injection.
- ``devtools.orders``: orders for the demo, the soak, the benchmarks and the tests, and the
  bad-input corpus (``devtools/corpus/``).
- ``devtools.paths``: ``ROOT``, the repository root.
"""
