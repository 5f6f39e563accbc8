"""CTC prefix scoring, batched joint CTC/attention beam search, greedy CTC, and the AVSRModel around them."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from avsr.config import ConfigError
from avsr.decode import (
    CTCPrefixScorer,
    DecodeConfig,
    FairseqConfig,
    batch_beam_search,
    ctc_expected_label_count,
    ctc_greedy_decode,
    load_decode_config,
)
from avsr.decode.searcher import Searcher
from avsr.models import AVSRModel, label_smoothing_loss
from avsr.models.config import ModelConfig
from avsr.nn.decoder import TransformerDecoder
from tests.decoding import decode

BLANK = 0


pytestmark = pytest.mark.usefixtures("one_thread")


def collapse(path):
    out, prev = [], None
    for s in path:
        if s != prev and s != BLANK:
            out.append(s)
        prev = s
    return out


def brute_force(logp: torch.Tensor, length: int):
    """(prefix probability, full probability) functions by enumerating every CTC path of one utterance."""
    v = logp.size(-1)
    prob = logp[:length].double().exp()
    prefix, full = {}, {}
    for path in itertools.product(range(v), repeat=length):
        p = float(prob[torch.arange(length), torch.tensor(path)].prod())
        y = tuple(collapse(path))
        full[y] = full.get(y, 0.0) + p
        for n in range(len(y) + 1):
            prefix[y[:n]] = prefix.get(y[:n], 0.0) + p
    return (lambda h: prefix.get(tuple(h), 0.0)), (lambda h: full.get(tuple(h), 0.0))


@pytest.mark.parametrize("partial", [False, True])
def test_ctc_prefix_scores_match_enumeration_of_alignments(partial):
    torch.manual_seed(1)
    b, t, v, group = 2, 5, 4, 3  # tokens: blank 0, labels 1, 2, eos 3
    eos = v - 1
    logp = torch.log_softmax(torch.randn(b, t, v) * 1.5, dim=-1)
    lengths = torch.tensor([5, 3])
    refs = [brute_force(logp[i], int(lengths[i])) for i in range(b)]
    scorer = CTCPrefixScorer(logp, lengths, group=group, blank=BLANK, eos=eos)
    state = scorer.init_state()
    prefixes = [[] for _ in range(b * group)]
    gen = torch.Generator().manual_seed(0)
    for _step in range(4):
        ids = (
            torch.stack([torch.randperm(v, generator=gen) for _ in range(b * group)])[:, :3]
            if partial
            else None
        )
        psi = scorer.score(state, ids)
        cols = ids if partial else torch.arange(v).expand(b * group, -1)
        for n, g in enumerate(prefixes):
            prefix_p, full_p = refs[n // group]
            for k, c in enumerate(cols[n].tolist()):
                got = float(psi[n, k].double().exp())
                want = 0.0 if c == BLANK else full_p(g) if c == eos else prefix_p(g + [c])
                assert got == pytest.approx(want, rel=1e-4, abs=1e-9), (n, g, c)
        # extend: random parents within each utterance, random labels (repeats included)
        parents = (
            torch.randint(0, group, (b, group), generator=gen) + torch.arange(b)[:, None] * group
        ).view(-1)
        tokens = torch.randint(1, v - 1, (b * group,), generator=gen)
        full_psi = scorer.score(state)
        state = scorer.extend(state, parents, tokens, full_psi[parents, tokens])
        prefixes = [prefixes[p] + [c] for p, c in zip(parents.tolist(), tokens.tolist())]
        for n, g in enumerate(prefixes):
            assert float(state.psi[n].double().exp()) == pytest.approx(
                refs[n // group][0](g), rel=1e-4, abs=1e-9
            )


def test_ctc_prefix_scorer_long_input_is_finite_and_normalised():
    torch.manual_seed(0)
    t, v = 2000, 6
    logits = torch.randn(1, t, v) * 4
    logits[..., -1] = -60.0  # eos is a CTC symbol too: keep it out of the paths for the mass balance below
    logp = torch.log_softmax(logits, dim=-1)
    scorer = CTCPrefixScorer(logp, torch.tensor([t]), group=1)
    state = scorer.init_state()
    for tok in [1, 2, 2, 3]:
        psi = scorer.score(state)
        assert torch.isfinite(psi[:, 1:]).all()
        # the labels and eos partition the prefix's probability mass: sum_c psi(g+c) + p(g) = psi(g)
        mass = torch.logsumexp(psi[0, 1:-1], 0).exp() + psi[0, -1].exp()
        assert float(mass) == pytest.approx(float(state.psi[0].exp()), rel=1e-3)
        state = scorer.extend(state, torch.tensor([0]), torch.tensor([tok]), psi[0, tok].reshape(1))


def make_decoder(v: int, enc_dim: int, seed: int = 0, eos_boost: float = 2.0) -> TransformerDecoder:
    torch.manual_seed(seed)
    dec = TransformerDecoder(
        v,
        enc_dim,
        dict(decoder_layers=2, decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_attention_heads=4),
    ).eval()
    with torch.no_grad():
        dec.output_projection.weight[v - 1] *= eos_boost  # make ending plausible for a random model
        dec.output_projection.weight *= 3.0  # peakier distributions
    return dec


@torch.no_grad()
def greedy_attention(dec, mem, mask, maxlen, eos):
    """Reference: argmax decoding with the full (uncached) forward at every step, blank excluded."""
    ys = [eos]
    total = 0.0
    for _ in range(maxlen + 1):
        logp = torch.log_softmax(dec(torch.tensor([ys]), mem, mask)[0, -1], -1)
        logp[BLANK] = -math.inf
        if len(ys) == maxlen + 1:  # at the maximum length only eos is allowed
            c = eos
        else:
            c = int(logp.argmax())
        total += float(logp[c])
        if c == eos:
            break
        ys.append(c)
    return ys[1:], total


def test_beam_one_attention_only_equals_greedy_attention_decoding():
    v, d, b, t = 9, 12, 3, 10
    dec = make_decoder(v, d)
    mem = torch.randn(b, t, d)
    lens = torch.tensor([10, 7, 4])
    cfg = DecodeConfig(beam_size=1, ctc_weight=0.0, maxlenratio=-6)
    hyps = batch_beam_search(mem, lens, cfg, decoder=dec, ctc_logp=None, sos=v - 1, eos=v - 1)
    lengths = []
    for i in range(b):
        mask = torch.ones(1, int(lens[i]), dtype=torch.bool)
        ref, ref_score = greedy_attention(dec, mem[i : i + 1, : lens[i]], mask, 6, v - 1)
        assert hyps[i][0].tokens == ref
        assert hyps[i][0].score == pytest.approx(ref_score, abs=1e-4)
        lengths.append(len(ref))
    assert min(lengths) < 6  # at least one utterance ended on its own


@pytest.mark.parametrize("scoring", ["partial", "full"])
@pytest.mark.parametrize("ctc_weight", [0.0, 0.4, 1.0])
def test_batched_decoding_equals_decoding_each_utterance_alone(scoring, ctc_weight):
    v, d, b, t = 12, 12, 4, 9
    dec = make_decoder(v, d, seed=3)
    torch.manual_seed(5)
    mem = torch.randn(b, t, d)
    lens = torch.tensor([9, 5, 7, 3])
    ctc_logp = torch.log_softmax(torch.randn(b, t, v) * 3, -1)
    cfg = DecodeConfig(beam_size=3, ctc_weight=ctc_weight, ctc_scoring=scoring, nbest=3, penalty=0.2)
    kw = dict(
        sos=v - 1,
        eos=v - 1,
        decoder=dec if ctc_weight < 1 else None,
        ctc_logp=ctc_logp if ctc_weight > 0 else None,
    )
    batch = batch_beam_search(mem, lens, cfg, **kw)
    for i in range(b):
        n = int(lens[i])
        alone_kw = dict(kw, ctc_logp=ctc_logp[i : i + 1, :n] if ctc_weight > 0 else None)
        alone = batch_beam_search(mem[i : i + 1, :n], lens[i : i + 1], cfg, **alone_kw)[0]
        assert [h.tokens for h in batch[i]] == [h.tokens for h in alone]
        assert [h.score for h in batch[i]] == pytest.approx([h.score for h in alone], abs=1e-4)
        assert batch[i] and len(batch[i]) <= 3


@torch.no_grad()
def enumerate_best(dec, mem, ctc_logp, w, penalty, maxlen, v):
    """All label sequences up to maxlen, scored exactly; best first."""
    eos, scored = v - 1, []
    labels = range(1, v - 1)
    for n in range(maxlen + 1):
        for y in itertools.product(labels, repeat=n):
            y = list(y)
            s = penalty * (n + 1)
            if w < 1:
                logp = torch.log_softmax(
                    dec(torch.tensor([[eos] + y]), mem, torch.ones(1, mem.size(1), dtype=bool)), -1
                )
                s += (1 - w) * float(logp[0, torch.arange(n + 1), torch.tensor(y + [eos])].sum())
            if w > 0:
                nll = F.ctc_loss(
                    ctc_logp.transpose(0, 1),
                    torch.tensor([y], dtype=torch.long),
                    torch.tensor([mem.size(1)]),
                    torch.tensor([n]),
                    reduction="sum",
                )
                s += w * float(-nll)
            scored.append((s, y))
    return sorted(scored, key=lambda x: -x[0])


@pytest.mark.parametrize("ctc_weight", [0.0, 0.5, 1.0])
def test_large_beam_finds_the_maximum_probability_sequence(ctc_weight):
    v, d, t, maxlen = 5, 12, 5, 3  # 3 labels -> 40 sequences of up to 3 labels
    dec = make_decoder(v, d, seed=7, eos_boost=1.0)
    torch.manual_seed(11)
    mem = torch.randn(1, t, d)
    ctc_logp = torch.log_softmax(torch.randn(1, t, v) * 2, -1)
    cfg = DecodeConfig(
        beam_size=40, ctc_weight=ctc_weight, penalty=0.3, maxlenratio=-maxlen, nbest=5, ctc_scoring="full"
    )
    hyps = batch_beam_search(
        mem, torch.tensor([t]), cfg, decoder=dec, ctc_logp=ctc_logp, sos=v - 1, eos=v - 1
    )[0]
    ref = enumerate_best(dec, mem, ctc_logp, ctc_weight, 0.3, maxlen, v)[:5]
    assert [h.tokens for h in hyps] == [y for _, y in ref]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in ref], abs=1e-4)


def test_ctc_only_search_on_a_peaky_distribution_equals_greedy_ctc():
    v, t = 6, 12
    path = torch.tensor([[0, 1, 1, 0, 2, 0, 0, 2, 3, 3, 0, 4], [3, 0, 1, 4, 4, 0, 0, 0, 0, 0, 0, 0]])
    logits = torch.full((2, t, v), -3.0).scatter(2, path[..., None], 3.0)
    logp = torch.log_softmax(logits, -1)
    lens = torch.tensor([12, 6])
    assert ctc_greedy_decode(logp, lens) == [[1, 2, 2, 3, 4], [3, 1, 4]]
    cfg = DecodeConfig(beam_size=4, ctc_weight=1.0)
    hyps = batch_beam_search(
        torch.zeros(2, t, 4), lens, cfg, decoder=None, ctc_logp=logp, sos=v - 1, eos=v - 1
    )
    # eos (id 5) never wins a frame here, labels 1..4 do
    assert [h[0].tokens for h in hyps] == [[1, 2, 2, 3, 4], [3, 1, 4]]


def test_min_and_max_length_ratios_bound_hypothesis_lengths():
    v, d, t = 9, 12, 8
    dec = make_decoder(v, d, seed=2, eos_boost=6.0)  # eos dominates: unconstrained hypotheses are short
    mem = torch.randn(2, t, d)
    lens = torch.tensor([8, 6])
    kw = dict(decoder=dec, ctc_logp=None, sos=v - 1, eos=v - 1)
    free = batch_beam_search(mem, lens, DecodeConfig(beam_size=3, ctc_weight=0.0, nbest=3), **kw)
    assert min(len(h.tokens) for hyps in free for h in hyps) < 3
    cfg = DecodeConfig(beam_size=3, ctc_weight=0.0, nbest=3, minlenratio=0.5, maxlenratio=0.75)
    hyps = batch_beam_search(mem, lens, cfg, **kw)
    for u, n in enumerate([8, 6]):
        assert hyps[u] and all(n // 2 <= len(h.tokens) <= int(0.75 * n) for h in hyps[u])
        assert [h.score for h in hyps[u]] == sorted((h.score for h in hyps[u]), reverse=True)


@pytest.mark.cuda
def test_cuda_search_matches_cpu(exact_cuda_float32):
    v, d, b, t = 12, 12, 3, 9
    dec = make_decoder(v, d, seed=3)
    torch.manual_seed(5)
    mem = torch.randn(b, t, d)
    lens = torch.tensor([9, 5, 7])
    ctc_logp = torch.log_softmax(torch.randn(b, t, v) * 3, -1)
    cfg = DecodeConfig(beam_size=3, ctc_weight=0.4, nbest=2)
    cpu = batch_beam_search(mem, lens, cfg, decoder=dec, ctc_logp=ctc_logp, sos=v - 1, eos=v - 1)
    gpu = batch_beam_search(
        mem.cuda(), lens.cuda(), cfg, decoder=dec.cuda(), ctc_logp=ctc_logp.cuda(), sos=v - 1, eos=v - 1
    )
    assert [[h.tokens for h in x] for x in gpu] == [[h.tokens for h in x] for x in cpu]


def test_decode_config_yaml_and_errors(tmp_path):
    cfg = load_decode_config("conf/decode/default.yaml")
    assert cfg.beam_size == 10 and cfg.ctc_weight == 0.3
    bad = tmp_path / "bad.yaml"
    bad.write_text("beam_sise: 3\n")
    with pytest.raises(ConfigError, match="beam_sise.*|bad.yaml"):
        load_decode_config(bad)
    with pytest.raises(ConfigError, match="nbest"):
        load_decode_config(None, beam_size=2, nbest=3)
    with pytest.raises(ValueError, match="attention decoder"):
        batch_beam_search(
            torch.zeros(1, 3, 4),
            torch.tensor([3]),
            DecodeConfig(ctc_weight=0.5),
            decoder=None,
            ctc_logp=torch.zeros(1, 3, 5),
            sos=4,
            eos=4,
        )


# ---------------------------------------------------------------- AVSRModel (loss, config, decode)

TINY_ENCODER = dict(
    encoder_layers=1,
    encoder_embed_dim=32,
    encoder_ffn_embed_dim=64,
    encoder_attention_heads=4,
    conv_pos=4,
    conv_pos_groups=4,
    resnet_widths=[4, 4, 4, 4],
    dropout=0.0,
    dropout_input=0.0,
    dropout_features=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    encoder_layerdrop=0.0,
    feature_grad_mult=1.0,
    modality_dropout=0.0,
)
TINY_DECODER = dict(
    decoder_layers=1,
    decoder_embed_dim=32,
    decoder_ffn_embed_dim=64,
    decoder_attention_heads=4,
    dropout=0.0,
    activation_dropout=0.0,
)


def _config(vocab_size: int, **model_conf) -> ModelConfig:
    """The tiny model's configuration tree with ``model_conf`` options."""
    return ModelConfig(vocab_size=vocab_size, encoder_conf=TINY_ENCODER, decoder_conf=TINY_DECODER,
                       model_conf=model_conf)


