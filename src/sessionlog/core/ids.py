"""Fact ids: lowercase UUIDv7 strings (an id's clock is never read back as time).

RFC 9562 layout, made as text without a `UUID` object and without a system call per id::

    unix_ts_ms (48) | ver 7 (4) | rand_a (12) | var 10 (2) | rand_b (62)

`rand_a` is a counter (the RFC's method 1, "fixed bit-length dedicated counter"): seeded from
random bits with its top bit clear when the millisecond changes, incremented for every further id
of the same millisecond. When it would overflow the id's millisecond runs ahead of the clock by
one, and a clock that steps back keeps the last id's millisecond, so ids from one process are
strictly increasing as text and as integers. `rand_b` comes from a block of `os.urandom` drawn
once per 400 ids. A forked child drops the block it inherited (`os.register_at_fork`), so parent
and child never hand out the same random bits; its counter continues from the parent's last id,
so its ids still sort after every id the parent made before the fork. uuid6 stays the reference
the tests read every id with (tests/test_ids.py); about a fifth of its time per id
(scripts/id_speed.py).
"""

from __future__ import annotations

import os
import threading
import time

_BLOCK_BYTES = 4000
# Each id's slot in a block: 64 random bits for rand_b (2 of them replaced by the variant), then
# 16 for a counter's seed (used only when the millisecond changes).
_SLOT_BYTES = 10
_SLOT_HEX = 2 * _SLOT_BYTES
# Every byte to its low six bits under the variant bits `10`: applied to each id's first byte.
_VARIANT = bytes(0x80 | byte & 0x3F for byte in range(256))
_RAND_A = tuple(f"{counter:03x}" for counter in range(0x1000))

_lock = threading.Lock()
_acquire, _release = _lock.acquire, _lock.release  # bound once: half the cost of `with _lock`
_random = ""  # hex digits of the current random block
_next = len(_random)  # where the next id's random digits start in it
_last_ms = -1  # the millisecond of the last id (may run ahead of the clock)
_counter = 0  # rand_a of the last id
_prefix = ""  # "tttttttt-tttt-7" for _last_ms


def _refill() -> None:
    """A fresh random block as hex digits, each id's first byte carrying the variant bits."""
    global _random, _next
    block = bytearray(os.urandom(_BLOCK_BYTES))
    block[::_SLOT_BYTES] = block[::_SLOT_BYTES].translate(_VARIANT)
    _random = block.hex()
    _next = 0


def _forget_random_block() -> None:
    """In a forked child: the parent's buffered random bits are the parent's alone."""
    global _random, _next, _lock, _acquire, _release
    _random = ""
    _next = 0
    _lock = threading.Lock()  # the parent's may have been held by a thread the child does not have
    _acquire, _release = _lock.acquire, _lock.release


os.register_at_fork(after_in_child=_forget_random_block)


def new_id() -> str:
    """A fresh UUIDv7, e.g. to reserve an id that a later fact of the same transaction names."""
    global _next, _last_ms, _counter, _prefix
    now = time.time_ns() // 1_000_000
    _acquire()
    try:
        start = _next
        if start >= len(_random):
            _refill()
            start = 0
        _next = start + _SLOT_HEX
        end = start + 16
        if now > _last_ms:
            _last_ms = now
            _prefix = _stamp(now)
            _counter = _seed(end)
        elif _counter < 0xFFF:
            _counter += 1
        else:  # 4,096 ids in one millisecond: borrow the next one
            _last_ms += 1
            _prefix = _stamp(_last_ms)
            _counter = _seed(end)
        random = _random
        return f"{_prefix}{_RAND_A[_counter]}-{random[start : start + 4]}-{random[start + 4 : end]}"
    finally:
        _release()


def _seed(at: int) -> int:
    """A counter's first value: 11 random bits from the slot's seed digits at `at` (the top bit
    clear leaves room for 2,048 more ids in the same millisecond)."""
    return int(_random[at : at + 3], 16) & 0x7FF


def _stamp(ms: int) -> str:
    """The id's text up to rand_a: "tttttttt-tttt-7"."""
    stamp = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
    return f"{stamp[:8]}-{stamp[8:]}-7"
