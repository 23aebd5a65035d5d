"""The pure domain: names, message and state models, lifecycle decisions, the order schema.

Nothing in this package does I/O or imports ``azure.*`` (a test in tests/infra checks
it); the adapters that do I/O live in ``adapters``.
"""
