"""Benchmarks of the app on the local stack (``make bench`` / ``python -m benchmarks``).

One run measures, and writes to ``BENCHMARKS.md``:

- ``ceiling``: the raw cost of every storage and messaging operation an order needs,
  measured with the app's own SDK client settings, turned into a ceiling in orders/s;
- ``pipeline``: orders/s end to end with 1 and 2 local host processes, against the ceiling;
- ``latency``: submission -> Processed at a light steady load;
- ``ops``: table, storage-queue and Service Bus operations per order, counted at the
  servers (Azurite's debug log, the Service Bus emulator's own operation counters);
- ``idle``: operations per minute with no orders;
- ``sweep``: the supervisor's sweep beside 0 / 10,000 / 100,000 finished orders,
  next to the naive full-table filter;
- ``recovery``: a host killed mid-call -> the order Processed on another host.

The chaos soak (``make soak`` / ``python -m benchmarks.soak``, :mod:`benchmarks.soak`)
runs on its own and writes the report's chaos soak section, which ``make bench`` keeps.

Speed is reported, never asserted; the smoke test checks the report's shape only.
See docs/benchmarks.md.
"""