def test_label_smoothing_loss_matches_kl_definition():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    target = torch.tensor([[1, 2, -1], [4, -1, -1]])
    q = torch.full((2, 3, 5), 0.1 / 4).scatter(2, target.clamp(min=0)[..., None], 0.9)
    kl = (q * (q.log() - torch.log_softmax(logits, -1))).sum(-1) * (target != -1)
    assert float(label_smoothing_loss(logits, target, 0.1)) == pytest.approx(float(kl.sum() / 2), rel=1e-5)
    got = label_smoothing_loss(logits, target, 0.1, normalize_length=True)
    assert float(got) == pytest.approx(float(kl.sum() / 3), rel=1e-5)
    assert float(label_smoothing_loss(logits, target, 0.0)) == pytest.approx(
        float(F.cross_entropy(logits.view(-1, 5), target.view(-1), ignore_index=-1, reduction="sum") / 2),
        rel=1e-5,
    )


def test_model_config_errors_name_the_key():
    conf = dict(
        vocab_size=8, encoder_conf=TINY_ENCODER, decoder_conf=TINY_DECODER, model_conf={"ctc_weight": 0.5}
    )
    model = AVSRModel.from_config(conf)
    assert model.ctc_lo is not None and model.decoder is not None
    with pytest.raises(ConfigError, match="decoder_conf.*decoder_layerz"):
        AVSRModel.from_config(dict(conf, decoder_conf={"decoder_layerz": 1}), "m.yaml")
    with pytest.raises(ConfigError, match="m.yaml.*lsm_wieght"):
        AVSRModel.from_config(dict(conf, model_conf={"lsm_wieght": 0.1}), "m.yaml")
    with pytest.raises(ConfigError, match="frontend"):
        AVSRModel.from_config(dict(conf, frontend="x"))
    with pytest.raises(ConfigError, match="encoder_layerz"):
        AVSRModel.from_config(dict(conf, encoder_conf={"encoder_layerz": 1}))


