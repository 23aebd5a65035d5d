"""Development tools for the local stack: never deployed, never imported by the app.

- ``devtools.azurite``: start Azurite (npm, pinned in package.json) on free loopback ports.
- ``devtools.servicebus_emulator``: an AMQP 1.0 Service Bus emulator for the real SDK.
- ``devtools.funchost``: a local Functions host that runs ``function_app.py``.
- ``devtools.fake_remote``: the remote service the agents call, with fault injection.
"""
