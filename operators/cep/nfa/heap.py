"""A binary heap laid out exactly like ``java.util.PriorityQueue`` (JDK 17).

Why not :mod:`heapq`: Flink iterates its queues of partial matches in *array order* (the
iterator of a Java ``PriorityQueue`` walks the backing array), and that order decides in which
order computation states add edges to shared-buffer nodes, which path an extraction finds first,
and which of two equally early completed matches a skip strategy emits first. To reproduce
Flink's matches case by case the array must evolve exactly as Java's does: ``offer`` sifts up,
``poll`` moves the last element to the root and sifts down, ``remove_all`` compacts survivors in
array order and then heapifies (JDK 9+ ``bulkRemove``).

Elements are stored as ``(key, item)`` pairs so the ordering key is computed once per element.
Ties are never broken by the item: Java compares keys only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class BinaryHeap(Generic[T]):
    """Min-heap on ``key(item)`` whose array layout matches ``java.util.PriorityQueue``.

    Invariant: ``self._keys[i] <= self._keys[2i+1]`` and ``<= self._keys[2i+2]``.
    """

    __slots__ = ("_key", "_keys", "_items")

    def __init__(self, key: Callable[[T], Any], items: Iterable[T] = ()) -> None:
        self._key = key
        self._keys: list[Any] = []
        self._items: list[T] = []
        for item in items:
            self.offer(item)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[T]:
        """Array order, like Java's ``PriorityQueue.iterator()`` (not sorted order)."""
        return iter(list(self._items))

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def items(self) -> list[T]:
        """The elements in array order (a copy)."""
        return list(self._items)

    def view(self) -> list[T]:
        """The backing array itself, in array order: read it, never mutate it, and do not
        offer/poll while iterating it (the NFA builds a new heap instead)."""
        return self._items

    def peek(self) -> T | None:
        return self._items[0] if self._items else None

    def offer(self, item: T) -> None:
        keys, items = self._keys, self._items
        key = self._key(item)
        k = len(items)
        keys.append(key)
        items.append(item)
        while k > 0:
            parent = (k - 1) >> 1
            if key >= keys[parent]:
                break
            keys[k] = keys[parent]
            items[k] = items[parent]
            k = parent
        keys[k] = key
        items[k] = item

    def add_all(self, items: Iterable[T]) -> None:
        for item in items:
            self.offer(item)

    def poll(self) -> T | None:
        keys, items = self._keys, self._items
        if not items:
            return None
        result = items[0]
        last_key = keys.pop()
        last = items.pop()
        if items:
            self._sift_down(0, last_key, last, len(items))
        return result

    def remove_all(self, doomed: list[T]) -> bool:
        """Remove every element equal to one in ``doomed`` (JDK ``bulkRemove`` + ``heapify``)."""
        if not doomed or not self._items:
            return False
        keys, items = self._keys, self._items
        keep_keys: list[Any] = []
        keep_items: list[T] = []
        removed = False
        for k, item in zip(keys, items):
            if item in doomed:
                removed = True
            else:
                keep_keys.append(k)
                keep_items.append(item)
        if not removed:
            return False
        self._keys, self._items = keep_keys, keep_items
        self._heapify()
        return True

    def _heapify(self) -> None:
        keys, items = self._keys, self._items
        n = len(items)
        for i in range((n >> 1) - 1, -1, -1):
            self._sift_down(i, keys[i], items[i], n)

    def _sift_down(self, k: int, key: Any, item: T, n: int) -> None:
        keys, items = self._keys, self._items
        half = n >> 1
        while k < half:
            child = (k << 1) + 1
            child_key = keys[child]
            right = child + 1
            if right < n and child_key > keys[right]:
                child = right
                child_key = keys[right]
            if key <= child_key:
                break
            keys[k] = child_key
            items[k] = items[child]
            k = child
        keys[k] = key
        items[k] = item
