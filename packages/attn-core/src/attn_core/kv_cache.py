"""Key/value cache for incremental decoding.

Shape legend: ``B`` batch, ``Hkv`` key/value heads, ``L`` cached positions, ``D`` head width.

One ``KVCache`` belongs to one attention layer. Self-attention appends the new
keys/values each step; cross-attention fills it once with the encoder's keys/values
and reuses them on every later step.
"""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


class KVCache:
    """Keys and values seen so far by one attention layer, each ``(B, Hkv, L, D)``."""

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None

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
        if self.key is None or self.value is None:
            self.key, self.value = key, value
        else:
            if key.shape[:2] != self.key.shape[:2] or key.shape[-1] != self.key.shape[-1]:
                raise ValueError(
                    f"new keys {tuple(key.shape)} do not match the cache (B, Hkv, L, D) = "
                    f"{tuple(self.key.shape)}"
                )
            self.key = torch.cat((self.key, key), dim=-2)
            self.value = torch.cat((self.value, value), dim=-2)
        return self.key, self.value

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows (beam search): ``cache[b] <- cache[index[b]]``."""
        if self.key is not None and self.value is not None:
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)

    def reset(self) -> None:
        self.key = self.value = None
