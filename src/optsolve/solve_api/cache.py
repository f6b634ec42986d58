"""The one bounded cache every module uses for what it computes once per problem structure
(traced checks, compiled functions, carry templates)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from typing import Any


class BoundedCache:
    """A least-recently-used mapping of at most ``size`` entries.

    Keys that cannot be hashed (a problem holding an unhashable static value) are never
    stored: ``get_or_make`` then computes the value every time.
    """

    def __init__(self, size: int):
        self.size = size
        self._entries: collections.OrderedDict = collections.OrderedDict()

    def get_or_make(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value cached for ``key``, made with ``make()`` on a miss."""
        try:
            value = self._entries[key]
        except KeyError:
            value = make()
            self._entries[key] = value
            if len(self._entries) > self.size:
                self._entries.popitem(last=False)
            return value
        except TypeError:  # unhashable key
            return make()
        self._entries.move_to_end(key)
        return value

    def check_once(self, key: Hashable, check: Callable[[], None]) -> None:
        """Run ``check()``, which raises where what it checks is wrong, unless it passed
        before for ``key`` (a check that raised stored nothing: it runs again)."""

        def passed() -> bool:
            check()
            return True

        self.get_or_make(key, passed)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value cached for ``key`` (now the most recently used), or ``default``."""
        try:
            self._entries.move_to_end(key)
        except (KeyError, TypeError):
            return default
        return self._entries[key]

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """The value cached for ``key`` without counting it as used, or ``default``."""
        try:
            return self._entries.get(key, default)
        except TypeError:
            return default

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value`` for ``key`` (unhashable keys are not stored)."""
        try:
            self._entries[key] = value
            self._entries.move_to_end(key)
        except TypeError:
            return
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` if it is cached (one dict operation: safe from a weakref callback)."""
        try:
            self._entries.pop(key, None)
        except TypeError:
            pass

    def values(self) -> list:
        """The cached values, least recently used first."""
        return list(self._entries.values())

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        try:
            return key in self._entries
        except TypeError:
            return False
