"""Key/value cache for incremental decoding.

Shape legend: ``B`` batch, ``Hkv`` key/value heads, ``L`` cached positions, ``D`` head width,
``C`` reserved positions (``capacity``).

One ``KVCache`` belongs to one attention layer. Self-attention appends the new
keys/values each step; cross-attention fills it once with the encoder's keys/values
and reuses them on every later step.

By default each append concatenates (a new ``(B, Hkv, L, D)`` tensor per step: every
earlier position is copied again, O(L) per step). ``KVCache(capacity=C)`` reserves room
for ``C`` positions on the first update and writes each step's keys/values into it, so a
step copies only its own positions; ``key`` / ``value`` are then views of that buffer
(``reorder`` rewrites it in place, so a view taken before a reorder sees the new order).
More than ``C`` positions still work: the buffer doubles.
"""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


class KVCache:
    """Keys and values seen so far by one attention layer, each ``(B, Hkv, L, D)``.

    ``capacity``: positions to reserve up front (``None``: concatenate on every update).
    """

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and (isinstance(capacity, bool) or capacity < 1):
            raise ValueError(f"capacity must be a positive int or None, got {capacity!r}")
        self.capacity = capacity
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, Hkv, C, D) each

    def __repr__(self) -> str:
        shape = None if self.key is None else tuple(self.key.shape)
        return f"KVCache(shape={shape})"

    @property
    def seq_len(self) -> int:
        """Number of cached positions (the RoPE offset of the next token)."""
        return 0 if self.key is None else self.key.shape[-2]

    @property
    def is_empty(self) -> bool:
        return self.key is None

    def update(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``(B, Hkv, L_new, D)`` keys/values; return everything cached so far."""
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(
                f"keys {tuple(key.shape)} and values {tuple(value.shape)} must agree on "
                "(B, Hkv, L_new)"
            )
        start = 0
        if self.key is not None and self.value is not None:
            if key.shape[:2] != self.key.shape[:2] or key.shape[-1] != self.key.shape[-1]:
                raise ValueError(
                    f"new keys {tuple(key.shape)} do not match the cache (B, Hkv, L, D) = "
                    f"{tuple(self.key.shape)}"
                )
            start = self.key.shape[-2]
        if self.capacity is not None:
            return self._append(key, value, start)
        if start == 0:
            self.key, self.value = key, value
        else:
            self.key = torch.cat((self.key, key), dim=-2)
            self.value = torch.cat((self.value, value), dim=-2)
        return self.key, self.value

    def _append(
        self, key: torch.Tensor, value: torch.Tensor, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key`` / ``value`` at positions ``start ..`` of the reserved buffers (made,
        or doubled, when they are too short); ``key`` / ``value`` become views of them."""
        end = start + key.shape[-2]
        buffers = self._buffers
        if start == 0:
            buffers = None  # (after reset or a first update: fresh buffers of this batch)
        if (
            buffers is None
            or end > buffers[0].shape[-2]
            or (buffers[0].dtype, buffers[0].device) != (key.dtype, key.device)
            or (buffers[1].dtype, buffers[1].device) != (value.dtype, value.device)
        ):
            held = 0 if buffers is None else buffers[0].shape[-2]
            room = max(end, self.capacity or 0, 2 * held)
            new = []
            for t, old in ((key, self.key), (value, self.value)):
                buf = t.new_empty(*t.shape[:-2], room, t.shape[-1])
                if start:
                    buf[..., :start, :] = old
                new.append(buf)
            self._buffers = buffers = (new[0], new[1])
        buffers[0][..., start:end, :] = key
        buffers[1][..., start:end, :] = value
        self.key, self.value = buffers[0][..., :end, :], buffers[1][..., :end, :]
        return self.key, self.value

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): ``cache[b] <- cache[index[b]]``."""
        if self.key is None or self.value is None:
            return
        if self._buffers is not None and index.numel() == self.key.shape[0]:
            self.key.copy_(self.key.index_select(0, index))  # in place, in the buffer
            self.value.copy_(self.value.index_select(0, index))
            return
        self._buffers = None  # a new batch size: new buffers on the next update
        self.key = self.key.index_select(0, index)
        self.value = self.value.index_select(0, index)

    def reset(self) -> None:
        self.key = self.value = None
        self._buffers = None