@pytest.mark.parametrize("ctc_weight", [0.0, 0.3, 1.0])
def test_model_loss_stats_and_parts(ctc_weight):
    torch.manual_seed(0)
    model = AVSRModel(_config(8, ctc_weight=ctc_weight))
    assert (model.ctc_lo is None) == (ctc_weight == 0) and (model.decoder is None) == (ctc_weight == 1)
    audio = torch.randn(2, 104, 6)
    ys = torch.tensor([[1, 2, 3], [4, 5, -1]])
    loss, stats = model(audio, None, torch.tensor([6, 4]), ys, torch.tensor([3, 2]))
    loss.backward()
    assert set(stats) == {"loss", "loss_ctc", "loss_att", "acc"}
    # statistics are detached scalar tensors (the trainer reads them once per log interval)
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in stats.values())
    stats = {k: float(v) for k, v in stats.items()}
    assert math.isfinite(stats["loss"]) and stats["loss"] == pytest.approx(float(loss.detach()))
    if 0 < ctc_weight < 1:
        assert stats["loss"] == pytest.approx(0.3 * stats["loss_ctc"] + 0.7 * stats["loss_att"], rel=1e-5)
    assert math.isnan(stats["loss_att"]) == (ctc_weight == 1) and math.isnan(stats["loss_ctc"]) == (
        ctc_weight == 0
    )
    with pytest.raises(ValueError, match="batch item 1"):
        model(audio, None, torch.tensor([6, 4]), torch.tensor([[1, 2], [7, 1]]), torch.tensor([2, 2]))


