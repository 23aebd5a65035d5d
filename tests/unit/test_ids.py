"""adapters/ids.py (and the local host's ids, tools/funchost/invoke.py): version-4 UUIDs,
unique, untouched by whoever seeds ``random``, and a forked child's own sequence."""

from __future__ import annotations

import os
import random
import uuid

import pytest

from adapters.ids import random_uuid
from tools.funchost import invoke


def test_ids_are_version_4_uuids_and_do_not_repeat():
    drawn = [random_uuid() for _ in range(20_000)]
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in drawn)
    assert len(set(drawn)) == len(drawn)


def test_seeding_random_does_not_make_the_ids_repeat():
    state = random.getstate()
    try:
        random.seed(7)
        first = [random_uuid() for _ in range(5)]
        random.seed(7)
        assert [random_uuid() for _ in range(5)] != first
    finally:
        random.setstate(state)  # the other tests' random as it was


def _draws() -> str:
    """The next ids of the app's generator and of the local host's (tools/funchost/invoke.py)."""
    return "".join(random_uuid().hex for _ in range(4)) + f"{invoke._ids.getrandbits(128):032x}"


# The child only draws ids and writes them to a pipe: no lock another thread holds is touched.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_forked_child_draws_other_ids_than_its_parent():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent, and never back into pytest
        try:
            os.close(read)
            os.write(write, _draws().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = _draws()
    assert len(child) == len(parent) == 160
    assert child[:128] != parent[:128] and child[128:] != parent[128:]  # each generator reseeded in the child
