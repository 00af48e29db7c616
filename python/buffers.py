"""Growable numpy buffers with explicit size and capacity; to_array() hands out copies,
take_array() the storage itself (for a final result)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ("Buffer",)

_MIN_CAPACITY = 256


class Buffer:
    """Growable storage of one numpy dtype (int32 ids, float64 logprobs). Grows by doubling;
    to_array() copies, so nothing is ever lent; take_array() gives the storage away (for a final
    result) and leaves the buffer empty."""

    def __init__(self, dtype: npt.DTypeLike) -> None:
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self._array: npt.NDArray[Any] = np.empty(0, dtype=self.dtype)
        self.size = 0

    @property
    def capacity(self) -> int:
        return int(self._array.shape[0])

    def reserve(self, extra: int) -> None:
        needed = self.size + extra
        if needed <= self.capacity:
            return
        # Doubling: a 500k-token stream reallocates ~12 times, not once per event.
        grown = np.empty(max(needed, 2 * self.capacity, _MIN_CAPACITY), dtype=self.dtype)
        grown[: self.size] = self._array[: self.size]
        self._array = grown

    def extend(self, values: Sequence[Any]) -> None:
        n = len(values)
        if n == 0:
            return
        self.reserve(n)
        self._array[self.size : self.size + n] = values
        self.size += n

    def equals_prefix(self, values: Sequence[Any]) -> int:
        """Index of the first held item that differs from ``values`` (at least as long), or -1."""
        for i in range(self.size):
            if self._array[i] != values[i]:
                return i
        return -1

    def __getitem__(self, index: int) -> Any:
        return self._array[index].item()

    def to_array(self) -> npt.NDArray[Any]:
        return self._array[: self.size].copy()

    def take_array(self) -> npt.NDArray[Any]:
        """An array that owns the buffer's storage, leaving the buffer empty."""
        # A slice would keep the spare capacity alive for as long as the result lives.
        array = self._array if self.size == self.capacity else self.to_array()
        self._array = np.empty(0, dtype=self.dtype)
        self.size = 0
        return array
