"""Transformer decoder of the attention branch, with a key/value cache for batched incremental decoding.

Follows fairseq's ``TransformerDecoder`` / ``TransformerDecoderLayer`` (``fairseq/models/transformer``), which
AV-HuBERT's sequence-to-sequence fine-tuning model uses (Shi et al., 2022, Sec. 4.1, "AV-HuBERT + Transformer
decoder"), and Vaswani et al. (2017), Sec. 3.1: token embedding scaled by ``sqrt(d)``, sinusoidal positions,
``N`` layers of causal self-attention, cross-attention over the encoder output and a feed-forward block,
pre-LN (``decoder_normalize_before``) with a final LayerNorm, and an output projection optionally tied to
the embedding. Attribute names are fairseq's (``embed_tokens``, ``layers.N.self_attn.{q,k,v,out}_proj``,
``layers.N.self_attn_layer_norm``, ``layers.N.encoder_attn.*``, ``layers.N.encoder_attn_layer_norm``,
``layers.N.fc1``/``fc2``, ``layers.N.final_layer_norm``, ``layer_norm``, ``output_projection``) so that
state-dict keys map 1:1.

Tensors are batch-first, ``(B, L, D)``. Attention uses
:func:`torch.nn.functional.scaled_dot_product_attention`.

Incremental decoding (:meth:`TransformerDecoder.init_state`, :meth:`TransformerDecoder.step`) keeps, for
every layer, the self-attention keys/values of the tokens decoded so far, one row per hypothesis, and the
cross-attention keys/values of the encoder output once per utterance. The hypotheses of one utterance are
``group`` consecutive rows (``N = B * group``): in cross-attention they are the ``group`` queries of that
utterance, so the encoder keys/values are never copied per beam.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from avsr.config import Config, ConfigError, from_dict, option, probability
from avsr.nn.precision import fp32_context
from avsr.nn.transformer import ACTIVATIONS, attention, get_activation_fn

__all__ = [
    "TransformerDecoderConfig",
    "TransformerDecoder",
    "DecoderState",
    "sinusoidal_positions",
]


@dataclass
class TransformerDecoderConfig(Config):
    """Hyper-parameters of :class:`TransformerDecoder` (fairseq / AV-HuBERT names).

    Attributes:
        decoder_layers: number of decoder layers.
        decoder_embed_dim: model dimension ``D`` (token embedding, residual stream).
        decoder_ffn_embed_dim: hidden size of the feed-forward block.
        decoder_attention_heads: attention heads (``D`` must be divisible by it).
        decoder_normalize_before: pre-LN layers and a final LayerNorm (True) or post-LN (False).
        dropout: dropout on the embeddings and after each sub-layer.
        attention_dropout: dropout on the attention probabilities.
        activation_dropout: dropout after the feed-forward activation.
        decoder_layerdrop: probability of skipping a whole layer in training (Fan et al., 2019).
        share_decoder_input_output_embed: tie the output projection to the token embedding.
        no_scale_embedding: do not scale the token embedding by ``sqrt(D)`` (fairseq's option).
        activation_fn: feed-forward activation (fairseq names: relu, gelu, ...).
        max_target_positions: fairseq's maximum output length (tokens, ``</s>`` included); the sinusoidal
            positions have no limit, but fairseq's generator caps its output at ``max_target_positions - 1``
            tokens, which the ``search: fairseq`` mode of the beam search reproduces.
    """

    decoder_layers: int = option(6, ge=0)
    decoder_embed_dim: int = option(768, ge=1)
    decoder_ffn_embed_dim: int = option(3072, ge=1)
    decoder_attention_heads: int = option(12, ge=1)
    decoder_normalize_before: bool = True
    dropout: float = probability(0.1)
    attention_dropout: float = probability(0.0)
    activation_dropout: float = probability(0.1)
    decoder_layerdrop: float = probability(0.0)
    share_decoder_input_output_embed: bool = False
    no_scale_embedding: bool = False
    activation_fn: str = option("relu", choices=sorted(ACTIVATIONS))
    max_target_positions: int = option(2048, ge=2)

    def check(self) -> None:
        """The rules between fields. Raises :class:`avsr.config.ConfigError` naming the keys."""
        if self.decoder_embed_dim % self.decoder_attention_heads != 0:
            raise ConfigError(
                f"decoder_embed_dim ({self.decoder_embed_dim}) must be divisible by "
                f"decoder_attention_heads ({self.decoder_attention_heads})"
            )


def sinusoidal_positions(positions: Tensor, dim: int) -> Tensor:
    """Sinusoidal position embeddings, fairseq's ``SinusoidalPositionalEmbedding.get_embedding`` layout.

    ``emb[p, j] = sin(p * w_j)`` for ``j < dim/2`` and ``cos(p * w_{j - dim/2})`` after, with
    ``w_j = 10000 ** (-j / (dim/2 - 1))`` (sines then cosines, not interleaved; a zero column is appended when
    ``dim`` is odd).

    Args:
        positions: integer positions, any shape ``S``.
        dim: embedding size.

    Returns:
        float32 tensor of shape ``S + (dim,)`` on the device of ``positions``.
    """
    half = dim // 2
    scale = math.log(10000.0) / max(half - 1, 1)
    freqs = torch.exp(torch.arange(half, device=positions.device, dtype=torch.float32) * -scale)
    angles = positions.to(torch.float32).unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if dim % 2 == 1:
        emb = F.pad(emb, (0, 1))
    return emb


INITIAL_CACHE_LENGTH = 16


@dataclass
class DecoderState:
    """Key/value cache of :class:`TransformerDecoder` for incremental decoding (inference only).

    The self-attention cache lives in preallocated buffers that grow by doubling; beam reordering gathers
    into a second set of buffers and swaps them, so that a decoding step allocates no large tensor (fresh
    large allocations cost more than the copies on CPU).

    Attributes:
        self_k, self_v: per layer, ``(N, H, capacity, D/H)`` buffers; positions ``[:length]`` hold the
            keys/values of the tokens fed so far, one row per hypothesis.
        cross_k, cross_v: per layer, ``(B, H, T, D/H)`` keys/values of the encoder output, one row per
            utterance.
        memory_mask: ``(B, 1, 1, T)`` bool, True on valid encoder frames.
        group: hypotheses per utterance; row ``n`` belongs to utterance ``n // group``.
        length: number of tokens fed so far (the position of the next token).
    """

    self_k: list[Tensor]
    self_v: list[Tensor]
    cross_k: list[Tensor]
    cross_v: list[Tensor]
    memory_mask: Tensor
    group: int
    length: int = 0
    spare_k: list[Tensor] | None = None
    spare_v: list[Tensor] | None = None

    def cached(self, layer: int, upto: int) -> tuple[Tensor, Tensor]:
        """Views ``(N, H, upto, D/H)`` of the keys and values of ``layer``."""
        return self.self_k[layer][:, :, :upto], self.self_v[layer][:, :, :upto]

    def write(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Store the keys/values ``(N, H, 1, D/H)`` of the token at position ``length`` (growing the buffers
        when full)."""
        if self.length == self.self_k[layer].size(2):
            self.self_k[layer] = _grow(self.self_k[layer], self.length)
            self.self_v[layer] = _grow(self.self_v[layer], self.length)
            self.spare_k = self.spare_v = None
        self.self_k[layer][:, :, self.length] = k[:, :, 0]
        self.self_v[layer][:, :, self.length] = v[:, :, 0]

    @torch.no_grad()
    def select(self, rows: Tensor, utts: Tensor | None = None) -> DecoderState:
        """Reorder / select hypotheses (beam reordering) and, optionally, utterances.

        Args:
            rows: ``(N',)`` int64 indices of the hypothesis rows to keep, in their new order. Without ``utts``
                ``N' == N`` and a row may only move within its own utterance (the beam search guarantees
                this).
            utts: ``(B',)`` int64 indices of the utterances to keep (``N' = B' * group``), or None to
                keep all.

        Returns:
            The new state. Its buffers are reused from this one, which must not be used any more.
        """
        t = self.length
        if utts is not None:
            return DecoderState(
                [k.index_select(0, rows) for k in self.self_k],
                [v.index_select(0, rows) for v in self.self_v],
                [k.index_select(0, utts) for k in self.cross_k],
                [v.index_select(0, utts) for v in self.cross_v],
                self.memory_mask.index_select(0, utts),
                self.group,
                t,
            )
        if self.spare_k is None:
            self.spare_k = [torch.empty_like(k) for k in self.self_k]
            self.spare_v = [torch.empty_like(v) for v in self.self_v]
        for src, dst in zip(self.self_k + self.self_v, self.spare_k + self.spare_v):
            torch.index_select(src[:, :, :t], 0, rows, out=dst[:, :, :t])
        return DecoderState(
            self.spare_k,
            self.spare_v,
            self.cross_k,
            self.cross_v,
            self.memory_mask,
            self.group,
            t,
            self.self_k,
            self.self_v,
        )


def _grow(buf: Tensor, used: int) -> Tensor:
    """A buffer twice as long along dim 2 (at least :data:`INITIAL_CACHE_LENGTH`) holding
    ``buf[:, :, :used]``."""
    n, h, cap, d = buf.shape
    new = buf.new_empty(n, h, max(2 * cap, INITIAL_CACHE_LENGTH), d)
    new[:, :, :used] = buf[:, :, :used]
    return new


class MultiheadAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections (fairseq ``MultiheadAttention`` names).

    ``kdim`` is the size of the key/value input (the encoder output size for cross-attention).
    Source: Vaswani et al. (2017), Sec. 3.2.2.
    """

    def __init__(self, embed_dim: int, num_heads: int, kdim: int | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        kdim = kdim or embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(kdim, embed_dim)
        self.v_proj = nn.Linear(kdim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        for proj in (self.q_proj, self.k_proj, self.v_proj):  # fairseq init
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def heads(self, x: Tensor) -> Tensor:
        """``(B, L, D)`` -> ``(B, H, L, D/H)``."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def project_kv(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values ``(B, H, S, D/H)`` of the input ``(B, S, kdim)``."""
        return self.heads(self.k_proj(kv)), self.heads(self.v_proj(kv))

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False
    ) -> Tensor:
        """Attention of queries ``q (B, L, D)`` (not yet projected) over projected ``k, v (B, H, S, D/H)``.

        ``mask`` is a bool ``(B, 1, 1|L, S)`` (True = attend) or None; returns ``(B, L, D)``.
        """
        qh = self.heads(self.q_proj(q))
        p = self.dropout if self.training else 0.0
        out = attention(qh, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
        return self.out_proj(out.transpose(1, 2).flatten(2))


class TransformerDecoderLayer(nn.Module):
    """One decoder layer: causal self-attention, cross-attention, feed-forward; pre- or post-LN.

    Source: fairseq ``TransformerDecoderLayer`` (``normalize_before``), Vaswani et al. (2017), Sec. 3.1.
    """

    def __init__(self, cfg: TransformerDecoderConfig, encoder_dim: int) -> None:
        super().__init__()
        d = cfg.decoder_embed_dim
        self.normalize_before = cfg.decoder_normalize_before
        self.self_attn = MultiheadAttention(d, cfg.decoder_attention_heads, dropout=cfg.attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.encoder_attn = MultiheadAttention(
            d, cfg.decoder_attention_heads, kdim=encoder_dim, dropout=cfg.attention_dropout
        )
        self.encoder_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.decoder_ffn_embed_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_embed_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        self.activation_fn = get_activation_fn(cfg.activation_fn)
        self.dropout = nn.Dropout(cfg.dropout)
        self.activation_dropout = nn.Dropout(cfg.activation_dropout)

    def _block(self, x: Tensor, norm: nn.LayerNorm, fn) -> Tensor:
        """Residual sub-layer ``x + dropout(fn(x'))`` with LayerNorm before (pre-LN) or after (post-LN)."""
        if self.normalize_before:
            return x + self.dropout(fn(norm(x)))
        return norm(x + self.dropout(fn(x)))

    def _ffn(self, x: Tensor) -> Tensor:
        return self.fc2(self.activation_dropout(self.activation_fn(self.fc1(x))))

    def forward(self, x: Tensor, cross_k: Tensor, cross_v: Tensor, memory_mask: Tensor) -> Tensor:
        """Full (teacher-forced) pass: ``x (B, L, D)``, cross keys/values ``(B, H, T, D/H)``,
        ``memory_mask (B, 1, 1, T)`` bool -> ``(B, L, D)``."""

        def self_attn(h: Tensor) -> Tensor:
            k, v = self.self_attn.project_kv(h)
            return self.self_attn.attend(h, k, v, causal=True)

        x = self._block(x, self.self_attn_layer_norm, self_attn)
        x = self._block(
            x,
            self.encoder_attn_layer_norm,
            lambda h: self.encoder_attn.attend(h, cross_k, cross_v, memory_mask),
        )
        return self._block(x, self.final_layer_norm, self._ffn)

    def step(self, x: Tensor, state: DecoderState, layer: int) -> Tensor:
        """Incremental pass for one new token per hypothesis: ``x (N, 1, D)`` -> ``(N, 1, D)``.

        Writes the new self-attention keys/values at position ``state.length`` of the layer's cache (the
        caller advances ``state.length`` after the last layer).
        """
        group = state.group

        def self_attn(h: Tensor) -> Tensor:
            state.write(layer, *self.self_attn.project_kv(h))
            return self.self_attn.attend(h, *state.cached(layer, state.length + 1))

        def cross_attn(h: Tensor) -> Tensor:
            # the `group` hypotheses of an utterance are its `group` queries: (N, 1, D) -> (B, group, D)
            out = self.encoder_attn.attend(
                h.reshape(-1, group, h.size(-1)),
                state.cross_k[layer],
                state.cross_v[layer],
                state.memory_mask,
            )
            return out.reshape(-1, 1, out.size(-1))

        x = self._block(x, self.self_attn_layer_norm, self_attn)
        x = self._block(x, self.encoder_attn_layer_norm, cross_attn)
        return self._block(x, self.final_layer_norm, self._ffn)


class TransformerDecoder(nn.Module):
    """Autoregressive transformer decoder over an encoder output (fairseq ``TransformerDecoder``).

    Args:
        vocab_size: output vocabulary size ``V`` (token ids ``0..V-1``; ids are embedded as they are, so the
            padding value of decoder inputs must be a valid id -- ESPnet pads them with ``eos``).
        encoder_dim: size of the encoder output (the cross-attention key/value input).
        cfg: hyper-parameters (a :class:`TransformerDecoderConfig` or a mapping of its fields).
        position_offset: added to positions ``0, 1, ...`` before the sinusoidal embedding (fairseq starts at
            ``padding_idx + 1 = 2``; use 2 for fairseq checkpoints).

    Raises:
        avsr.config.ConfigError: ``cfg`` is a mapping with an unknown key.
    """

    def __init__(
        self,
        vocab_size: int,
        encoder_dim: int,
        cfg: TransformerDecoderConfig | dict | None = None,
        position_offset: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(cfg, TransformerDecoderConfig):
            cfg = from_dict(TransformerDecoderConfig, cfg or {}, "decoder_conf")
        self.cfg = cfg
        d = cfg.decoder_embed_dim
        self.vocab_size = vocab_size
        self.position_offset = position_offset
        self.embed_scale = 1.0 if cfg.no_scale_embedding else math.sqrt(d)
        self.embed_tokens = nn.Embedding(vocab_size, d)
        nn.init.normal_(self.embed_tokens.weight, mean=0.0, std=d**-0.5)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(cfg, encoder_dim) for _ in range(cfg.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(d) if cfg.decoder_normalize_before else None
        self.output_projection = nn.Linear(d, vocab_size, bias=False)
        if cfg.share_decoder_input_output_embed:
            self.output_projection.weight = self.embed_tokens.weight
        else:
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=d**-0.5)

    def _embed(self, tokens: Tensor, start: int) -> Tensor:
        """Scaled token embedding plus positions ``start, start+1, ...``: ``(B, L)`` -> ``(B, L, D)``."""
        pos = torch.arange(start, start + tokens.size(1), device=tokens.device) + self.position_offset
        x = self.embed_scale * self.embed_tokens(tokens)
        return self.dropout(x + sinusoidal_positions(pos, x.size(-1)).to(x.dtype))

    def _output(self, x: Tensor) -> Tensor:
        """Final LayerNorm (pre-LN) and the output projection, the latter in float32 under any autocast:
        ``(..., D) -> (..., V)`` float32 logits (bfloat16 logits would be rounded to 1/256 of their size)."""
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        with fp32_context(x.device):
            return self.output_projection(x.float())

    def forward(self, tokens: Tensor, memory: Tensor, memory_mask: Tensor, memory_index: Tensor | None = None
                ) -> Tensor:
        """Teacher-forced pass.

        Args:
            tokens: ``(N, L)`` int64 decoder inputs (``sos`` first); positions after a sequence's end may hold
                any valid id -- self-attention is causal, so they never change earlier outputs.
            memory: ``(B, T, encoder_dim)`` encoder output (``B = N`` without ``memory_index``).
            memory_mask: ``(B, T)`` bool, True on valid frames (each row needs at least one).
            memory_index: ``(N,)`` int64, or None: row ``n`` of ``tokens`` reads utterance ``memory_index[n]``
                of the memory (several hypotheses of each utterance scored at once, as in
                :func:`avsr.decode.rescore.sequence_scores`); each utterance's keys and values are then
                projected once, not once per row.

        Returns:
            ``(N, L, V)`` float32 logits (unnormalised) of the next token at each position (float32 also
            under a bfloat16 autocast, which the layers run in).
        """
        mask = memory_mask[:, None, None, :]
        if memory_index is not None:
            mask = mask[memory_index]
        x = self._embed(tokens, 0)
        for layer in self.layers:
            if (
                self.training
                and self.cfg.decoder_layerdrop > 0
                and torch.rand(()) < self.cfg.decoder_layerdrop
            ):
                continue
            k, v = layer.encoder_attn.project_kv(memory)
            if memory_index is not None:
                k, v = k[memory_index], v[memory_index]
            x = layer(x, k, v, mask)
        return self._output(x)

    @torch.no_grad()
    def init_state(self, memory: Tensor, memory_mask: Tensor, group: int = 1) -> DecoderState:
        """Start incremental decoding: project the encoder output once per layer.

        Args:
            memory: ``(B, T, encoder_dim)`` encoder output.
            memory_mask: ``(B, T)`` bool, True on valid frames.
            group: hypotheses per utterance (the beam size); :meth:`step` then takes ``N = B * group`` rows.

        Returns:
            An empty :class:`DecoderState`.
        """
        cross = [layer.encoder_attn.project_kv(memory) for layer in self.layers]
        n, h = memory.size(0) * group, self.cfg.decoder_attention_heads
        shape = (n, h, INITIAL_CACHE_LENGTH, self.cfg.decoder_embed_dim // h)
        return DecoderState(
            self_k=[memory.new_empty(shape) for _ in self.layers],
            self_v=[memory.new_empty(shape) for _ in self.layers],
            cross_k=[k for k, _ in cross],
            cross_v=[v for _, v in cross],
            memory_mask=memory_mask[:, None, None, :],
            group=group,
        )

    @torch.no_grad()
    def step(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Feed one token per hypothesis and score the next one (no layerdrop, no gradient).

        Args:
            tokens: ``(N,)`` int64, the last token of each hypothesis (``sos`` at the first step).
            state: the cache after the previous tokens; it is updated in place and returned.

        Returns:
            ``(N, V)`` float32 log-probabilities of the next token, and the state.
        """
        x = self._embed(tokens[:, None], state.length)
        for i, layer in enumerate(self.layers):
            x = layer.step(x, state, i)
        state.length += 1
        return torch.log_softmax(self._output(x[:, 0]), dim=-1), state
