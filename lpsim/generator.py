"""``lpsim.Generator``: a seed plus a Philox block counter that every stochastic call advances.

Why: a fixed integer ``seed`` replays the same random bits on every call (exact replay, for
tests), so ``w = quantize(w + d, fmt, "stochastic", seed=0)`` in a loop rounds every step
with the same uniforms and drifts.  A generator instead hands each call a fresh range of
Philox counters, as ``torch.Generator`` hands out fresh state: call ``t`` of a loop draws
the counters after those of calls ``0 .. t-1``, so no two calls share a random word.

How a call maps to counters (:mod:`lpsim.philox`): the generator holds ``(seed, block)``;
a stochastic call on ``n`` elements of a container with ``L`` lanes a block (4 for float32
and narrower, 2 for float64) rounds with ``seed``, its own ``stream`` and element offset
``block * L + offset``, then moves ``block`` past the last block it used.  Deterministic
rounding modes draw nothing and leave the generator as it was.  A call that is refused
(a bad ``out``, ``stats`` or format found after the counters were reserved) gives its
counters back when no other call took counters since, so a saved state still replays the
next call; threads may share a generator (reservations are taken under a lock).  Processes
do not: a forked child (a DataLoader worker) holds a copy at the parent's state and draws
the parent's next words.  Give each worker its own stream (``stream=worker_id`` in its
calls) or its own seed.
"""

from __future__ import annotations

import secrets
import threading

import numpy as np

from .philox import split_key
from .rounding import STOCHASTIC, mode_code

#: the block counter is a 64-bit Philox counter word pair; offsets are int64 in the kernels
_MAX_BLOCK = 2 ** 62
#: element counters a call may reach (lpsim.quantize.MAX_COUNTER)
_MAX_ELEMENT = 2 ** 62


class Generator:
    """Random-bit state for stochastic rounding: ``Generator(seed)``; seed=None draws one.

    Pass it as ``quantize(..., generator=g)``.  ``get_state()`` / ``set_state(state)`` save
    and restore it (a restored generator replays the same bits), ``manual_seed(seed)``
    restarts it, ``initial_seed()`` returns its seed.
    """

    def __init__(self, seed: int | None = None):
        self._lock = threading.Lock()
        self._calls = threading.local()         # this thread's open call (:meth:`begin`)
        self.manual_seed(secrets.randbits(64) if seed is None else seed)

    def __getstate__(self):
        return {"seed": self._seed, "block": self._block}

    def __setstate__(self, state):
        self.__init__(state["seed"])
        self._block = state["block"]

    def manual_seed(self, seed: int) -> "Generator":
        """Restart at counter 0 with ``seed`` (an integer in [0, 2**64)); returns self."""
        split_key(seed, "seed")                  # the same check quantize applies
        self._seed = int(seed)
        self._block = 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self) -> tuple[int, int]:
        """The state ``(seed, block)``: seed and the next unused Philox block."""
        return (self._seed, self._block)

    def set_state(self, state) -> "Generator":
        """Restore a state from :meth:`get_state`; returns self."""
        if not isinstance(state, tuple) or len(state) != 2:
            raise TypeError(f"state={state!r} is not a (seed, block) tuple from get_state()")
        seed, block = state
        split_key(seed, "seed")
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) \
                or not 0 <= block < _MAX_BLOCK:
            raise ValueError(f"state block={block!r} must be an integer in [0, 2**62)")
        self._seed, self._block = int(seed), int(block)
        return self

    def take(self, n: int, lanes: int, offset: int = 0) -> tuple[int, int]:
        """Reserve the blocks of ``offset + n`` elements at ``lanes`` a block; returns
        (seed, element offset) for the call and advances past them."""
        if lanes not in (2, 4):
            raise ValueError(f"lanes={lanes!r}; accepted: 2 (float64) or 4 (float32)")
        blocks = (offset + n + lanes - 1) // lanes
        with self._lock:
            before = self._block
            start = before * lanes + offset
            if before + blocks >= _MAX_BLOCK or start + n > _MAX_ELEMENT:
                raise OverflowError(f"{self!r} cannot take {n} more elements: the element "
                                    "counters end at 2**62; manual_seed() or set_state() it")
            self._block = before + blocks
        call = getattr(self._calls, "open", None)
        if call is not None:                    # remember it, to give back on failure
            if call[0] is None:
                call[0] = before
            call[2] &= call[1] is None or call[1] == before     # one unbroken range
            call[1] = before + blocks
        return self._seed, start

    def begin(self) -> bool:
        """Open a quantize call on this thread; True for the outermost one (a call inside a
        call, lpsim.fixed's say, is part of it).  The outermost caller then calls
        :meth:`end`, with ``failed=True`` if the call raised: its blocks are given back,
        provided they were one range and no other call took blocks after them (else they
        stay taken: a gap in the counters, never a reuse)."""
        if getattr(self._calls, "open", None) is not None:
            return False
        self._calls.open = [None, None, True]        # first block, end, one range
        return True

    def run(self, fn, *args):
        """fn(*args) as one call on this generator (:meth:`begin`, :meth:`end`): the blocks
        it takes are given back if it raises."""
        if not self.begin():
            return fn(*args)
        failed = True
        try:
            result = fn(*args)
            failed = False
            return result
        finally:
            self.end(failed)

    def end(self, failed: bool) -> None:
        """Close the call :meth:`begin` opened (see there)."""
        call, self._calls.open = self._calls.open, None
        if failed and call[0] is not None and call[2]:
            with self._lock:
                if self._block == call[1]:
                    self._block = call[0]

    def __repr__(self) -> str:
        return f"lpsim.Generator(seed={self._seed}, block={self._block})"


