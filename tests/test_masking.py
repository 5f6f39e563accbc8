"""Span masks and input masking (AV-HuBERT apply_input_mask / compute_mask_indices)."""

import math

import pytest
import torch

from avsr.nn.masking import apply_input_mask, compute_span_mask, span_bounds


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _padding(lengths: list[int], t: int) -> torch.Tensor:
    return torch.arange(t)[None, :] >= torch.tensor(lengths)[:, None]


def _expected_rate(n: int, p: float, length: int) -> float:
    """Exact expected masked fraction of a row of n frames (no min_masks): k spans with distinct starts
    drawn from [0, n - length), k = floor(p n / length + U)."""
    x = p * n / length
    lo = math.floor(x)
    total = 0.0
    for k, pk in ((lo, 1 - (x - lo)), (lo + 1, x - lo)):
        r = n - length if n - length > k else k + 1
        k = min(k, r)
        covered = 0.0
        for f in range(n):
            w = len(range(max(0, f - length + 1), min(f, r - 1) + 1))  # starts in the window
            covered += 1 - math.comb(r - w, k) / math.comb(r, k)
        total += pk * covered / n
    return total


@pytest.mark.parametrize("p,length", [(0.3, 1), (0.8, 10), (0.3, 5)])
def test_mask_rate_matches_expectation(p, length):
    n, rows = 200, 400
    mask = compute_span_mask((rows, n), None, p, length, 0, _gen())
    rate = mask.float().mean().item()
    assert rate == pytest.approx(_expected_rate(n, p, length), abs=0.01)
    if length == 1:  # no overlaps: the rate is mask_prob itself
        assert rate == pytest.approx(p, abs=0.01)


def test_spans_have_mask_length_and_start_counts():
    # isolated spans (low rate) are exactly mask_length frames long
    mask = compute_span_mask((300, 100), None, 0.05, 7, 0, _gen(1))
    start, end = span_bounds(mask)
    first = mask & (torch.arange(100)[None, :] == start)
    run_lengths = (end - start)[first]
    assert run_lengths.numel() > 100
    assert (run_lengths % 7 == 0).float().mean() > 0.9  # only merged overlapping spans are not 7 long
    assert run_lengths.min() >= 7
    # starts: int(p * n / L + U) per row, so each row masks at least floor(...) * L frames when spans do not
    # overlap; with min_masks=2 every row has at least 2 spans' worth of starts
    mask = compute_span_mask((50, 100), None, 0.0001, 3, 2, _gen(2))
    assert (mask.sum(1) >= 3).all() and (mask.sum(1) <= 6).all()


def test_never_masks_padding_and_short_utterances():
    lengths = [40, 25, 12, 3, 1]
    pad = _padding(lengths, 40)
    for seed in range(20):
        mask = compute_span_mask((5, 40), pad, 0.8, 10, 2, _gen(seed))
        assert not (mask & pad).any()
        assert (mask[:4].sum(1) >= 1).all()  # min_masks=2 gives short utterances a mask too


def test_require_same_masks_equalises_counts():
    pad = _padding([50, 30, 20], 50)
    mask = compute_span_mask((3, 50), pad, 0.6, 5, 2, _gen(3), require_same_masks=True)
    counts = mask.sum(1)
    assert (counts == counts[0]).all() and counts[0] > 0
    assert not (mask & pad).any()


def test_deterministic_with_generator_and_arguments_checked():
    pad = _padding([30, 17], 30)
    a = compute_span_mask((2, 30), pad, 0.5, 4, 2, _gen(7))
    b = compute_span_mask((2, 30), pad, 0.5, 4, 2, _gen(7))
    c = compute_span_mask((2, 30), pad, 0.5, 4, 2, _gen(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not compute_span_mask((2, 30), pad, 0.0, 4, 2, _gen()).any()
    with pytest.raises(ValueError, match="mask_prob"):
        compute_span_mask((2, 30), None, 1.5, 4)
    with pytest.raises(ValueError, match="mask_length"):
        compute_span_mask((2, 30), None, 0.5, 0)
    with pytest.raises(ValueError, match="padding_mask"):
        compute_span_mask((2, 30), pad[:, :5], 0.5, 4)


def test_span_bounds():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 1, 1, 1]], dtype=torch.bool)
    start, end = span_bounds(mask)
    assert start[mask].tolist() == [1, 1, 4, 6, 6, 6]
    assert end[mask].tolist() == [3, 3, 5, 9, 9, 9]


