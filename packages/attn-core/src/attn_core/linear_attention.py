"""Linear attention: kernel feature maps instead of softmax, O(L) time and memory.

Shape legend: ``B`` batch, ``H`` heads, ``L`` sequence length, ``D`` head width,
``F`` feature-map width, ``Dv`` value width, ``E`` embedding width, ``m`` random features,
``C`` chunk size.

With non-negative feature maps ``phi`` on queries and keys, attention becomes

    out_i = phi(q_i)^T S / (phi(q_i)^T z),   S = sum_j phi(k_j) v_j^T,   z = sum_j phi(k_j)

summed over all ``j`` (non-causal) or ``j <= i`` (causal). Two feature maps:

* :func:`elu_feature_map` -- ``elu(x) + 1`` (Katharopoulos et al. 2020,
  "Transformers are RNNs").
* :func:`favor_features` -- FAVOR+ positive orthogonal random features, an unbiased
  estimate of the softmax kernel ``exp(q . k / sqrt(D))`` (Choromanski et al. 2021,
  "Rethinking Attention with Performers").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "LinearAttention",
    "PerformerAttention",
    "elu_feature_map",
    "favor_features",
    "linear_attention",
    "orthogonal_random_features",
]

_HALF = (torch.float16, torch.bfloat16)


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    chunk_size: int = 64,
) -> torch.Tensor:
    """Normalised linear attention on feature-mapped ``q``, ``k`` ``(B, H, L, F)`` (>= 0).

    ``v`` is ``(B, H, L, Dv)``; ``key_padding_mask`` ``(B, L)`` is bool, True = padding
    (those keys contribute nothing). Causal runs chunk by chunk: a masked ``C x C``
    quadratic form inside each chunk plus a running state ``S`` ``(B, H, F, Dv)`` and
    ``z`` ``(B, H, F)`` across chunks, so time and memory stay O(L). Returns ``(B, H, L, Dv)``.
    """
    if q.dim() != 4 or k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(
            f"expected q, k (B, H, L, F) and v (B, H, L, Dv), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    dtype = v.dtype
    compute = torch.float32 if dtype in _HALF else dtype
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool or key_padding_mask.shape != q.shape[::2]:
            raise ValueError(
                "linear attention needs a bool key_padding_mask (B, L) = "
                f"{tuple(q.shape[::2])} (True = padding), got {key_padding_mask.dtype} "
                f"{tuple(key_padding_mask.shape)}"
            )
        k = k.masked_fill(key_padding_mask[:, None, :, None], 0.0)

    if causal:
        num, den = _causal_chunks(q, k, v, chunk_size)
    else:
        S = k.transpose(-2, -1) @ v  # (B, H, F, Dv)
        z = k.sum(dim=-2)  # (B, H, F)
        num, den = q @ S, q @ z.unsqueeze(-1)  # (B, H, L, Dv), (B, H, L, 1)
    return (num / den.clamp_min(eps)).to(dtype)


def _causal_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal numerator ``(B, H, L, Dv)`` and denominator ``(B, H, L, 1)``, chunk by chunk."""
    B, H, L, Fw = q.shape
    S = q.new_zeros(B, H, Fw, v.shape[-1])  # sum of phi(k_j) v_j^T over earlier chunks
    z = q.new_zeros(B, H, Fw, 1)  # sum of phi(k_j) over earlier chunks
    tril = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    nums, dens = [], []
    for start in range(0, L, chunk_size):
        qc, kc, vc = (t[:, :, start : start + chunk_size] for t in (q, k, v))  # (B, H, C, .)
        c = qc.shape[-2]
        scores = (qc @ kc.transpose(-2, -1)).masked_fill(~tril[:c, :c], 0.0)  # (B, H, C, C)
        nums.append(qc @ S + scores @ vc)
        dens.append(qc @ z + scores.sum(dim=-1, keepdim=True))
        S = S + kc.transpose(-2, -1) @ vc
        z = z + kc.sum(dim=-2).unsqueeze(-1)
    return torch.cat(nums, dim=-2), torch.cat(dens, dim=-2)


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``elu(x) + 1``: positive features of the same shape as ``x`` (Katharopoulos et al.)."""
    return F.elu(x) + 1


def favor_features(
    x: torch.Tensor,
    projection: torch.Tensor,
    *,
    is_query: bool,
    eps: float = 1e-6,
    causal: bool = False,
) -> torch.Tensor:
    """FAVOR+ positive random features ``(..., L, m)`` of ``x`` ``(..., L, D)``.

    ``phi(q) . phi(k)`` estimates ``exp(q . k / sqrt(D))`` up to a constant factor that
    cancels in the normalisation. ``projection`` is ``(m, D)`` (see
    :func:`orthogonal_random_features`). The stabiliser subtracted before ``exp`` is the
    row max for queries and the max over all keys of a sequence (the last two dims) for
    keys, as in the Performer reference code. That key maximum would let future keys
    change past outputs (through ``eps`` and underflow), so with ``causal=True`` keys use
    the data-independent bound ``max_i |w_i|^2 / 2`` (``w . x - |x|^2 / 2`` never
    exceeds it) and no ``eps``. Computed in float32 for half inputs.
    """
    dtype = x.dtype
    x = x.float() if dtype in _HALF else x
    m, D = projection.shape
    x = x * D**-0.25
    proj = x @ projection.to(x.dtype).T  # (..., L, m)
    sq_norm = x.pow(2).sum(dim=-1, keepdim=True) / 2  # (..., L, 1)
    if is_query:
        stabiliser = proj.amax(dim=-1, keepdim=True)
    elif causal:
        stabiliser = projection.to(x.dtype).pow(2).sum(dim=-1).amax() / 2
        eps = 0.0
    else:
        stabiliser = proj.amax(dim=(-2, -1), keepdim=True)
    phi = (torch.exp(proj - sq_norm - stabiliser.detach()) + eps) / math.sqrt(m)
    return phi.to(dtype)


def orthogonal_random_features(
    num_features: int,
    dim: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``(num_features, dim)`` random projection: orthogonal blocks, chi-distributed norms.

    Rows come in blocks of ``dim`` mutually orthogonal directions (QR of a Gaussian
    matrix, signs fixed so each block is Haar-distributed); each row is then rescaled to
    the norm of an independent ``N(0, I_dim)`` vector, so rows are marginally Gaussian.
    """
    blocks = []
    for _ in range(math.ceil(num_features / dim)):
        g = torch.randn(dim, dim, generator=generator, device=device)
        Q, R = torch.linalg.qr(g)
        sign = torch.sign(torch.diagonal(R))
        Q = Q * torch.where(sign == 0, 1.0, sign)  # columns of Q are orthonormal
        blocks.append(Q.T)
    w = torch.cat(blocks)[:num_features]  # (num_features, dim), unit rows
    norms = torch.randn(num_features, dim, generator=generator, device=device).norm(dim=-1)
    return (w * norms[:, None]).to(dtype)