def _size_and_lanes(x) -> tuple[int, int]:
    """Element count of ``x`` and the Philox lanes of the container it is rounded in."""
    if isinstance(x, (int, float)):
        return 1, 2                              # rounded as float64
    numel = getattr(x, "numel", None)
    if callable(numel):                          # torch: float tensors of 2 or 4 bytes
        return int(numel()), 4 if x.element_size() <= 4 else 2
    if not hasattr(x, "dtype"):
        try:
            x = np.asarray(x)                    # lists: float64 or integers
        except (ValueError, TypeError) as error:    # lpsim.quantize.as_container_array's words
            raise TypeError(f"x of type {type(x).__name__} is not an array of numbers: "
                            f"{error}") from None
    n = int(np.size(x))
    try:
        dtype = np.dtype(x.dtype)
    except TypeError:                            # another library's dtype: by its size
        return n, 4 if getattr(x, "itemsize", 8) <= 4 else 2
    # float16, bfloat16 and float32 round in float32 containers; integers of any width and
    # float64 in float64 (lpsim.quantize.as_container_array)
    return n, 4 if dtype.kind in "fV" and dtype.itemsize <= 4 else 2


def resolve(generator, x, rounding, seed, stream, offset):
    """The (seed, stream, offset) a quantize call rounds ``x`` with; advances ``generator``.

    Without a generator, the arguments as given.  With one, ``seed`` must be None (the
    generator is the seed); deterministic modes leave it untouched.
    """
    if generator is None:
        return seed, stream, offset
    if not isinstance(generator, Generator):
        raise TypeError(f"generator={generator!r} is not an lpsim.Generator "
                        "(a torch.Generator does not key lpsim's Philox bits)")
    if seed is not None:
        raise ValueError(f"seed={seed!r} and generator= were both given; pass one: an integer "
                         "seed replays the same bits every call, a generator advances")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset={offset!r} must be an integer; accepted: 0 <= offset and "
                        f"offset + size <= 2**62")      # lpsim.quantize.check_offset's words
    if offset < 0:
        raise ValueError(f"offset={offset} is out of range; accepted: 0 <= offset and "
                         f"offset + size <= 2**62 (the element counters)")
    if mode_code(rounding) < STOCHASTIC:
        return generator.initial_seed(), stream, offset
    n, lanes = _size_and_lanes(x)
    if offset + n > _MAX_ELEMENT:                   # the offset's fault, not the generator's
        raise ValueError(f"offset={offset} is out of range for {n} elements; accepted: 0 <= "
                         f"offset and offset + size <= 2**62 (the element counters)")
    seed, start = generator.take(n, lanes, int(offset))
    return seed, stream, start


__all__ = ["Generator", "resolve"]