def test_same_seq_copies_other_non_overlapping_frames_of_the_same_utterance():
    b, t, f = 4, 60, 3
    lengths = torch.tensor([60, 45, 30, 20])
    # frame value encodes (utterance, frame) so the source of every copied frame is recoverable
    x = (torch.arange(b)[:, None, None] * 1000 + torch.arange(t)[None, None, :]).float().expand(b, f, t)
    for seed in range(5):
        mask = compute_span_mask((b, t), _padding(lengths.tolist(), t), 0.5, 5, 2, _gen(seed))
        out = apply_input_mask(x, mask, "same_seq", _gen(seed + 100), time_dim=2, lengths=lengths)
        assert out.shape == x.shape
        assert torch.equal(out[~mask[:, None, :].expand_as(x)], x[~mask[:, None, :].expand_as(x)])
        assert (out == out[:, :1, :]).all()  # a whole frame (all channels) is copied
        src = out[:, 0, :].long()
        start, end = span_bounds(mask)
        for i in range(b):
            frames = mask[i].nonzero()[:, 0]
            assert (src[i, frames] // 1000 == i).all()  # same utterance
            src_t = src[i, frames] % 1000
            assert (src_t < lengths[i]).all()  # never from padding
            for f0 in frames[start[i, frames] == frames]:  # each run
                s, e = int(start[i, f0]), int(end[i, f0])
                run_src = src_t[(frames >= s) & (frames < e)]
                first, n = int(run_src[0]), e - s
                # a contiguous run, clipped at the last valid frame, starting outside [s - n, e)
                assert run_src.tolist() == [min(first + k, int(lengths[i]) - 1) for k in range(n)]
                assert first < max(0, s - n) or first >= e


def test_same_other_seq_zero_and_mask_emb():
    b, t = 3, 20
    x = torch.randn(b, 1, t, 4, 4)
    mask = compute_span_mask((b, t), None, 0.5, 3, 2, _gen(4))
    out = apply_input_mask(x, mask, "same_other_seq", _gen(5), time_dim=2)
    m = mask[:, None, :, None, None].expand_as(x)
    assert torch.equal(out[~m], x[~m])
    shifts = set()
    for i in range(b):
        frames = mask[i].nonzero()[:, 0]
        match = [j for j in range(b) if j != i and torch.equal(out[i, :, frames], x[j, :, frames])]
        assert match  # the same frames of another utterance
        shifts.add((match[0] - i) % b)
    assert len(shifts) == 1  # one shift for the whole batch
    zero = apply_input_mask(x, mask, "zero", time_dim=2)
    assert (zero[m] == 0).all() and torch.equal(zero[~m], x[~m])
    audio = torch.randn(b, 6, t)
    emb = torch.randn(6, requires_grad=True)
    filled = apply_input_mask(audio, mask, "mask_emb", time_dim=2, mask_emb=emb)
    assert torch.equal(filled.transpose(1, 2)[mask], emb.detach().expand(int(mask.sum()), 6))
    filled.sum().backward()
    assert torch.equal(emb.grad, torch.full((6,), float(mask.sum())))


def test_apply_input_mask_errors():
    x = torch.randn(1, 5, 8)
    mask = torch.zeros(1, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="selection_type"):
        apply_input_mask(x, mask, "other_seq")
    with pytest.raises(ValueError, match="at least 2"):
        apply_input_mask(x, mask, "same_other_seq")
    with pytest.raises(ValueError, match="mask_emb"):
        apply_input_mask(x, mask, "mask_emb")
    with pytest.raises(ValueError, match="mask must have shape"):
        apply_input_mask(x, mask, "zero", time_dim=2)
