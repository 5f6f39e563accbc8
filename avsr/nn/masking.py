"""Span masking for masked cluster prediction (HuBERT / AV-HuBERT pretraining).

Two steps, as in AV-HuBERT's ``AVHubertModel.apply_input_mask`` (``avhubert/hubert.py``):

1. :func:`compute_span_mask` chooses which frames to mask: random span starts, each span ``mask_length``
   frames long, spans may overlap, never reaching into padding (AV-HuBERT's ``compute_mask_indices`` in
   ``avhubert/utils.py``, the wav2vec 2.0 / fairseq ``data_utils.compute_mask_indices`` with
   ``mask_type="static"`` and ``no_overlap=False``).
2. :func:`apply_input_mask` replaces the masked frames of an input: by other frames of the same utterance
   (``same_seq``), by the same frames of another utterance of the batch (``same_other_seq``), by zeros
   (``zero``) or by a learned vector (``mask_emb``; AV-HuBERT's treatment of audio and of feature masking).

Everything is batched on tensors (no loop over utterances or spans), runs on the device of its inputs and
draws its random numbers from an optional :class:`torch.Generator` (on that device), so results are
reproducible.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["SELECTION_TYPES", "compute_span_mask", "apply_input_mask", "span_bounds"]

#: ways of filling masked frames (see :func:`apply_input_mask`); the first two are AV-HuBERT's
#: ``selection_type`` values.
SELECTION_TYPES = ("same_seq", "same_other_seq", "zero", "mask_emb")


def _ranks(scores: torch.Tensor) -> torch.Tensor:
    """Rank (0 = smallest) of every entry of ``scores`` ``(B, T)`` within its row."""
    return scores.argsort(dim=1).argsort(dim=1)


def compute_span_mask(
    shape: tuple[int, int],
    padding_mask: torch.Tensor | None,
    mask_prob: float,
    mask_length: int,
    min_masks: int = 0,
    generator: torch.Generator | None = None,
    *,
    require_same_masks: bool = False,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Random span mask over ``(B, T)`` frames, fairseq/AV-HuBERT ``compute_mask_indices`` semantics.

    For each utterance ``b`` with ``n_b`` valid frames (``T`` minus its padding; padding is assumed to be at
    the end, as fairseq assumes):

    * number of spans ``k_b = max(min_masks, int(mask_prob * n_b / mask_length + u_b))``, ``u_b ~ U[0, 1)``
      (probabilistic rounding);
    * ``k_b`` distinct start frames drawn uniformly without replacement from ``[0, n_b - mask_length)``
      -- or from ``[0, k_b + 1)`` when that range holds ``k_b`` or fewer starts (fairseq's rule for short
      utterances); starts are also limited to ``[0, T)``;
    * frames ``start .. start + mask_length - 1`` of every span are masked; spans may overlap, so the masked
      fraction is below ``mask_prob`` (about ``1 - exp(-mask_prob)`` for long utterances); frames at or
      after ``n_b`` are never masked.

    With ``require_same_masks`` every utterance keeps only a random subset of its masked frames, as many as
    the utterance with the fewest -- what AV-HuBERT's ``compute_mask_indices`` always does (and fairseq's
    does with ``require_same_masks=True``); the kept frames no longer form whole spans.

    Args:
        shape: ``(B, T)``.
        padding_mask: ``(B, T)`` bool, True at padded frames, or None (no padding).
        mask_prob: in ``[0, 1]``; 0 gives no mask at all (``min_masks`` is then ignored).
        mask_length: span length in frames, ``>= 1``.
        min_masks: minimum number of spans per utterance (AV-HuBERT passes 2).
        generator: random source (on ``device``); the global RNG when None.
        require_same_masks: equalise the number of masked frames across the batch (see above).
        device: where to compute; defaults to ``padding_mask``'s device, else the generator's, else CPU.

    Returns:
        ``(B, T)`` bool, True at masked frames.

    Raises:
        ValueError: ``mask_prob`` outside ``[0, 1]``, ``mask_length < 1``, ``min_masks < 0``, or a
            ``padding_mask`` not of shape ``(B, T)``.
    """
    b, t = int(shape[0]), int(shape[1])
    device = _span_mask_device(b, t, padding_mask, mask_prob, mask_length, min_masks, generator, device)
    if mask_prob == 0.0 or b == 0 or t == 0:
        return torch.zeros(b, t, dtype=torch.bool, device=device)
    if padding_mask is None:
        n_valid = torch.full((b,), t, device=device, dtype=torch.long)
    else:
        n_valid = t - padding_mask.long().sum(1)
    starts = _span_starts(n_valid, t, mask_prob, mask_length, min_masks, generator)
    mask = _spans_to_mask(starts, n_valid, mask_length)
    if require_same_masks and b > 1:
        mask = _equalise_masks(mask, generator)
    return mask