def test_tiny_model_overfits_two_utterances_and_decodes_them():
    torch.manual_seed(0)
    v = 10
    model = AVSRModel(_config(v, ctc_weight=0.3, lsm_weight=0.0))
    audio = torch.randn(2, 104, 8)
    lens = torch.tensor([8, 6])
    targets = [[3, 1, 4, 1, 5], [2, 6, 8]]
    ys = torch.tensor([targets[0], targets[1] + [-1, -1]])
    ys_lens = torch.tensor([5, 3])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(60):
        opt.zero_grad()
        loss, stats = model(audio, None, lens, ys, ys_lens)
        loss.backward()
        opt.step()
    assert float(stats["acc"]) == 1.0
    assert decode(model, audio, None, lens, DecodeConfig(beam_size=3, ctc_weight=0.3)) == targets
    assert model.training  # the search restores the mode
    assert decode(model, audio, None, lens, beam_size=2, ctc_weight=1.0) == targets
    assert decode(model, audio, None, lens, beam_size=1, ctc_weight=0.0) == targets


def test_precomputed_video_features_decode_as_the_video_itself():
    torch.manual_seed(0)
    model = AVSRModel(_config(9, ctc_weight=0.3)).eval()
    video = torch.randn(2, 1, 5, 88, 88)
    lens = torch.tensor([5, 4])
    cfg = DecodeConfig(beam_size=2, ctc_weight=0.3)
    audios = [torch.randn(2, 104, 5) for _ in range(2)]  # two noise conditions, the same video
    expected = [decode(model, a, video, lens, cfg) for a in audios]
    feats = model.encoder.encode_video(video, lens)  # (B, D, T)
    assert feats.shape == (2, model.encoder.output_size(), 5)
    repadded = feats.clone()
    repadded[1, :, 4:] = 0.0  # what the frames past an utterance's end hold does not matter
    for a, want in zip(audios, expected):
        hyps, ctc_logp, enc_lens, _, _ = Searcher(model, cfg).decode(a, None, lens, video_features=repadded)
        assert [h[0].tokens for h in hyps] == want
        assert ctc_logp.shape == (2, 5, 9) and enc_lens.tolist() == [5, 4]
    enc, _ = model.encode(audios[0], video, lens)
    enc_f, _ = model.encode(audios[0], None, lens, video_features=feats)
    assert torch.equal(enc, enc_f)
    enc_v, _ = model.encode(None, video, lens)  # video alone, from the features
    assert torch.equal(enc_v, model.encode(None, None, lens, video_features=feats)[0])
    with pytest.raises(ValueError, match="video_features must be"):
        model.encode(audios[0], None, lens, video_features=feats[:, :3])
    with pytest.raises(ValueError, match="do not fit the audio"):
        model.encode(audios[0][:, :, :4], None, lens.clamp(max=4), video_features=feats)


