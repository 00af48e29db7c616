"""Growable numpy buffers with explicit size and capacity; to_array() hands out copies."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ("Int32Buffer", "Float64Buffer")

_MIN_CAPACITY = 256


class Int32Buffer:
    """Growable int32 storage. Grows by doubling; to_array() copies, so nothing is ever lent."""

    def __init__(self) -> None:
        self._array: npt.NDArray[np.int32] = np.empty(0, dtype=np.int32)
        self.size = 0

    @property
    def capacity(self) -> int:
        return int(self._array.shape[0])

    def reserve(self, extra: int) -> None:
        needed = self.size + extra
        if needed <= self.capacity:
            return
        # Doubling: a 500k-token stream reallocates ~12 times, not once per event.
        grown = np.empty(max(needed, 2 * self.capacity, _MIN_CAPACITY), dtype=np.int32)
        grown[: self.size] = self._array[: self.size]
        self._array = grown

    def extend(self, values: Sequence[int] | npt.NDArray[np.int32]) -> None:
        n = len(values)
        if n == 0:
            return
        self.reserve(n)
        self._array[self.size : self.size + n] = values
        self.size += n

    def clear(self) -> None:
        self.size = 0

    def to_array(self) -> npt.NDArray[np.int32]:
        return self._array[: self.size].copy()

    def equals_prefix(self, values: Sequence[int]) -> int:
        """Index of the first held id that differs from ``values`` (which is at least as long), or -1."""
        for i in range(self.size):
            if int(self._array[i]) != values[i]:
                return i
        return -1

    def __getitem__(self, index: int) -> int:
        return int(self._array[index])


class Float64Buffer:
    """Growable float64 storage, same policy as Int32Buffer."""

    def __init__(self) -> None:
        self._array: npt.NDArray[np.float64] = np.empty(0, dtype=np.float64)
        self.size = 0

    @property
    def capacity(self) -> int:
        return int(self._array.shape[0])

    def reserve(self, extra: int) -> None:
        needed = self.size + extra
        if needed <= self.capacity:
            return
        grown = np.empty(max(needed, 2 * self.capacity, _MIN_CAPACITY), dtype=np.float64)
        grown[: self.size] = self._array[: self.size]
        self._array = grown

    def extend(self, values: Sequence[float] | npt.NDArray[np.float64]) -> None:
        n = len(values)
        if n == 0:
            return
        self.reserve(n)
        self._array[self.size : self.size + n] = values
        self.size += n

    def clear(self) -> None:
        self.size = 0

    def to_array(self) -> npt.NDArray[np.float64]:
        return self._array[: self.size].copy()
