"""CoCa (Yu et al. 2022, "Contrastive Captioners"): a CLIP whose image tokens also feed a
captioning decoder. open_clip's ``CoCa``, on attn_core blocks and attention.

Shape legend: ``B`` images, ``R`` decoded rows per image (beams or samples), ``N = B R``,
``T`` caption tokens so far, ``S`` image tokens, ``D`` decoder width, ``V`` vocabulary,
``E`` joint embedding width.

* image tower (:class:`~attn_clip.vision.CLIPVisionTower`, ``attentional_pool=True``): the
  ViT's tokens go through an attentional pooler; query 0 is the contrastive embedding,
  the other ``S = Q - 1`` are the image tokens (``coca_base``: no pooler, the patch tokens);
* text tower (:class:`~attn_clip.text.TextTransformer`, ``embed_cls=True``): a CLS
  embedding appended after the caption is the contrastive embedding; the token rows go to
  the decoder. ``coca_roberta-ViT-B-32``: a Hugging Face RoBERTa
  (:class:`~attn_clip.hf_text.HFTextTower`, as open_clip's ``HFTextEncoder`` with
  ``output_tokens``): the pooled, projected embedding (mean pool) is the contrastive one and
  every last hidden state, ``<s>`` included, goes to the decoder. That encoder is
  bidirectional, as in open_clip: a teacher-forced row sees the later tokens of its
  caption too, and each decoding step re-encodes the whole prefix;
* multimodal decoder (:class:`MultimodalDecoder`): per layer a causal self-attention block
  over the text rows and a cross-attention block over the image tokens, then LayerNorm and
  the projection to the vocabulary (``multimodal.vocab_size`` rows, else the text tower's;
  open_clip's RoBERTa CoCa: 49408, its ``text_cfg`` default, under RoBERTa's 50265 ids):
  next-token logits.

Captioning (:meth:`CoCa.generate`, :meth:`CoCa.caption`) runs attn_nlp's decoding loop
(:func:`attn_nlp.generation.generate`: greedy, beam search, top-k / top-p sampling, the
same logits processors as transformers) over :class:`CaptionDecoder`, which encodes each
image once, computes every cross-attention block's keys and values once per image and
shares them across that image's beams, and keeps a KV cache of the text tower's and the
decoder's self-attention, so each step runs only the new token. ``use_cache=False`` runs
the whole prefix every step instead (what open_clip does) and gives the same tokens. Over
the bidirectional RoBERTa tower every earlier row changes with each new token, so there is
nothing to cache but the image's cross-attention keys and values: every step runs the
whole prefix, with or without ``use_cache``. Its captions start at ``<s>`` (0), end at
``</s>`` (2) and pad with ``<pad>`` (1): the tokenizer's ids, where open_clip's
``generate`` would use CLIP's 49406 / 49407 / 0 unless told otherwise.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from attn_core import CrossAttentionBlock, KVCache, TransformerBlock
from attn_core.fast_inference import block_supported, fast_path_available, linear_act
from attn_nlp.generation import GenerationConfig, generate, resolve_max_length
from torch import nn

from .config import CLIPConfig, MultimodalConfig
from .model import CLIP
from .tokenizer import get_tokenizer

__all__ = ["CaptionDecoder", "CoCa", "CoCaOutput", "MultimodalDecoder"]

KV = tuple[torch.Tensor, torch.Tensor]


class CoCaOutput(NamedTuple):
    """What ``CoCa.forward`` returns: CLIP's fields, plus the teacher-forced caption logits
    ``(B, L - 1, V)`` and their ``labels`` ``(B, L - 1)`` (the captions shifted by one)."""

    logits_per_image: torch.Tensor | None
    logits_per_text: torch.Tensor | None
    image_embeds: torch.Tensor | None
    text_embeds: torch.Tensor | None
    logit_scale: torch.Tensor
    logit_bias: torch.Tensor | None
    logits: torch.Tensor | None = None
    labels: torch.Tensor | None = None


def _fast(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` runs its inference fast path on ``x`` (its ``fast_inference`` flag,
    eval mode, :func:`attn_core.fast_inference.fast_path_available`)."""
    return module.fast_inference and not module.training and fast_path_available(x)