# --- the pre-beam of partial CTC scoring: avsr's and ESPnet's exact ones (DecodeConfig.pre_beam) ---


def test_pre_beam_ids_rank_the_whole_vocabulary_as_espnet():
    from avsr.decode.beam_search import _pre_beam_ids

    eos = 7
    # row 0: blank and eos are the two best tokens; row 1: eos is ranked 5th, blank last
    att = torch.log_softmax(torch.tensor([[9.0, 1, 2, 3, 4, 5, 6, 8], [0.0, 8, 7, 6, 5, 1, 2, 4]]), -1)
    ours, extra = _pre_beam_ids(att, DecodeConfig(pre_beam="avsr"), 3, eos, BLANK)
    assert extra is None
    assert ours.tolist() == [[6, 5, 4, eos], [1, 2, 3, eos]]
    cfg = DecodeConfig(pre_beam="espnet", ctc_weight=0.3, penalty=0.5)
    esp, extra = _pre_beam_ids(att, cfg, 3, eos, BLANK)
    assert esp.tolist() == [[BLANK, eos, 6, eos], [1, 2, 3, eos]]  # eos always appended (CTCPrefixScoreTH)
    assert extra.tolist() == [True, False]  # ... but not a second candidate where the pre-beam has it
    nonbatch, extra = _pre_beam_ids(att, DecodeConfig(pre_beam="espnet_nonbatch"), 3, eos, BLANK)
    assert nonbatch.tolist() == esp.tolist() and extra.tolist() == [True, False]  # last column: maxlen only


@torch.no_grad()
def espnet_style_search(dec, mem, logp, cfg, maxlen, v):
    """Reference: ESPnet's (Batch)BeamSearch step by step in plain Python for one utterance, with exact CTC
    prefix probabilities from enumerating the alignments (no vectorisation, no caches)."""
    eos, sos, w, k = v - 1, v - 1, cfg.ctc_weight, cfg.beam_size
    prefix_p, full_p = brute_force(logp[0], logp.size(1))
    pre = int(cfg.pre_beam_ratio * k)

    def log(x):
        return math.log(x) if x > 0 else -math.inf

    running, ended = [([], 0.0)], []
    for i in range(maxlen + 1):
        cands = []
        for y, s in running:
            mask = torch.ones(1, mem.size(1), dtype=bool)
            att = torch.log_softmax(dec(torch.tensor([[sos] + y]), mem, mask)[0, -1], -1)
            ranked = ((1 - w) * att + cfg.penalty).topk(pre).indices.tolist()
            allowed = set(ranked) | ({eos} if cfg.pre_beam == "espnet" or i == maxlen else set())
            for c in sorted(allowed - {BLANK}):
                if i == maxlen and c != eos:
                    continue  # avsr's rule at the maximum length: only eos
                new = full_p(y) if c == eos else prefix_p(y + [c])
                ctc = log(new) - log(prefix_p(y)) if y else log(new)
                if math.isfinite(ctc):  # an impossible prefix is no candidate (ESPnet: score -1e10)
                    cands.append((s + (1 - w) * float(att[c]) + w * ctc + cfg.penalty, y + [c]))
        best = sorted(cands, key=lambda x: -x[0])[:k]
        ended += [(s, y[:-1]) for s, y in best if y[-1] == eos]
        running = [(y, s) for s, y in best if y[-1] != eos]
        if not running:
            break
    return sorted(ended, key=lambda x: -x[0])


