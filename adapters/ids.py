"""Random ids drawn without a system call.

``uuid.uuid4()`` reads 16 bytes from the kernel (``os.urandom``, a ``getrandom`` call) and
CPython lets go of the GIL around the call: under load another thread takes it, and this one
waits to get it back (BENCHMARKS.md, "Where the CPU goes, and what was cut"). The app's ids
that must be unique but need not be secret (a table transaction's multipart boundaries, a
write's id) are drawn here instead: a Mersenne Twister of this module's own, seeded from the
kernel when the module is imported and again in a forked child, so no two processes share a
sequence, and out of reach of anyone who seeds ``random`` (a test, a library). Where
``uuid4`` would still differ and these would not: a process copied below Python (a C
library's own ``fork()`` that skips CPython's after-fork hooks, a VM snapshot resumed twice).
"""

from __future__ import annotations

import os
import random
import uuid

_generator = random.Random()  # seeded from os.urandom
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_generator.seed)


def random_uuid() -> uuid.UUID:
    """A version-4 UUID (122 random bits), as ``uuid.uuid4()`` makes one, without its system call."""
    return uuid.UUID(int=_generator.getrandbits(128), version=4)
