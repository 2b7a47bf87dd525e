"""The server's budget of request bytes buffered across connections (``--max-buffered-bytes``): a
frame over the small-frame size is read only once its declared size is reserved here, first come
first served, so many clients sending huge requests at once cannot exhaust memory."""

from collections import deque
from typing import Protocol


class Waiter(Protocol):
    def memory_turn(self) -> bool:
        """At the head of the queue after a release: True once it stops waiting."""
        ...


class MemoryBudget:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.buffered = 0  # request bytes reserved across connections now
        self.waiters: deque[Waiter] = deque()

    def reserve(self, nbytes: int, held: int, turn: bool = False) -> bool:
        """Takes ``nbytes`` for a connection already holding ``held`` if it fits, or if nobody else
        holds any (a frame as large as the budget still gets through). Connections already waiting go
        first, in order (``turn`` is the head of that queue trying again)."""
        others = self.buffered - held
        if others > 0 and (self.buffered + nbytes > self.budget or (self.waiters and not turn)):
            return False
        self.buffered += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.buffered -= nbytes
        waiters = self.waiters
        while waiters and waiters[0].memory_turn():
            waiters.popleft()
