"""The reducer's undo journal: while a store validates a commit, every mutation records how to undo
itself, so that a rejected transaction leaves the state exactly as it was. A bulk load keeps no
journal (`undo` is None): a failing transaction ends the load anyway."""

from __future__ import annotations

import functools
from collections.abc import Callable


class Journal:
    """Mixed into the reducer: `begin` (in the reducer, which knows what to save) opens it;
    `release` forgets it, `rollback` undoes back to a mark."""

    undo: list[Callable[[], object]] | None = None

    def release(self) -> None:
        """Every journalled transaction is durable: forget how to undo them."""
        self.undo = None

    def rollback(self, mark: int = 0) -> None:
        """Undo every transaction from `mark` on, newest first."""
        undo = self.undo
        if undo is None or mark > len(undo):
            raise RuntimeError("rollback without a matching begin")
        while len(undo) > mark:
            undo.pop()()
        if not undo:
            self.undo = None

    def remember(self, target: object, *names: str) -> None:
        """Journal the current values of `names` on `target` (call only while journalling)."""
        assert self.undo is not None
        for name in names:
            self.undo.append(functools.partial(setattr, target, name, getattr(target, name)))