@pytest.mark.parametrize("pre_beam", ["espnet", "espnet_nonbatch"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_espnet_pre_beam_search_equals_a_plain_reference(pre_beam, seed):
    v, d, t, maxlen = 6, 12, 5, 4
    dec = make_decoder(v, d, seed=seed, eos_boost=1.5)
    torch.manual_seed(100 + seed)
    mem = torch.randn(1, t, d)
    logits = torch.randn(1, t, v) * 2
    logits[..., BLANK] += 1.0
    logp = torch.log_softmax(logits, -1)
    cfg = DecodeConfig(beam_size=2, ctc_weight=0.4, penalty=0.1, pre_beam_ratio=1.5, maxlenratio=-maxlen,
                       nbest=2, pre_beam=pre_beam)  # pre-beam of 3 of 6 tokens
    hyps = batch_beam_search(mem, torch.tensor([t]), cfg, decoder=dec, ctc_logp=logp, sos=v - 1, eos=v - 1)[0]
    ref = espnet_style_search(dec, mem, logp, cfg, maxlen, v)[:2]
    assert [h.tokens for h in hyps] == [y for _, y in ref]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in ref], abs=1e-3)


def test_pre_beams_differ_where_blank_or_eos_rank_high_and_agree_without_pre_beam():
    v, d, b, t = 10, 12, 6, 8
    dec = make_decoder(v, d, seed=4, eos_boost=2.5)
    torch.manual_seed(9)
    mem = torch.randn(b, t, d)
    lens = torch.full((b,), t)
    logp = torch.log_softmax(torch.randn(b, t, v) * 2, -1)
    kw = dict(decoder=dec, ctc_logp=logp, sos=v - 1, eos=v - 1)
    with torch.no_grad():  # blank scores like eos: both take pre-beam slots in ESPnet's ranking
        dec.output_projection.weight[BLANK] = dec.output_projection.weight[v - 1]
    results = {}
    end_rules = dict(ctc_end_prob=0.99, ctc_maxlen_ratio=1.5)  # the same in all (ESPnet's modes: off)
    for pre_beam in ("avsr", "espnet", "espnet_nonbatch"):
        partial = DecodeConfig(beam_size=2, ctc_weight=0.3, pre_beam_ratio=1.0, nbest=2, pre_beam=pre_beam)
        full = DecodeConfig(beam_size=2, ctc_weight=0.3, ctc_scoring="full", nbest=2, pre_beam=pre_beam,
                            **end_rules)
        results[pre_beam] = [[h.tokens for h in u] for u in batch_beam_search(mem, lens, partial, **kw)]
        results[pre_beam, "full"] = [[h.tokens for h in u] for u in batch_beam_search(mem, lens, full, **kw)]
    assert results["avsr", "full"] == results["espnet", "full"] == results["espnet_nonbatch", "full"]
    assert results["avsr"] != results["espnet"]  # the blank slot leaves ESPnet one candidate fewer


def test_pre_beam_option_is_checked_and_read_from_yaml(tmp_path):
    with pytest.raises(ValueError, match="pre_beam"):
        DecodeConfig(pre_beam="fairseq")
    path = tmp_path / "d.yaml"
    path.write_text("pre_beam: espnet\nbeam_size: 4\n")
    assert load_decode_config(path).pre_beam == "espnet"
    assert load_decode_config("conf/decode/default.yaml").pre_beam == "avsr"


# --- a hypothesis ends where the speech ends: the attention decoder cannot run on past CTC's support ---

LOOP_V, LOOP_TOKEN = 10, 2  # vocabulary of the looping tests (blank 0, labels 1..8, eos 9); the favourite


def looping_decoder(v: int = LOOP_V, d: int = 12, favourite: int = LOOP_TOKEN) -> TransformerDecoder:
    """A decoder that never wants to stop: whatever it reads, ``favourite`` gets ~0 nats, the other labels
    ~-4 and ``eos`` ~-34 (an output bias; the weights are shrunk so that the input hardly matters)."""
    dec = make_decoder(v, d, seed=0)
    proj = torch.nn.Linear(dec.output_projection.in_features, v, bias=True)
    with torch.no_grad():
        proj.weight.copy_(dec.output_projection.weight * 0.01)
        proj.bias.zero_()
        proj.bias[favourite] = 4.0
        proj.bias[v - 1] = -30.0
    dec.output_projection = proj
    return dec.eval()


def spiky_ctc(spikes: dict[int, int], t: int, v: int = LOOP_V, floor: float = -12.0) -> torch.Tensor:
    """``(1, t, v)`` CTC log-probabilities of a trained model's kind: blank everywhere (every other token
    ``floor`` nats below it) except one frame per entry of ``spikes`` (frame -> label), where the label wins
    by 12 nats."""
    logits = torch.full((1, t, v), floor)
    logits[..., BLANK] = 0.0
    for frame, label in spikes.items():
        logits[0, frame, label] = 12.0
    return torch.log_softmax(logits, -1)


