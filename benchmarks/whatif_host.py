"""Experiments only: the local host with named patches applied, to measure what a change
would buy before anyone makes it. Figures checked against targets never use it.

``BENCH_HOST_PATCHES=sb-batch-wait-off python -m benchmarks.whatif_host --app-dir .``

- ``sb-batch-wait-off``: the Service Bus SDK's receive keeps pulling for 200 ms after the
  first message to fill the batch; the local host asks for up to ``maxConcurrentCalls``
  messages per receive, so at light load every Service Bus hop waits those 200 ms.
  This sets the wait to 0 (a receive returns what has arrived).
"""

from __future__ import annotations

import logging
import os
import sys

PATCHES_SETTING = "BENCH_HOST_PATCHES"


def _sb_batch_wait_off() -> None:
    from azure.servicebus._common import receiver_mixins

    original = receiver_mixins.ReceiverMixin._populate_attributes

    def populate(self, **kwargs):
        original(self, **kwargs)
        self._further_pull_receive_timeout = 0.0

    receiver_mixins.ReceiverMixin._populate_attributes = populate


PATCHES = {"sb-batch-wait-off": _sb_batch_wait_off}


def main() -> None:
    for name in filter(None, os.environ.get(PATCHES_SETTING, "").split(",")):
        PATCHES[name]()
    from devtools.funchost.cli import main as host_main

    code = host_main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
