"""A KV cache whose layers keep spare columns, so a decode step writes its token in place.

transformers' ``DynamicLayer`` appends by ``torch.cat``: every decode step
copies the whole running batch's keys and values into freshly allocated
memory (16 rows of SmolLM2 at ~800 tokens: ~600 MB a step, plus the page
faults of touching new memory). :class:`RoomyLayer` holds its keys and
values as a window ``[start, end)`` of buffers with free columns after
``end``: an update writes into them and only a full buffer is copied (into
one with ``room`` more columns). Dropping left padding moves ``start``.
The values the model sees are the same; only where they live changes.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

ROOM = 64  # spare columns a buffer gets when it is (re)allocated: one copy per ROOM decode steps


class _Columns:
    """One tensor ``[rows, heads, columns, head_dim]`` as the window ``[start, end)`` of a larger buffer."""

    def __init__(self, buffer: torch.Tensor, end: int):
        self.buffer, self.start, self.end = buffer, 0, end

    @classmethod
    def copy_of(cls, values: torch.Tensor, room: int) -> _Columns:
        buffer = values.new_empty((*values.shape[:2], values.shape[2] + room, values.shape[3]))
        buffer[:, :, : values.shape[2]].copy_(values)
        return cls(buffer, values.shape[2])

    @property
    def view(self) -> torch.Tensor:
        return self.buffer[:, :, self.start : self.end]

    def append(self, new: torch.Tensor) -> None:
        if self.end + new.shape[2] > self.buffer.shape[2]:
            grown = _Columns.copy_of(self.view, new.shape[2] + ROOM)
            self.buffer, self.start, self.end = grown.buffer, grown.start, grown.end
        self.buffer[:, :, self.end : self.end + new.shape[2]].copy_(new)
        self.end += new.shape[2]

    def select_rows(self, indices: torch.Tensor) -> None:
        self.buffer = self.buffer[indices]


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``update`` writes into spare columns; assigning ``keys``/``values`` replaces them."""

    def __init__(self):
        self._keys = self._values = None
        super().__init__()

    @classmethod
    def holding(cls, keys: _Columns, values: _Columns) -> RoomyLayer:
        layer = cls()
        layer._keys, layer._values = keys, values
        layer.dtype, layer.device, layer.is_initialized = keys.buffer.dtype, keys.buffer.device, True
        return layer

    @classmethod
    def copy_of(cls, keys: torch.Tensor, values: torch.Tensor, room: int = ROOM) -> RoomyLayer:
        return cls.holding(_Columns.copy_of(keys, room), _Columns.copy_of(values, room))

    @classmethod
    def in_buffers(cls, keys: torch.Tensor, values: torch.Tensor, end: int) -> RoomyLayer:
        """A layer over the first ``end`` columns of ``keys`` and ``values`` (the rest is its room), not copied."""
        return cls.holding(_Columns(keys, end), _Columns(values, end))

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys.view

    @keys.setter
    def keys(self, keys: torch.Tensor | None) -> None:
        self._keys = None if keys is None else _Columns(keys, keys.shape[2])

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values.view

    @values.setter
    def values(self, values: torch.Tensor | None) -> None:
        self._values = None if values is None else _Columns(values, values.shape[2])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized or self._keys is None or self._keys.end == self._keys.start:
            self.dtype, self.device = key_states.dtype, key_states.device
            self._keys, self._values = _Columns.copy_of(key_states, ROOM), _Columns.copy_of(value_states, ROOM)
            self.is_initialized = True
        else:
            self._keys.append(key_states)
            self._values.append(value_states)
        return self.keys, self.values

    def drop_left(self, columns: int) -> None:
        """Forget the first ``columns`` columns (padding no row uses) without copying."""
        self._keys.start += columns
        self._values.start += columns

    def drop_right(self, columns: int) -> None:
        """Forget the last ``columns`` columns (draft tokens a speculative step rejected); their room is reused."""
        self._keys.end -= columns
        self._values.end -= columns

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._keys.select_rows(indices)
            self._values.select_rows(indices)


def roomy_cache(layers: list[RoomyLayer] | None = None) -> DynamicCache:
    """A cache of ``layers``; without them, its layers are made (roomy) as the model first writes them."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = RoomyLayer
    cache.layers = layers or []
    return cache
