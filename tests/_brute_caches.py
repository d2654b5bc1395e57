"""Brute-force caches for the row-cache tests: plain Python, one access at a time, no libCacheSim.

Each returns the hit/miss outcome of every access (True = hit) of ``trace`` through a cache of
``size`` rows; the eviction rules are written out as the textbooks (and libCacheSim's sources)
state them.
"""

from __future__ import annotations

import math


def lru(trace: list[int], size: int) -> list[bool]:
    """Evict the row used least recently."""
    last: dict[int, int] = {}
    out = []
    for t, r in enumerate(trace):
        out.append(r in last)
        if r not in last and len(last) == size:
            del last[min(last, key=last.__getitem__)]
        last[r] = t
    return out


def lfu(trace: list[int], size: int) -> list[bool]:
    """Evict the row with the fewest hits since it entered the cache (a row enters with count 1,
    its count is forgotten on eviction); among equal counts, the one that reached its count first."""
    state: dict[int, tuple[int, int]] = {}  # row -> (count, when it reached that count)
    out = []
    for t, r in enumerate(trace):
        if r in state:
            out.append(True)
            state[r] = (state[r][0] + 1, t)
            continue
        out.append(False)
        if len(state) == size:
            del state[min(state, key=state.__getitem__)]
        state[r] = (1, t)
    return out


def sieve(trace: list[int], size: int) -> list[bool]:
    """SIEVE: a FIFO queue with a visited bit per row, set by a hit; the hand walks from the oldest
    row towards the newest (then wraps), clearing visited bits, and evicts the first unvisited
    row, staying where it was for the next eviction; a new row enters at the newest end."""
    queue: list[int] = []  # oldest first
    visited: dict[int, bool] = {}
    hand = 0
    out = []
    for r in trace:
        if r in visited:
            visited[r] = True
            out.append(True)
            continue
        out.append(False)
        if len(queue) == size:
            while True:
                hand %= len(queue)
                if not visited[queue[hand]]:
                    break
                visited[queue[hand]] = False
                hand += 1
            del visited[queue.pop(hand)]  # the hand now points at the next newer row
            hand = hand if hand < len(queue) else 0
        queue.append(r)
        visited[r] = False
    return out


def belady(trace: list[int], size: int) -> list[bool]:
    """MIN with demand paging: every miss is cached; evict the cached row next used farthest ahead
    (never again = infinitely far)."""

    def next_use(r: int, t: int) -> float:
        for j in range(t + 1, len(trace)):
            if trace[j] == r:
                return j
        return math.inf

    cached: set[int] = set()
    out = []
    for t, r in enumerate(trace):
        out.append(r in cached)
        if r not in cached:
            if len(cached) == size:
                cached.remove(max(cached, key=lambda c: next_use(c, t)))
            cached.add(r)
    return out


def next_uses(trace: list[int]) -> list[int | None]:
    """The position of each access's next access to the same row, None when there is none."""
    return [next((j for j in range(t + 1, len(trace)) if trace[j] == r), None) for t, r in enumerate(trace)]