def _span_mask_device(
    b: int,
    t: int,
    padding_mask: torch.Tensor | None,
    mask_prob: float,
    mask_length: int,
    min_masks: int,
    generator: torch.Generator | None,
    device: torch.device | str | None,
) -> torch.device | str:
    """Check the arguments of :func:`compute_span_mask` and return the device to compute on:
    ``padding_mask``'s, else ``device``, else the generator's, else CPU.

    Raises:
        ValueError: as :func:`compute_span_mask` says.
    """
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"mask_prob must lie in [0, 1], got {mask_prob}")
    if mask_length < 1:
        raise ValueError(f"mask_length must be >= 1, got {mask_length}")
    if min_masks < 0:
        raise ValueError(f"min_masks must be >= 0, got {min_masks}")
    if padding_mask is not None:
        if tuple(padding_mask.shape) != (b, t):
            raise ValueError(f"padding_mask must have shape {(b, t)}, got {tuple(padding_mask.shape)}")
        return padding_mask.device
    if device is None:
        return generator.device if generator is not None else torch.device("cpu")
    return device


def _span_starts(
    n_valid: torch.Tensor,
    t: int,
    mask_prob: float,
    mask_length: int,
    min_masks: int,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The span starts of :func:`compute_span_mask`: ``(B, T)`` bool, ``k_b`` distinct random starts per
    row (``n_valid``: ``(B,)`` int64 valid frames). Draws ``(B,)`` float64 (the number of spans), then
    ``(B, T)`` float32 (the starts) from ``generator``."""
    b, device = n_valid.shape[0], n_valid.device
    frames = torch.arange(t, device=device)
    u = torch.rand(b, device=device, generator=generator, dtype=torch.float64)
    num_spans = (mask_prob * n_valid.double() / mask_length + u).long().clamp(min=min_masks)
    # fairseq: starts in [0, n - mask_length), or in [0, num_spans + 1) when that range is too small
    start_range = n_valid - mask_length
    start_range = torch.where(start_range <= num_spans, num_spans + 1, start_range)
    scores = torch.rand(b, t, device=device, generator=generator)
    scores = scores.masked_fill(frames[None, :] >= start_range[:, None], 2.0)  # never chosen first
    num_spans = torch.minimum(num_spans, start_range.clamp(max=t))
    return _ranks(scores) < num_spans[:, None]


def _spans_to_mask(starts: torch.Tensor, n_valid: torch.Tensor, mask_length: int) -> torch.Tensor:
    """``(B, T)`` bool mask of the spans of ``mask_length`` frames beginning at ``starts`` ``(B, T)`` bool,
    False at or after ``n_valid`` ``(B,)``: frame ``f`` is masked when a span starts in
    ``(f - mask_length, f]``."""
    t = starts.shape[1]
    frames = torch.arange(t, device=starts.device)
    cum = starts.long().cumsum(1)
    before = F.pad(cum, (mask_length, 0))[:, :t]
    return (cum - before > 0) & (frames[None, :] < n_valid[:, None])


def _equalise_masks(mask: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``require_same_masks``: ``mask`` ``(B, T)`` bool with each row keeping a random subset (one
    ``(B, T)`` float32 draw) of its masked frames, as many as the row with the fewest."""
    b, t = mask.shape
    target = mask.sum(1).min()
    keep_scores = torch.rand(b, t, device=mask.device, generator=generator).masked_fill(~mask, 2.0)
    return mask & (_ranks(keep_scores) < target)


def span_bounds(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First frame and end (exclusive) of the run of consecutive masked frames each frame belongs to.

    Args:
        mask: ``(B, T)`` bool.

    Returns:
        ``(start, end)``, both ``(B, T)`` int64; meaningful only where ``mask`` is True (elsewhere
        ``start`` is the previous run's start or -1, and ``end`` the next run's end or ``T + 1``).
    """
    b, t = mask.shape
    frames = torch.arange(t, device=mask.device).expand(b, t)
    prev = F.pad(mask[:, :-1], (1, 0))
    nxt = F.pad(mask[:, 1:], (0, 1))
    start = torch.where(mask & ~prev, frames, -1).cummax(1).values
    end_at = torch.where(mask & ~nxt, frames + 1, t + 1)
    end = end_at.flip(1).cummin(1).values.flip(1)
    return start, end


def _same_seq_source(
    mask: torch.Tensor, lengths: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Source frame index ``(B, T)`` for ``same_seq``: each masked run copies a run of the same length that
    starts anywhere in the utterance except in ``[start - len, end)`` (so source and target do not
    overlap), clipped to the last valid frame. A run with no such start copies from frame 0 on."""
    b, t = mask.shape
    frames = torch.arange(t, device=mask.device).expand(b, t)
    start, end = span_bounds(mask)
    start, end = start.clamp(min=0), end.clamp(max=t)
    run_len = end - start
    lo = (start - run_len).clamp(min=0)  # candidate starts: [0, lo) and [end, n)
    n = lengths[:, None]
    n_cand = lo + (n - end).clamp(min=0)
    u = torch.rand(b, t, device=mask.device, generator=generator, dtype=torch.float64)
    u = u.gather(1, start)  # one draw per run (read at the run's first frame)
    k = torch.minimum((u * n_cand).long(), (n_cand - 1).clamp(min=0))
    src_start = torch.where(n_cand == 0, 0, torch.where(k < lo, k, end + (k - lo)))
    return torch.minimum(src_start + (frames - start), (n - 1).clamp(min=0))


def apply_input_mask(
    x: torch.Tensor,
    mask: torch.Tensor,
    selection_type: str,
    generator: torch.Generator | None = None,
    *,
    time_dim: int = 1,
    lengths: torch.Tensor | None = None,
    mask_emb: torch.Tensor | None = None,
) -> torch.Tensor:
    """Replace the masked frames of ``x`` (AV-HuBERT ``apply_input_mask``); returns a new tensor.

    Selection types (AV-HuBERT ``selection_type``, plus the two fills the original uses elsewhere):

    * ``same_seq``: each run of consecutive masked frames is overwritten by a run of the same length from
      the same utterance, starting at a random frame outside ``[start - len, end)`` so that it does not
      overlap the run; source frames past the end are clipped to the last frame. Unlike the original, the
      source is drawn from the utterance's valid frames (``lengths``), not from the padded length, so
      padding is never copied in. Runs are those of the final mask (after any equalisation).
    * ``same_other_seq``: masked frames take the same frames of another utterance, utterance ``b`` reading
      from ``(b + s) % B`` for one random shift ``s`` in ``[1, B)`` (as the original; frames past that
      utterance's end are copied as they are). Needs ``B >= 2``.
    * ``zero``: zeros (the original's fill for every type when ``B == 1``).
    * ``mask_emb``: the vector ``mask_emb`` (the original's fill for audio input, and for feature masking).

    Gradients flow to ``x`` (unmasked frames and copied sources) and to ``mask_emb``.

    Args:
        x: ``(B, ..., T, ...)`` float with time at ``time_dim``; e.g. audio features ``(B, F, T)`` or video
            ``(B, 1, T, H, W)`` with ``time_dim=2`` (the encoder's layouts), or features ``(B, T, D)``.
        mask: ``(B, T)`` bool, True at frames to replace.
        selection_type: one of :data:`SELECTION_TYPES`.
        generator: random source on ``x``'s device (global RNG when None).
        time_dim: the time axis of ``x`` (not 0).
        lengths: ``(B,)`` valid frames per utterance for ``same_seq`` (all ``T`` when None).
        mask_emb: for ``mask_emb``: a tensor of the shape of one frame (``x`` with the batch and time axes
            removed, e.g. ``(F,)`` for audio), broadcastable.

    Returns:
        Tensor like ``x``.

    Raises:
        ValueError: unknown ``selection_type``; ``mask`` not ``(B, T)``; ``same_other_seq`` with ``B < 2``;
            ``mask_emb`` missing for ``mask_emb``.
    """
    if selection_type not in SELECTION_TYPES:
        raise ValueError(f"selection_type must be one of {SELECTION_TYPES}, got {selection_type!r}")
    if time_dim % x.dim() == 0:
        raise ValueError("time_dim must not be the batch axis 0")
    xt = x.movedim(time_dim, 1)  # (B, T, ...)
    b, t = xt.shape[:2]
    if tuple(mask.shape) != (b, t):
        raise ValueError(f"mask must have shape (B, T) = {(b, t)}, got {tuple(mask.shape)}")
    mask = mask.to(x.device)
    bcast = mask.reshape(b, t, *([1] * (xt.dim() - 2)))
    if selection_type == "zero":
        out = xt.masked_fill(bcast, 0.0)
    elif selection_type == "mask_emb":
        if mask_emb is None:
            raise ValueError("selection_type 'mask_emb' needs the mask_emb argument")
        out = torch.where(bcast, mask_emb.to(xt.dtype), xt)
    else:
        if selection_type == "same_other_seq":
            if b < 2:
                raise ValueError("selection_type 'same_other_seq' needs a batch of at least 2 utterances")
            shift = torch.randint(1, b, (1,), device=x.device, generator=generator)
            src_b = ((torch.arange(b, device=x.device) + shift) % b)[:, None].expand(b, t)
            src_t = torch.arange(t, device=x.device).expand(b, t)
        else:
            n = lengths.to(x.device, torch.long) if lengths is not None else torch.full(
                (b,), t, device=x.device, dtype=torch.long)
            src_b = torch.arange(b, device=x.device)[:, None].expand(b, t)
            src_t = _same_seq_source(mask, n, generator)
        out = xt.clone()
        out[mask] = xt[src_b[mask], src_t[mask]]
    return out.movedim(1, time_dim)