def self_attention_block(
    blk: TransformerBlock,
    x: torch.Tensor,
    cache: KVCache | None,
    fast: bool,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """``blk(x, attn_mask=..., is_causal=..., kv_cache=cache)`` ``(N, L, D)``; with ``fast``
    (and a block the fast path supports) its fused forward
    (:meth:`attn_core.TransformerBlock.forward_fused`: oneDNN products on pre-packed weights),
    the cached keys / values as its prefix and its own appended to the cache.

    A step of one row (``N L == 1``: one caption, greedy) keeps the module calls: its
    products are matrix-vector products, where MKL's (``F.linear``) measured ~5% less time
    per step than the fused blocks; with 6 or 8 rows (beams, batches) the fused blocks took
    ~18% less (docs/benchmarks.md, Captioning)."""
    if not (fast and x.shape[0] * x.shape[1] > 1 and block_supported(blk)):
        return blk(x, attn_mask=attn_mask, is_causal=is_causal, kv_cache=cache)
    if cache is None:
        return blk.forward_fused(x, attn_mask=attn_mask, is_causal=is_causal)
    prefix = None if cache.is_empty else (cache.key, cache.value)
    own: list[KV] = []
    x = blk.forward_fused(x, attn_mask=attn_mask, is_causal=is_causal, prefix=prefix, keep_kv=own)
    cache.update(*own[0])
    return x


class MultimodalDecoder(nn.Module):
    """open_clip's ``MultimodalTransformer``: ``layers`` x (causal self-attention block,
    cross-attention block over the image tokens), ``ln_final``, projection to ``V``.

    ``fast_inference`` (on by default; :func:`attn_core.fast_inference.enable` /
    ``disable``): in eval mode without autograd on CPU the self-attention blocks run fused
    and the projection is one oneDNN product (:func:`attn_core.fast_inference.linear_act`).
    """

    fast_inference = True  # the inference fast path (attn_core.fast_inference.enable)

    def __init__(self, config: MultimodalConfig, vocab_size: int, weight_init: bool = True):
        super().__init__()
        self.config = c = config
        norm = nn.LayerNorm  # open_clip's LayerNorm, eps 1e-5 (its norm_kwargs are not read)
        block = dict(act=c.act, layer_scale=c.ls_init_value, norm_layer=norm)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.width, c.heads, 4.0, **block) for _ in range(c.layers)
        )
        self.cross_blocks = nn.ModuleList(
            CrossAttentionBlock(c.width, c.heads, 4.0, **block) for _ in range(c.layers)
        )
        self.ln_final = norm(c.width)
        self.proj = nn.Linear(c.width, vocab_size, bias=False)  # open_clip's text_projection
        self.grad_checkpointing = False
        if weight_init:
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """open_clip's init: depth-scaled residual projections."""
        c = self.config
        proj_std = c.width**-0.5 * (2 * c.layers) ** -0.5
        for blk in [*self.blocks, *self.cross_blocks]:
            nn.init.normal_(blk.attn.qkv.weight, std=c.width**-0.5)
            nn.init.normal_(blk.attn.proj.weight, std=proj_std)
            nn.init.normal_(blk.mlp.fc1.weight, std=(2 * c.width) ** -0.5)
            nn.init.normal_(blk.mlp.fc2.weight, std=proj_std)
        nn.init.normal_(self.proj.weight, std=c.width**-0.5)

    def context_kv(self, image_tokens: torch.Tensor) -> list[KV]:
        """``(B, S, D)`` image tokens -> each cross-attention block's keys and values."""
        return [blk.context_kv(image_tokens) for blk in self.cross_blocks]

    def forward(
        self,
        image_tokens: torch.Tensor | None,
        text_tokens: torch.Tensor,
        *,
        context_kv: list[KV] | None = None,
        kv_caches: list[KVCache] | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """``text_tokens`` ``(N, T, D)`` (``R`` rows per image) over ``image_tokens``
        ``(B, S, D)`` (or their ``context_kv``) -> logits ``(N, T, V)`` (``last_only``:
        ``(N, V)`` for the last row). ``kv_caches`` (one per self-attention block) hold
        the earlier rows: then ``text_tokens`` are only the new ones."""
        if context_kv is None:
            context_kv = self.context_kv(image_tokens)
        x = text_tokens
        fast = _fast(self, x)
        for i, (blk, cross) in enumerate(zip(self.blocks, self.cross_blocks, strict=True)):
            cache = None if kv_caches is None else kv_caches[i]
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(
                    partial(blk, is_causal=True), x, use_reentrant=False
                )
                x = torch.utils.checkpoint.checkpoint(
                    partial(cross, context_kv=context_kv[i]), x, use_reentrant=False
                )
            else:
                # one new token sees every cached one: no causal mask to build
                x = self_attention_block(blk, x, cache, fast, is_causal=x.shape[1] > 1)
                x = cross(x, context_kv=context_kv[i])
        if last_only:
            x = x[:, -1]
        return linear_act(self.proj, self.ln_final(x), enabled=fast)


class CoCa(CLIP):
    """A CLIP (``visual``, ``text``, ``logit_scale``) with a captioning ``text_decoder``."""

    def __init__(self, config: CLIPConfig, weight_init: bool = True) -> None:
        if config.multimodal is None:
            raise ValueError("CoCa needs a config with multimodal=MultimodalConfig(...)")
        super().__init__(config, weight_init)
        vocab = config.multimodal.vocab_size or config.text.vocab_size
        self.text_decoder = MultimodalDecoder(config.multimodal, vocab, weight_init)

    @property
    def pad_id(self) -> int:
        """The caption pad id: the text tower's (a Hugging Face tower: its encoder's, e.g.
        RoBERTa's ``<pad>`` = 1, which its tokenizer pads with and its encoder masks)."""
        if self.config.text.tower == "hf":
            return self.text.pad_id
        return self.config.text.pad_id

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        super().set_grad_checkpointing(enable)
        self.text_decoder.grad_checkpointing = enable

    def encode_image_tokens(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, C, H, W)`` -> ``(embeddings (B, E), image tokens (B, S, D))``."""
        return self.visual.forward_tokens(images)

    def forward(
        self,
        images: torch.Tensor | None = None,
        texts: torch.Tensor | None = None,
        decoder_texts: torch.Tensor | None = None,
    ) -> CoCaOutput:
        """Embed images and/or captions; with both, the image-text logits and the caption
        logits ``(B, L - 1, V)``: token ``t + 1`` predicted from the image and tokens
        ``<= t`` (teacher forcing, open_clip's ``CoCa.forward``).

        ``decoder_texts`` ``(B, L)`` (optional, with images and texts): the decoder reads
        these tokens instead of ``texts`` (the text tower runs a second time, on them), while
        the labels and the contrastive embeddings stay those of ``texts`` -- e.g. captions
        with noised input words (:func:`attn_train.contrastive.noise_caption_inputs`)."""
        image_embeds = image_tokens = text_embeds = text_tokens = None
        if images is not None:
            image_embeds, image_tokens = self.encode_image_tokens(images)
            image_embeds = F.normalize(image_embeds, dim=-1)
        if texts is not None:
            text_embeds, text_tokens = self.text.forward_tokens(texts)
            text_embeds = F.normalize(text_embeds, dim=-1)
        if decoder_texts is not None:
            if texts is None or images is None or decoder_texts.shape != texts.shape:
                shape = None if texts is None else tuple(texts.shape)
                raise ValueError(
                    f"decoder_texts must come with images and texts and have the texts' shape "
                    f"{shape}; got {tuple(decoder_texts.shape)}"
                )
            _, text_tokens = self.text.forward_tokens(decoder_texts)
        per_image = per_text = logits = labels = None
        if image_embeds is not None and text_embeds is not None:
            per_image, per_text = self.logits(image_embeds, text_embeds)
            logits = self.text_decoder(image_tokens, text_tokens[:, :-1])
            labels = texts[:, 1:]
        return CoCaOutput(per_image, per_text, image_embeds, text_embeds, self.scale(),
                          self.logit_bias, logits, labels)  # fmt: skip

    def generation_config(self, **options: Any) -> GenerationConfig:
        """The captioning defaults with ``options`` applied: greedy, at most 30 tokens
        with the start token (open_clip's ``seq_len=30``), at least 5 (its
        ``min_seq_len``), stop at end-of-text, pad with ``pad_id``."""
        tokenizer = self.tokenizer()
        defaults = GenerationConfig(
            max_length=min(30, self.config.multimodal.context_length + 1),
            min_length=5,
            eos_token_id=tokenizer.eot_token_id,
            pad_token_id=self.pad_id,
            bos_token_id=tokenizer.sot_token_id,
            top_k=None,
        )
        return defaults.update(**options)

    @torch.no_grad()
    def generate(
        self,
        images: torch.Tensor,
        generation_config: GenerationConfig | None = None,
        **options: Any,
    ) -> torch.Tensor:
        """Caption ``(B, C, H, W)`` preprocessed images -> token ids ``(B * n, L)``, each
        row the start token, the caption, end-of-text, then ``pad_id`` (``n`` =
        ``num_return_sequences``, rows of one image adjacent).

        ``options`` are :class:`attn_nlp.generation.GenerationConfig` fields on top of
        :meth:`generation_config`'s defaults: ``num_beams``, ``length_penalty``,
        ``num_return_sequences``, ``do_sample`` + ``top_k`` / ``top_p`` / ``temperature``
        (``seed`` for repeatable samples), ``repetition_penalty``,
        ``no_repeat_ngram_size``, ``min_new_tokens`` / ``max_new_tokens``, ``use_cache``.
        """
        if images.ndim != 4:
            raise ValueError(f"images must be (B, C, H, W), got {tuple(images.shape)}")
        return self.generate_from_tokens(None, generation_config, images=images, **options)

    @torch.no_grad()
    def generate_from_tokens(
        self,
        image_tokens: torch.Tensor | None,
        generation_config: GenerationConfig | None = None,
        *,
        images: torch.Tensor | None = None,
        **options: Any,
    ) -> torch.Tensor:
        """:meth:`generate` from image tokens ``(B, S, D)`` already computed by
        :meth:`encode_image_tokens` (e.g. by a caller that also keeps the images'
        embeddings: the image tower runs once); ``images`` instead: encoded here."""
        config = generation_config or self.generation_config()
        if options:
            config = config.update(**options)
        was_training = self.training
        self.eval()
        try:
            positions = self.config.multimodal.context_length
            max_length = resolve_max_length(config, 1, positions)  # (raises before any work)
            if image_tokens is None:
                _, image_tokens = self.encode_image_tokens(images)  # once per image
            rows = config.num_beams if config.num_beams > 1 else config.num_return_sequences
            decoder = CaptionDecoder(
                self, image_tokens, rows, use_cache=config.use_cache, max_length=max_length
            )
            start = config.bos_token_id
            prompt = torch.full((image_tokens.shape[0], 1), start, dtype=torch.long,
                                device=image_tokens.device)  # fmt: skip
            return generate(decoder, prompt, config, max_positions=positions)
        finally:
            self.train(was_training)

    def tokenizer(self) -> Any:
        """The text tower's tokenizer (:func:`attn_clip.tokenizer.get_tokenizer`), kept."""
        if getattr(self, "_tokenizer", None) is None:
            self._tokenizer = get_tokenizer(self.config)
        return self._tokenizer

    def decode(self, ids: torch.Tensor, tokenizer: Any = None) -> list[str]:
        """Token ids from :meth:`generate` -> caption strings (cut at end-of-text)."""
        tokenizer = tokenizer or self.tokenizer()
        eot = tokenizer.eot_token_id
        out = []
        for row in ids.tolist():
            row = row[1:]  # the start token
            row = row[: row.index(eot)] if eot in row else row
            out.append(tokenizer.decode(row).strip())
        return out

    def caption(self, images: torch.Tensor, tokenizer: Any = None, **options: Any) -> list[str]:
        """``(B, C, H, W)`` preprocessed images -> ``B * num_return_sequences`` captions."""
        return self.decode(self.generate(images, **options), tokenizer)


class CaptionDecoder:
    """The :class:`attn_nlp.generation.Decoder` of a CoCa model over some images.

    Called with all tokens so far ``(N, T)`` (``R`` rows per image, adjacent), it returns
    the next-token logits ``(N, V)``. The images' tokens are given once; each
    cross-attention block's keys and values are computed once, ``(B, H, S, hd)``, and
    every row of an image attends to them (never copied per beam). With ``use_cache``
    the text tower's and the decoder's self-attention keep their keys and values
    (:class:`attn_core.KVCache`) and only the new tokens run; ``reorder`` follows the beams.
    A bidirectional (Hugging Face) text tower re-encodes the whole prefix every step, so
    ``use_cache`` has nothing to keep there (``self.use_cache`` is False).
    """

    def __init__(
        self,
        model: CoCa,
        image_tokens: torch.Tensor,
        rows_per_image: int,
        use_cache: bool = True,
        max_length: int | None = None,
    ):
        self.model = model
        self.rows = rows_per_image
        self.context_kv = model.text_decoder.context_kv(image_tokens)
        # a bidirectional text tower: each new token changes every earlier row
        self.bidirectional = model.config.text.tower == "hf"
        self.use_cache = use_cache = use_cache and not self.bidirectional
        self.text_caches = self.decoder_caches = None
        if use_cache:
            n_text, n_dec = len(model.text.blocks), len(model.text_decoder.blocks)
            # max_length tokens: the caches reserve their room once (no copy of the past)
            room = None if max_length is None else max(1, max_length - 1)
            self.text_caches = [KVCache(room) for _ in range(n_text)]
            self.decoder_caches = [KVCache(room) for _ in range(n_dec)]
        self.seen = 0  # tokens already in the caches

    def _text_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """The text tower's rows for ``tokens[:, seen:]`` ``(N, T - seen, D)`` (no CLS: a
        token row never sees the appended CLS under the causal mask). A Hugging Face tower:
        every row of ``tokens`` ``(N, T, D)``, as its ``forward_tokens`` gives them."""
        text = self.model.text
        if self.bidirectional:
            return text.forward_tokens(tokens)[1]
        T, P = tokens.shape[1], self.seen
        new = tokens[:, P:]
        x = text.token_embedding(new)
        if text.token_proj is not None:
            x = text.token_proj(x)
        x = x + text.positional_embedding[P:T].to(x.dtype)
        keep = text.key_mask(tokens)[:, None, :T]  # (N, 1, T): open_clip's pad mask
        if T - P == 1:  # one new token: causality allows every key; only the pads are masked
            mask = None if bool(keep.all()) else keep[:, None]  # (N, 1, 1, T)
        else:
            causal = torch.ones(T - P, T, dtype=torch.bool, device=x.device).tril(P)
            mask = (causal & keep)[:, None]  # (N, 1, T - P, T)
        fast = _fast(text, x)
        for i, blk in enumerate(text.blocks):
            cache = None if self.text_caches is None else self.text_caches[i]
            x = self_attention_block(blk, x, cache, fast, attn_mask=mask)
        return x

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.use_cache:
            self.seen = 0
        x = self._text_rows(tokens)
        logits = self.model.text_decoder(
            None, x, context_kv=self.context_kv, kv_caches=self.decoder_caches, last_only=True
        )
        if self.use_cache:
            self.seen = tokens.shape[1]
        return logits

    def reorder(self, index: torch.Tensor) -> None:
        if self.use_cache:
            for cache in [*self.text_caches, *self.decoder_caches]:
                cache.reorder(index)
