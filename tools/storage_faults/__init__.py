"""A fault-injecting proxy for Azure Storage's table and queue endpoints (in front of Azurite).

It reproduces Azure Storage's push-back on loopback: 503 ServerBusy before a request is
applied, 500 OperationTimedOut after it was applied, a connection dropped after it was
applied, and latency spikes, at rates given per request. In a test or script::

    from tools import storage_faults
    proxy = storage_faults.start_in_thread(
        storage_faults.upstreams_of(azurite_connection_string),
        storage_faults.StorageFaults.parse("503=0.02,500-applied=0.01,reset-applied=0.01,latency=0.05:0.5"),
    )
    connection_string = storage_faults.proxied(azurite_connection_string, proxy.endpoints)
    ... TableClient.from_connection_string(connection_string, ...) ...
    proxy.counts()   # {"requests": {"table": n, ...}, "faults": {"503": n, ...}, ...}
    proxy.stop()

As a command: ``python -m tools.storage_faults --connection-string "..." --faults 503=0.02``.
It imports nothing from the project around it. See README.md.
"""

from .faults import APPLIED_500, BUSY, KINDS, LATENCY, RESET_APPLIED, StorageFaults, error_response
from .proxy import CONTROL_PATH, FaultProxy, RunningProxy, proxied, start_in_thread, upstreams_of

__all__ = [
    "APPLIED_500", "BUSY", "CONTROL_PATH", "KINDS", "LATENCY", "RESET_APPLIED", "FaultProxy", "RunningProxy",
    "StorageFaults", "error_response", "proxied", "start_in_thread", "upstreams_of",
]
