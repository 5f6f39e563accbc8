"""Transformer decoder: causality, cached incremental decoding == full forward, padding invariance, config."""

import pytest
import torch

from avsr.config import ConfigError
from avsr.nn.decoder import TransformerDecoder, TransformerDecoderConfig, sinusoidal_positions

V, ENC_DIM = 11, 12


def make_decoder(**kw) -> TransformerDecoder:
    torch.manual_seed(0)
    cfg = dict(
        decoder_layers=2,
        decoder_embed_dim=16,
        decoder_ffn_embed_dim=32,
        decoder_attention_heads=4,
        dropout=0.1,
        attention_dropout=0.1,
        activation_dropout=0.1,
    )
    cfg.update(kw)
    return TransformerDecoder(V, ENC_DIM, cfg).eval()


def full_mask(b: int, t: int) -> torch.Tensor:
    return torch.ones(b, t, dtype=torch.bool)


def test_future_tokens_do_not_change_past_outputs():
    dec = make_decoder()
    mem = torch.randn(2, 7, ENC_DIM)
    tok = torch.randint(0, V, (2, 6))
    out = dec(tok, mem, full_mask(2, 7))
    tok2 = tok.clone()
    tok2[:, 3:] = (tok2[:, 3:] + 1) % V
    out2 = dec(tok2, mem, full_mask(2, 7))
    torch.testing.assert_close(out[:, :3], out2[:, :3])
    assert not torch.allclose(out[:, 3:], out2[:, 3:])


@pytest.mark.parametrize("normalize_before", [True, False])
def test_rows_that_share_an_utterance_read_the_memory_as_each_row_alone(normalize_before):
    dec = make_decoder(decoder_normalize_before=normalize_before)
    b, group, t, length = 3, 4, 9, 5
    mem = torch.randn(b, t, ENC_DIM)
    mask = torch.arange(t)[None, :] < torch.tensor([9, 6, 2])[:, None]
    tok = torch.randint(0, V, (b * group, length))
    rows = dec(tok, mem.repeat_interleave(group, 0), mask.repeat_interleave(group, 0))
    index = torch.arange(b).repeat_interleave(group)
    torch.testing.assert_close(dec(tok, mem, mask, memory_index=index), rows, atol=1e-5, rtol=1e-5)
    flipped = dec(tok.flip(0), mem, mask, memory_index=index.flip(0))
    torch.testing.assert_close(flipped, rows.flip(0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalize_before", [True, False])
def test_incremental_decoding_equals_full_forward(normalize_before):
    dec = make_decoder(decoder_normalize_before=normalize_before)
    b, group, t, length = 2, 3, 9, 21  # > 16: the cache grows
    mem = torch.randn(b, t, ENC_DIM)
    mask = torch.arange(t)[None, :] < torch.tensor([9, 6])[:, None]
    tok = torch.randint(0, V, (b * group, length))
    mem_rows = mem.repeat_interleave(group, 0)
    mask_rows = mask.repeat_interleave(group, 0)
    full = torch.log_softmax(dec(tok, mem_rows, mask_rows), dim=-1)
    state = dec.init_state(mem, mask, group=group)
    for i in range(length):
        assert state.length == i
        logp, state = dec.step(tok[:, i], state)
        torch.testing.assert_close(logp, full[:, i], atol=1e-5, rtol=1e-5)
        state = state.select(torch.arange(b * group))  # identity reorder through the spare buffers


def test_reordered_cache_equals_full_forward_of_reordered_hypotheses():
    dec = make_decoder()
    b, group, t = 2, 3, 8
    mem = torch.randn(b, t, ENC_DIM)
    mask = full_mask(b, t)
    tok = torch.randint(0, V, (b * group, 4))
    state = dec.init_state(mem, mask, group=group)
    for i in range(3):
        _, state = dec.step(tok[:, i], state)
    # beam reordering within each utterance, then one more step
    rows = torch.tensor([2, 2, 0, 4, 3, 3])
    state = state.select(rows)
    logp, state = dec.step(tok[rows, 3], state)
    seq = torch.cat([tok[rows, :3], tok[rows, 3:4]], dim=1)
    full = torch.log_softmax(dec(seq, mem.repeat_interleave(group, 0), mask.repeat_interleave(group, 0)), -1)
    torch.testing.assert_close(logp, full[:, 3], atol=1e-5, rtol=1e-5)
    # dropping utterance 0 keeps utterance 1's rows consistent
    state1 = state.select(torch.tensor([3, 4, 5]), torch.tensor([1]))
    logp1, _ = dec.step(torch.tensor([1, 2, 3]), state1)
    full1 = torch.log_softmax(
        dec(
            torch.cat([seq[3:], torch.tensor([[1], [2], [3]])], 1),
            mem[1:].expand(3, -1, -1),
            mask[1:].expand(3, -1),
        ),
        -1,
    )
    torch.testing.assert_close(logp1, full1[:, 4], atol=1e-5, rtol=1e-5)


def test_padded_batch_equals_each_utterance_alone():
    dec = make_decoder()
    mem_lens, tok_lens = [5, 9], [6, 3]
    mems = [torch.randn(1, n, ENC_DIM) for n in mem_lens]
    toks = [torch.randint(0, V, (1, n)) for n in tok_lens]
    mem = torch.zeros(2, 9, ENC_DIM)
    tok = torch.full((2, 6), V - 1)
    for i in range(2):
        mem[i, : mem_lens[i]] = mems[i][0]
        mem[i, mem_lens[i] :] = 100.0  # garbage padding must not leak
        tok[i, : tok_lens[i]] = toks[i][0]
    mask = torch.arange(9)[None, :] < torch.tensor(mem_lens)[:, None]
    out = dec(tok, mem, mask)
    for i in range(2):
        alone = dec(toks[i], mems[i], full_mask(1, mem_lens[i]))
        torch.testing.assert_close(out[i, : tok_lens[i]], alone[0], atol=1e-5, rtol=1e-5)


def test_tied_embedding_and_scaling():
    dec = make_decoder(share_decoder_input_output_embed=True)
    assert dec.output_projection.weight is dec.embed_tokens.weight
    assert dec.embed_scale == pytest.approx(4.0)
    assert make_decoder(no_scale_embedding=True).embed_scale == 1.0
    names = set(dict(dec.named_parameters()))
    assert "layers.0.encoder_attn.k_proj.weight" in names and "layer_norm.weight" in names
    assert dec.layers[0].encoder_attn.k_proj.in_features == ENC_DIM


def test_sinusoidal_positions_layout():
    emb = sinusoidal_positions(torch.arange(4), 8)
    assert emb.shape == (4, 8)
    torch.testing.assert_close(emb[0], torch.tensor([0.0] * 4 + [1.0] * 4))
    torch.testing.assert_close(emb[2, 0], torch.sin(torch.tensor(2.0)))


def test_layerdrop_training_runs_and_unknown_key_is_named():
    dec = make_decoder(decoder_layerdrop=0.5).train()
    out = dec(torch.randint(0, V, (2, 4)), torch.randn(2, 5, ENC_DIM), full_mask(2, 5))
    assert out.shape == (2, 4, V)
    with pytest.raises(ConfigError, match="decoder_layer\\b|decoder_layer'"):
        TransformerDecoder(V, ENC_DIM, {"decoder_layer": 2})
    with pytest.raises(ValueError, match="divisible"):
        TransformerDecoderConfig(decoder_embed_dim=10, decoder_attention_heads=4)