def stretch(logp: torch.Tensor, factor: int) -> torch.Tensor:
    """Time-stretched input as a CTC model sees it: every frame ``factor`` times."""
    return logp.repeat_interleave(factor, dim=1)


def search_looping(ctc_logp, lens, **cfg):
    b, t = ctc_logp.shape[:2]
    torch.manual_seed(1)
    mem = torch.randn(b, t, 12)
    cfg = DecodeConfig(**{"beam_size": 4, "ctc_weight": 0.3, "nbest": 4, **cfg})
    return batch_beam_search(mem, lens, cfg, decoder=looping_decoder(), ctc_logp=ctc_logp, sos=LOOP_V - 1,
                             eos=LOOP_V - 1)


def test_looping_decoder_stops_where_ctc_says_the_input_is_used_up():
    # CTC supports "2 2 2" (three spikes) in 20 frames; the decoder would say 2 forever
    logp = spiky_ctc({3: 2, 8: 2, 13: 2}, 20)
    hyps = search_looping(logp, torch.tensor([20]))[0]
    assert hyps, "the search must end with a hypothesis"
    assert hyps[0].tokens == [2, 2, 2]
    # the n-best's alternatives (beam 4) stay within the CTC length limit: ceil(1.5 * 3) + 2 = 7 tokens
    assert all(len(h.tokens) <= 7 for h in hyps)


def test_ctc_length_limit_bounds_a_looping_decoder_without_the_end_gate():
    logp = spiky_ctc({3: 2, 8: 2, 13: 2}, 20)
    # end gate off: the limit from CTC's expected label count (3) still holds: ceil(1.5 * 3) + 2 = 7
    hyps = search_looping(logp, torch.tensor([20]), ctc_end_prob=1.0)[0]
    assert hyps and max(len(h.tokens) for h in hyps) <= 7
    # both off (ESPnet's search): the decoder overrides CTC and runs on to what 20 frames can spell
    espnet = search_looping(logp, torch.tensor([20]), ctc_end_prob=1.0, ctc_maxlen_ratio=0.0)[0]
    assert len(espnet[0].tokens) > 7


def test_long_silence_gives_an_empty_hypothesis():
    logp = spiky_ctc({}, 100)  # 4 s of silence: CTC says blank throughout
    hyps = search_looping(logp, torch.tensor([100]))[0]
    assert hyps and hyps[0].tokens == []
    # a minimum length (2 tokens) holds the gate back until it is reached, and then the hypothesis ends
    hyps = search_looping(logp, torch.tensor([100]), minlenratio=0.02)[0]
    assert hyps and hyps[0].tokens == [2, 2]


def test_time_stretched_input_gives_the_same_words_without_loops():
    logp = spiky_ctc({3: 2, 8: 5, 13: 2}, 20)
    slow = stretch(logp, 3)  # 60 frames, each spike 3 frames wide
    batch = torch.cat([F.pad(logp, (0, 0, 0, 40), value=0.0), slow])
    hyps = search_looping(batch, torch.tensor([20, 60]))
    for u in hyps:
        assert u and u[0].tokens == [2, 5, 2]
        assert all(len(h.tokens) <= 7 for h in u)  # the CTC length limit is the same for both: 3 labels
    counts = ctc_expected_label_count(batch, torch.tensor([20, 60]), blank=BLANK, eos=LOOP_V - 1)
    assert counts.tolist() == pytest.approx([3.0, 3.0], abs=0.01)


def test_expected_label_count_matches_enumeration_of_alignments():
    torch.manual_seed(3)
    t, v = 5, 4  # blank 0, labels 1, 2, eos 3 (not a label)
    logp = torch.log_softmax(torch.randn(2, t, v) * 2, -1)
    lengths = torch.tensor([5, 3])
    got = ctc_expected_label_count(logp, lengths, blank=BLANK, eos=v - 1)
    for b in range(2):
        n = int(lengths[b])
        prob = logp[b, :n].double().exp()
        want = sum(
            float(prob[torch.arange(n), torch.tensor(path)].prod()) * sum(c != v - 1 for c in collapse(path))
            for path in itertools.product(range(v), repeat=n)
        )
        assert float(got[b]) == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="logp must be"):
        ctc_expected_label_count(logp[0], lengths)


