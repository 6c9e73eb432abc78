"""Job ids made in bulk are version 4 UUIDs like uuid.uuid4's, and behave as any UUID."""

import copy
import pickle
import uuid

from axa_django.enqueuing.ids import uuid4s


def test_ids_made_in_bulk_are_distinct_version_4_uuids_that_behave_as_any_uuid():
    ids = uuid4s(20_000)
    assert len(ids) == len(set(ids)) == 20_000
    assert all(type(i) is uuid.UUID and i.version == 4 and i.variant == uuid.RFC_4122 for i in ids)
    # The other 122 bits are random: each is set in about half the ids.
    fixed = (0xF << 76) | (0x3 << 62)
    for bit in (0, 1, 61, 64, 75, 80, 127):
        assert (1 << bit) & fixed == 0
        assert 9_000 < sum(1 for i in ids if i.int >> bit & 1) < 11_000, bit
    for made in ids[:50]:
        parsed = uuid.UUID(str(made))
        assert parsed == made and hash(parsed) == hash(made) and parsed.hex == made.hex
        assert made.is_safe is uuid.SafeUUID.unknown
        assert pickle.loads(pickle.dumps(made)) == made == copy.deepcopy(made)
    assert uuid4s(0) == []
