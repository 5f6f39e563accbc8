"""The transformer encoder of AV-HuBERT: convolutional positional embedding and pre-/post-LN layers.

Follows fairseq's wav2vec 2.0 ``TransformerEncoder`` and ``TransformerSentenceEncoderLayer``
(``fairseq/models/wav2vec/wav2vec2.py`` at the fairseq commit pinned by facebookresearch/av_hubert), which
AV-HuBERT uses unchanged (Baevski et al., 2020, Sec. 2; Shi et al., 2022, Sec. 3). Attribute names are
fairseq's so that state-dict keys map 1:1: ``pos_conv.0.weight_g``/``weight_v``/``bias``,
``layers.N.self_attn.{q,k,v,out}_proj``, ``layers.N.self_attn_layer_norm``, ``layers.N.fc1``/``fc2``,
``layers.N.final_layer_norm``, ``layer_norm``.

Tensors are batch-first here, ``(B, T, D)``; fairseq works time-first internally, which changes no result.
Attention is computed by :func:`torch.nn.functional.scaled_dot_product_attention`.

Activation checkpointing (fairseq's ``checkpoint_activations``, which wraps every encoder layer in
``checkpoint_wrapper``): :class:`TransformerEncoder` can keep only each layer's input in training and
recompute the layer in the backward pass (:func:`torch.utils.checkpoint.checkpoint`, non-reentrant, the RNG
state of dropout restored so the recomputation draws the same masks).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "ACTIVATIONS",
    "get_activation_fn",
    "WeightNormConv1d",
    "SamePad",
    "ConvPositionalEmbedding",
    "attention",
    "MultiheadSelfAttention",
    "TransformerEncoderLayer",
    "TransformerEncoder",
]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _linear(x: torch.Tensor) -> torch.Tensor:
    return x


# fairseq.utils.get_activation_fn names; "gelu" is the exact (erf) GELU, "gelu_accurate"/"gelu_fast"
# the tanh approximation.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_accurate": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "tanh": torch.tanh,
    "swish": F.silu,
    "linear": _linear,
}


def get_activation_fn(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation called ``name`` in fairseq (``activation_fn``).

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"activation_fn must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


class WeightNormConv1d(nn.Module):
    """Grouped 1-D convolution, weight-normalised over ``dim=2`` (the kernel axis) as fairseq's pos_conv.

    ``weight = weight_v * weight_g / ||weight_v||``, the norm taken over the output- and input-channel axes
    for each kernel tap, so ``weight_g`` has shape ``(1, 1, kernel_size)`` and ``weight_v`` shape
    ``(channels, channels // groups, kernel_size)`` -- the parameter names and shapes that
    ``torch.nn.utils.weight_norm(conv, name="weight", dim=2)`` produces in fairseq checkpoints.
    Padding is ``kernel_size // 2`` on both sides (so an even kernel yields one extra frame; see
    :class:`SamePad`).

    Initialisation (fairseq): ``v ~ N(0, sqrt(4 / (kernel_size * channels)))``, ``g = ||v||``, bias 0.

    Input ``(B, channels, T)``; output ``(B, channels, T + 1 - kernel_size % 2)``.
    """

    def __init__(self, channels: int, kernel_size: int, groups: int) -> None:
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"conv_pos must be >= 1, got {kernel_size}")
        if groups < 1 or channels % groups:
            raise ValueError(f"conv_pos_groups ({groups}) must divide encoder_embed_dim ({channels})")
        self.kernel_size = kernel_size
        self.groups = groups
        v = torch.empty(channels, channels // groups, kernel_size)
        nn.init.normal_(v, mean=0.0, std=math.sqrt(4.0 / (kernel_size * channels)))
        self.weight_g = nn.Parameter(v.norm(dim=(0, 1), keepdim=True))
        self.weight_v = nn.Parameter(v)
        self.bias = nn.Parameter(torch.zeros(channels))

    @property
    def weight(self) -> torch.Tensor:
        """The effective (normalised) weight ``(channels, channels // groups, kernel_size)``."""
        return self.weight_v * (self.weight_g / self.weight_v.norm(dim=(0, 1), keepdim=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, T) -> (B, C, T + 1 - kernel_size % 2)``."""
        return F.conv1d(x, self.weight, self.bias, padding=self.kernel_size // 2, groups=self.groups)


class SamePad(nn.Module):
    """Drop the last frame when the kernel is even, so that a ``kernel_size // 2``-padded conv keeps length T.

    fairseq ``SamePad`` (non-causal). Input/output ``(B, C, T')`` -> ``(B, C, T)``.
    """

    def __init__(self, kernel_size: int) -> None:
        super().__init__()
        self.remove = 1 if kernel_size % 2 == 0 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, T') -> (B, C, T' - remove)``."""
        return x[:, :, : x.shape[2] - self.remove]


class ConvPositionalEmbedding(nn.Sequential):
    """Convolutional relative positional embedding of wav2vec 2.0: WeightNormConv1d -> SamePad -> GELU.

    A ``Sequential`` so that its parameters are named ``0.weight_g``, ``0.weight_v``, ``0.bias`` as fairseq's
    ``pos_conv``. ``forward`` takes and returns batch-first ``(B, T, D)`` float; the caller adds the result
    to its input (``x + pos_conv(x)``). Padded frames must be zeroed by the caller beforehand (as fairseq
    does), so that a padded utterance gets the same embedding on its valid frames as alone.
    """

    def __init__(self, embed_dim: int, kernel_size: int = 128, groups: int = 16) -> None:
        super().__init__(WeightNormConv1d(embed_dim, kernel_size, groups), SamePad(kernel_size), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """``(B, T, D) -> (B, T, D)``."""
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False) -> torch.Tensor:
    """:func:`torch.nn.functional.scaled_dot_product_attention` (scale ``head_dim ** -0.5``), with one
    precision rule: on CPU, bfloat16 inputs that will be differentiated are attended in float32.

    PyTorch's CPU kernel for the backward pass of bfloat16 attention is 3-5x slower than the float32 one
    (torch 2.14; while its forward is faster), so under a bfloat16 autocast the training step computes
    attention in float32 -- more exact and faster; the output is cast back to the inputs' dtype. In
    inference and on GPUs the inputs' dtype is kept.

    Args:
        q, k, v: ``(B, H, L, Dh)``, ``(B, H, S, Dh)``, ``(B, H, S, Dh)`` float.
        attn_mask: bool ``(B, 1, 1|L, S)``, True where attending is allowed, or None.
        dropout_p: dropout on the attention weights.
        is_causal: causal mask (``L == S``).

    Returns:
        ``(B, H, L, Dh)`` in ``q``'s dtype.
    """
    if (q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.is_grad_enabled()
            and (q.requires_grad or k.requires_grad or v.requires_grad)):
        with torch.autocast("cpu", enabled=False):
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask,
                                                 dropout_p=dropout_p, is_causal=is_causal)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal)


class MultiheadSelfAttention(nn.Module):
    """Multi-head self-attention with separate q/k/v/out projections (fairseq ``MultiheadAttention`` names).

    Scaled dot-product attention with scale ``head_dim ** -0.5``, dropout ``attention_dropout`` on the
    attention probabilities in training, and a key padding mask; computed by
    :func:`torch.nn.functional.scaled_dot_product_attention`.

    Args:
        embed_dim: D.
        num_heads: H; must divide D.
        attention_dropout: dropout probability on attention weights (training only).
    """

    def __init__(self, embed_dim: int, num_heads: int, attention_dropout: float = 0.0) -> None:
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(
                f"encoder_attention_heads ({num_heads}) must divide encoder_embed_dim ({embed_dim})"
            )
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.attention_dropout = attention_dropout
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Self-attention over time.

        Args:
            x: ``(B, T, D)`` float.
            attn_mask: ``(B, 1, 1, T)`` bool, True where the key is a real frame (may attend), False at
                padding; None when nothing is padded.

        Returns:
            ``(B, T, D)`` float.
        """
        b, t, d = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        p = self.attention_dropout if self.training else 0.0
        y = attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))


class TransformerEncoderLayer(nn.Module):
    """One wav2vec 2.0 / AV-HuBERT transformer layer (fairseq ``TransformerSentenceEncoderLayer``).

    Post-LN (``layer_norm_first=False``)::

        x = self_attn_layer_norm(x + dropout1(self_attn(x)))
        x = final_layer_norm(x + dropout3(fc2(dropout2(act(fc1(x))))))

    Pre-LN (``layer_norm_first=True``)::

        x = x + dropout1(self_attn(self_attn_layer_norm(x)))
        x = x + dropout3(fc2(dropout2(act(fc1(final_layer_norm(x))))))

    ``dropout1``/``dropout3`` use ``dropout``, ``dropout2`` uses ``activation_dropout``. Input and output
    ``(B, T, D)`` float.
    """

    def __init__(
        self,
        embed_dim: int = 768,
        ffn_embed_dim: int = 3072,
        num_heads: int = 12,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.0,
        activation_fn: str = "gelu",
        layer_norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.layer_norm_first = layer_norm_first
        self.activation_fn = get_activation_fn(activation_fn)
        self.self_attn = MultiheadSelfAttention(embed_dim, num_heads, attention_dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(activation_dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_embed_dim)
        self.fc2 = nn.Linear(ffn_embed_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout3(self.fc2(self.dropout2(self.activation_fn(self.fc1(x)))))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T, D) -> (B, T, D)``; ``attn_mask`` as in :meth:`MultiheadSelfAttention.forward`."""
        if self.layer_norm_first:
            x = x + self.dropout1(self.self_attn(self.self_attn_layer_norm(x), attn_mask))
            return x + self._ffn(self.final_layer_norm(x))
        x = self.self_attn_layer_norm(x + self.dropout1(self.self_attn(x, attn_mask)))
        return self.final_layer_norm(x + self._ffn(x))


class TransformerEncoder(nn.Module):
    """wav2vec 2.0 transformer encoder as used by AV-HuBERT (fairseq ``TransformerEncoder``).

    Order of operations (fairseq ``extract_features``): zero the padded frames; ``x = x + pos_conv(x)``;
    post-LN only: ``x = layer_norm(x)``; dropout ``dropout``; the layers (each skipped with probability
    ``layerdrop`` in training); pre-LN only: a final ``layer_norm``.

    Initialisation as fairseq's ``init_bert_params``: every Linear weight ~ N(0, 0.02) and bias 0; LayerNorm
    weight 1, bias 0; pos_conv as in :class:`WeightNormConv1d`.

    Args:
        embed_dim, ffn_embed_dim, num_layers, num_heads: ``encoder_embed_dim``, ``encoder_ffn_embed_dim``,
            ``encoder_layers``, ``encoder_attention_heads``.
        dropout, attention_dropout, activation_dropout, layerdrop: fairseq's ``dropout``,
            ``attention_dropout``, ``activation_dropout``, ``encoder_layerdrop`` (probabilities).
        conv_pos, conv_pos_groups: kernel size and groups of the positional convolution.
        activation_fn: see :data:`ACTIVATIONS`.
        layer_norm_first: pre-LN (True) or post-LN (False) layers.
        checkpoint_activations: in training with gradients, store only each layer's input and recompute the
            layer during the backward pass (less memory, about one more forward pass of the layers in time;
            same values and gradients). Attribute of the same name.
    """

    def __init__(
        self,
        embed_dim: int = 768,
        ffn_embed_dim: int = 3072,
        num_layers: int = 12,
        num_heads: int = 12,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.0,
        layerdrop: float = 0.0,
        conv_pos: int = 128,
        conv_pos_groups: int = 16,
        activation_fn: str = "gelu",
        layer_norm_first: bool = False,
        checkpoint_activations: bool = False,
    ) -> None:
        super().__init__()
        self.checkpoint_activations = checkpoint_activations
        self.embedding_dim = embed_dim
        self.dropout = dropout
        self.layerdrop = layerdrop
        self.layer_norm_first = layer_norm_first
        self.pos_conv = ConvPositionalEmbedding(embed_dim, conv_pos, conv_pos_groups)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(embed_dim, ffn_embed_dim, num_heads, dropout, attention_dropout,
                                    activation_dropout, activation_fn, layer_norm_first)
            for _ in range(num_layers)
        )
        self.layer_norm = nn.LayerNorm(embed_dim)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                nn.init.zeros_(m.bias)

    def _run(self, x: torch.Tensor, padding_mask: torch.Tensor | None, num_layers: int,
             collect: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        attn_mask = None
        if padding_mask is not None:
            x = x.masked_fill(padding_mask.unsqueeze(-1), 0.0)
            attn_mask = ~padding_mask[:, None, None, :]
        x = x + self.pos_conv(x)
        if not self.layer_norm_first:
            x = self.layer_norm(x)
        x = F.dropout(x, p=self.dropout, training=self.training)
        layerdrop = self.training and self.layerdrop > 0
        drop = torch.rand(num_layers) < self.layerdrop if layerdrop else None
        compiling = torch.compiler.is_compiling()
        if drop is not None and not compiling:
            drop = drop.tolist()  # one host sync; skipped layers then cost nothing
        outputs: list[torch.Tensor] = []
        recompute = self.checkpoint_activations and self.training and torch.is_grad_enabled()

        def run(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
            if recompute:
                return checkpoint(layer, x, attn_mask, use_reentrant=False)
            return layer(x, attn_mask)

        for i, layer in enumerate(self.layers[:num_layers]):
            if drop is None:
                x = run(layer, x)
            elif compiling:  # branch-free under torch.compile: same values, no graph break
                x = torch.where(drop[i].to(x.device), x, run(layer, x))
            elif not drop[i]:
                x = run(layer, x)
            if collect:
                outputs.append(x)
        return x, outputs

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a batch.

        Args:
            x: ``(B, T, D)`` float.
            padding_mask: ``(B, T)`` bool, True at padded frames; None if nothing is padded. Every row needs
                at least one real frame.

        Returns:
            ``(B, T, D)`` float: the last layer's output (after the final LayerNorm when pre-LN). Values at
            padded frames are not meaningful.
        """
        x, _ = self._run(x, padding_mask, len(self.layers), collect=False)
        if self.layer_norm_first:
            x = self.layer_norm(x)
        return x

    def layer_outputs(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None,
                      num_layers: int | None = None) -> list[torch.Tensor]:
        """Outputs of layers 1..``num_layers`` (all by default), each ``(B, T, D)``.

        Element ``i - 1`` is what fairseq returns for ``layer=i-1`` (AV-HuBERT ``output_layer=i``): the
        output of layer i, without the final LayerNorm. Only the first ``num_layers`` layers are run. With
        layerdrop in training, a skipped layer's entry repeats its input, so the list always has
        ``num_layers`` entries.

        Raises:
            ValueError: ``num_layers`` outside ``1..encoder_layers``.
        """
        n = len(self.layers) if num_layers is None else num_layers
        if not 1 <= n <= len(self.layers):
            raise ValueError(
                f"num_layers must be in 1..{len(self.layers)} (encoder_layers), got {num_layers}"
            )
        return self._run(x, padding_mask, n, collect=True)[1]
