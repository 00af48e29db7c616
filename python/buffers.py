"""Growable typed storage with an explicit size; to_array() hands out copies, take_array() the
storage itself (for a final result)."""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ("Buffer",)

# The standard library's typed arrays grow in C (amortized, as lists do) and convert a list of
# Python numbers in one call: an event's few ids cost no numpy call each.
_TYPECODES = {np.dtype(np.int32): "i", np.dtype(np.float64): "d"}
assert array.array("i").itemsize == 4 and array.array("d").itemsize == 8


class Buffer:
    """Growable storage of one numpy dtype (int32 ids, float64 logprobs). to_array() copies, so
    nothing is ever lent; take_array() gives the storage away (for a final result) and leaves the
    buffer empty."""

    def __init__(self, dtype: npt.DTypeLike) -> None:
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self._typecode = _TYPECODES[self.dtype]
        self._items = array.array(self._typecode)

    @property
    def size(self) -> int:
        return len(self._items)

    def extend(self, values: Sequence[Any]) -> None:
        # Callers have checked every value: ids are in [0, 2**31), logprobs are floats.
        self._items.extend(values)

    def equals_prefix(self, values: Sequence[Any]) -> int:
        """Index of the first held item that differs from ``values`` (at least as long), or -1."""
        items = self._items
        if items == array.array(self._typecode, values[: len(items)]):
            return -1
        return next(i for i, (held, new) in enumerate(zip(items, values)) if held != new)

    def __getitem__(self, index: int) -> Any:
        return self._items[index]

    def to_array(self) -> npt.NDArray[Any]:
        return np.frombuffer(self._items, dtype=self.dtype).copy()

    def take_array(self) -> npt.NDArray[Any]:
        """An array that owns the buffer's storage, leaving the buffer empty."""
        items, self._items = self._items, array.array(self._typecode)
        # The array keeps the storage alive; nothing can resize it any more.
        return np.frombuffer(items, dtype=self.dtype) if items else np.empty(0, dtype=self.dtype)