class _KernelAttention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` and an output ``proj`` (timm names)."""

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool, bias: bool) -> None:
        super().__init__()
        if num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        self.eps = 1e-6
        self.den_eps = 1e-6  # clamp for the normaliser phi(q) . sum phi(k)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}"

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` ``(B, L, E)``, ``key_padding_mask`` ``(B, L)`` True = padding -> ``(B, L, E)``."""
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"expected x of shape (B, L, {self.embed_dim}), got {tuple(x.shape)}")
        B, L, E = x.shape
        qkv = self.qkv(x).view(B, L, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, L, D)
        q, k = self.feature_maps(q, k)
        out = linear_attention(
            q, k, v, causal=self.causal, key_padding_mask=key_padding_mask, eps=self.den_eps
        )
        return self.proj(out.transpose(1, 2).reshape(B, L, E))


class LinearAttention(_KernelAttention):
    """Linear attention with the ``elu(x) + 1`` feature map (Katharopoulos et al. 2020)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        bias: bool = True,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(embed_dim, num_heads, causal=causal, bias=bias)
        self.eps = self.den_eps = eps

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return elu_feature_map(q), elu_feature_map(k)


class PerformerAttention(_KernelAttention):
    """Performer (FAVOR+) attention: random features approximating softmax attention.

    The ``projection`` buffer ``(num_features, head_dim)`` is saved in the state dict.
    With ``redraw=True`` a fresh projection is drawn on every training-mode forward.
    """

    projection: torch.Tensor

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_features: int = 256,
        causal: bool = False,
        bias: bool = True,
        redraw: bool = False,
    ) -> None:
        super().__init__(embed_dim, num_heads, causal=causal, bias=bias)
        self.num_features = num_features
        self.redraw = redraw
        self.register_buffer("projection", orthogonal_random_features(num_features, self.head_dim))
        if causal:  # causal key features carry no eps and can be tiny (see favor_features)
            self.den_eps = 1e-30

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_features={self.num_features}, redraw={self.redraw}"

    @torch.no_grad()
    def redraw_projection(self, generator: torch.Generator | None = None) -> None:
        """Replace ``projection`` in place with a fresh orthogonal random draw."""
        p = self.projection
        new = orthogonal_random_features(*p.shape, generator=generator, device=p.device)
        p.copy_(new)

    def feature_maps(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.redraw and self.training:
            self.redraw_projection()
        if q.dtype in _HALF:  # keep the tiny key features out of half precision
            q, k = q.float(), k.float()
        return (
            favor_features(q, self.projection, is_query=True, eps=self.eps),
            favor_features(k, self.projection, is_query=False, eps=self.eps, causal=self.causal),
        )