def test_ctc_end_rules_are_checked_resolved_and_read_from_yaml(tmp_path):
    assert DecodeConfig().ctc_end_rules() == (0.99, 1.5)
    assert DecodeConfig(pre_beam="espnet").ctc_end_rules() == (1.0, 0.0)  # ESPnet's search: off
    assert DecodeConfig(pre_beam="espnet", ctc_end_prob=0.9, ctc_maxlen_ratio=2).ctc_end_rules() == (0.9, 2)
    for bad in (dict(ctc_end_prob=0.0), dict(ctc_end_prob=1.5), dict(ctc_maxlen_ratio=-1),
                dict(ctc_maxlen_margin=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DecodeConfig(**bad)
    path = tmp_path / "d.yaml"
    path.write_text("ctc_end_prob: 0.999\nctc_maxlen_ratio: 1.5\nctc_maxlen_margin: 4\n")
    cfg = load_decode_config(path)
    assert (cfg.ctc_end_prob, cfg.ctc_maxlen_ratio, cfg.ctc_maxlen_margin) == (0.999, 1.5, 4)
    default = load_decode_config("conf/decode/default.yaml")
    assert default.ctc_end_rules() == (0.99, 1.5) and default.ctc_maxlen_margin == 2
    with pytest.raises(ConfigError, match="ctc_end_prob"):
        load_decode_config("conf/decode/avhubert_s2s.yaml", ctc_end_prob=0.9)  # not read by fairseq's search


def test_model_with_a_looping_decoder_decodes_silence_as_nothing():
    # the package's path (a Searcher with the model's default options): the CTC head says blank, the
    # decoder never stops, and with more labels (28) than the beam (10) eos never makes the beam on its
    # attention score
    torch.manual_seed(0)
    v = 30
    model = AVSRModel(_config(v, ctc_weight=0.3)).eval()
    proj = torch.nn.Linear(model.decoder.output_projection.in_features, v, bias=True)
    with torch.no_grad():
        proj.weight.zero_()
        proj.bias.zero_()
        proj.bias[LOOP_TOKEN], proj.bias[v - 1] = 4.0, -30.0
        model.ctc_lo.weight.zero_()
        model.ctc_lo.bias.fill_(-14.0)
        model.ctc_lo.bias[BLANK] = 0.0
    model.decoder.output_projection = proj
    audio = torch.randn(2, 104, 75)  # 3 s
    assert decode(model, audio, None, torch.tensor([75, 50])) == [[], []]

class _PrefixDecoder:
    """A stand-in for the attention decoder of :func:`fairseq_beam_search`: the next token's probabilities are
    a table over the hypothesis' tokens so far (``PREFIX_PROBS``); any other prefix continues with ``C``."""

    EOS, A, B, C = 0, 1, 2, 3
    vocab_size = 4

    class cfg:  # noqa: N801 - the attribute the search reads
        max_target_positions = 1024

    class State:
        def __init__(self, prefixes):
            self.prefixes, self.started = prefixes, False

        def select(self, rows, utts=None):
            self.prefixes = [self.prefixes[i] for i in rows.tolist()]
            return self

    def __init__(self, table):
        self.table = table

    def init_state(self, memory, mask, group=1):
        return self.State([()] * (memory.shape[0] * group))

    def step(self, tokens, state):
        if state.started:  # the first input is </s>, not part of the hypothesis
            state.prefixes = [p + (t,) for p, t in zip(state.prefixes, tokens.tolist())]
        state.started = True
        rows = [[self.table.get(p, {self.C: 0.999, self.EOS: 0.001}).get(t, 1e-9) for t in range(4)]
                for p in state.prefixes]
        return torch.tensor(rows).log(), state


def test_fairseq_search_normalises_finished_scores_by_length_to_the_lenpen():
    """A short hypothesis (A </s>, 2 tokens, log p -1.20) against a long one (B B B </s>, 4 tokens, log p
    -1.41): the sum of log-probabilities prefers the short one, the mean per token the long one."""
    from avsr.decode.fairseq_search import fairseq_beam_search

    E, A, B, C = _PrefixDecoder.EOS, _PrefixDecoder.A, _PrefixDecoder.B, _PrefixDecoder.C
    table = {(): {A: 0.6, B: 0.4}, (A,): {E: 0.5, C: 0.5}, (B,): {B: 0.8, E: 0.2}, (B, B): {B: 0.8, E: 0.2},
             (B, B, B): {E: 0.95, B: 0.05}}
    short, long = math.log(0.6) + math.log(0.5), math.log(0.4) + 2 * math.log(0.8) + math.log(0.95)
    memory, lens = torch.zeros(1, 5, 4), torch.tensor([5])

    def search(**options):
        cfg = FairseqConfig(ctc_weight=0.0, beam_size=2, nbest=2, max_len_a=0.0,
                           max_len_b=8, **options)
        (hyps,) = fairseq_beam_search(memory, lens, cfg, decoder=_PrefixDecoder(table), eos=E)
        return hyps

    for lenpen in (0.0, 0.5, 1.0, 2.0):
        hyps = search(lenpen=lenpen)
        assert sorted(tuple(h.tokens) for h in hyps) == [(A,), (B, B, B)]
        for h in hyps:  # score = sum of log-probabilities / (tokens + </s>) ** lenpen
            raw = short if h.tokens == [A] else long
            assert h.att_score == pytest.approx(raw, abs=1e-5)
            assert h.score == pytest.approx(raw / (len(h.tokens) + 1) ** lenpen, abs=1e-5)
        best = hyps[0].tokens
        # the ranking flips where short / 2 ** lenpen = long / 4 ** lenpen: lenpen = log2(long / short)
        assert best == ([A] if lenpen < math.log2(long / short) else [B, B, B]), (lenpen, hyps)
    unnormalised = search(lenpen=2.0, normalize_scores=False)
    assert [h.tokens for h in unnormalised] == [[A], [B, B, B]]
    assert [h.score for h in unnormalised] == pytest.approx([short, long], abs=1e-5)
