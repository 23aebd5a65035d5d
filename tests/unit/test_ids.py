"""adapters/ids.py: version-4 UUIDs, unique, untouched by whoever seeds ``random``, and a
forked child's own sequence."""

from __future__ import annotations

import os
import random
import uuid

from adapters.ids import random_uuid


def test_ids_are_version_4_uuids_and_do_not_repeat():
    drawn = [random_uuid() for _ in range(20_000)]
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in drawn)
    assert len(set(drawn)) == len(drawn)


def test_seeding_random_does_not_make_the_ids_repeat():
    random.seed(7)
    first = [random_uuid() for _ in range(5)]
    random.seed(7)
    assert [random_uuid() for _ in range(5)] != first


def test_a_forked_child_draws_other_ids_than_its_parent():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, "".join(random_uuid().hex for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = "".join(random_uuid().hex for _ in range(4))
    assert len(child) == len(parent) == 128 and child != parent
