"""Job ids: version 7 UUIDs (RFC 9562), which begin with the time they were made.

A random (version 4) id puts each new row's primary-key entry on a random page of the
index: once the table outgrows memory every insert reads and dirties a page of its
own, and the first write to a page after a checkpoint logs the whole page. Ids that
grow with time land together at the index's right edge. With 2,000,000 finished rows,
a drain's server time per job 26.2-38.8 -> 19.8-24.0 us, and its WAL after a checkpoint
3,731-3,760 -> 1,225 bytes a job (``benchmarks/results/pg15-uuid7-ab.txt``).
"""

from __future__ import annotations

import os
import time
import uuid

# RFC 9562's version 7: 48 bits of Unix time in milliseconds, the version (bits 76-79)
# 7, 12 bits, the variant (bits 62-63) 0b10, 62 bits. The 74 bits besides the time
# count up from a random start, so the ids of one batch ascend (its "method 2").
_HEAD = (0x7 << 76) | (0x2 << 62)
_LOW = (1 << 62) - 1
_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown  # an enum member's lookup goes through a descriptor


def uuid7s(count: int, after: uuid.UUID | None = None) -> list[uuid.UUID]:
    """``count`` version 7 UUIDs of this millisecond, ascending, from one read of the system's randomness.

    ``after``: the last id of the batch so far (a batch made in parts), which these go on
    from, so that the whole batch ascends. A UUID is immutable only through its own
    ``__setattr__``: its two slots are set as the standard library sets them, without
    ``UUID.__init__``'s checks (a fifth of the cost).
    """
    if after is not None:
        start = (after.int >> 64 & 0xFFF) << 62 | after.int & _LOW
        if start + count < 1 << 74:
            return _made(after.int >> 80 << 80 | _HEAD, start + 1, count)
    # 73 random bits: the count added to them never carries into the time.
    return _made((time.time_ns() // 1_000_000) << 80 | _HEAD, int.from_bytes(os.urandom(10)) >> 7, count)


def _made(head: int, start: int, count: int) -> list[uuid.UUID]:
    ids = []
    for value in range(start, start + count):
        job_id = _new(uuid.UUID)
        _set(job_id, "int", head | (value >> 62) << 64 | value & _LOW)
        _set(job_id, "is_safe", _UNKNOWN)
        ids.append(job_id)
    return ids


def uuid7() -> uuid.UUID:
    """A version 7 UUID: the default id of a Job and a Workflow."""
    return uuid7s(1)[0]
