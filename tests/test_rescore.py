"""The single-stream views in the final ranking of audio-visual hypotheses (``video_weight``,
``audio_weight``), and the confidence check of the audio (``audio_confidence``)."""

import math

import pytest
import torch

from avsr.config import ConfigError
from avsr.decode import DecodeConfig, FairseqConfig
from avsr.decode.config import searched_views
from avsr.decode.hypothesis import Hypothesis
from avsr.decode.rescore import rescore_with_views, sequence_scores
from avsr.decode.searcher import Searcher
from avsr.inference.pretrained import checkpoint_decode_defaults
from avsr.models import AVSRModel
from tests.decoding import searcher
from tests.test_beam_search import TINY_DECODER, TINY_ENCODER

HW = 16
LENS = torch.tensor([14, 10, 12])


def _model(gate: bool = True, seed: int = 0, decode_defaults: dict | None = None) -> AVSRModel:
    torch.manual_seed(seed)
    model = AVSRModel.from_config(dict(vocab_size=12, encoder_conf=dict(TINY_ENCODER, audio_gate=gate),
                                       decoder_conf=TINY_DECODER, model_conf={"ctc_weight": 0.3},
                                       decode_defaults=decode_defaults)).eval()
    if gate:  # a gate that depends on the input (a new gate is a constant 0.95)
        with torch.no_grad():
            model.encoder.audio_gate.proj.weight.normal_(0, 0.5)
            model.encoder.audio_gate.proj.bias.zero_()
    return model


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    t = int(LENS.max())
    audio = torch.randn(3, 104, t, generator=g)
    video = torch.randn(3, 1, t, HW, HW, generator=g)
    for i, n in enumerate(LENS.tolist()):
        audio[i, :, n:] = 0
        video[i, :, n:] = 0
    return audio, video


def _config(**kw) -> DecodeConfig:
    return DecodeConfig(**{"beam_size": 4, "ctc_weight": 0.3, "maxlenratio": -4.0, **kw})


def _scorer(model, enc, lens):
    logp = model.ctc_log_probs(enc)
    return lambda cands, index: sequence_scores(
        cands, index, enc, lens, decoder=model.decoder, ctc_logp=logp, ctc_weight=0.3, sos=model.sos,
        eos=model.eos, blank=model.blank)


@pytest.mark.parametrize("ctc_scoring", ["full", "partial"])
def test_sequence_scores_are_the_scores_the_beam_search_gave(ctc_scoring):
    model = _model()
    audio, video = _inputs()
    with torch.no_grad():
        enc, lens = model.encode(audio, video, LENS)
        hyps = Searcher(model, _config()).search(enc, lens, config=_config(nbest=4, ctc_scoring=ctc_scoring))
        cands = [h.tokens for u in hyps for h in u]
        index = torch.tensor([u for u, hs in enumerate(hyps) for _ in hs])
        att, ctc, score = _scorer(model, enc, lens)(cands, index)
    flat = [h for u in hyps for h in u]
    assert len(flat) >= 6
    torch.testing.assert_close(att, torch.tensor([h.att_score for h in flat]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ctc, torch.tensor([h.ctc_score for h in flat]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(score, torch.tensor([h.score for h in flat]), atol=1e-4, rtol=1e-4)


def test_sequence_scores_of_candidates_in_any_order_are_each_candidates_alone():
    model = _model()
    audio, video = _inputs()
    g = torch.Generator().manual_seed(5)
    # utterances with 3, 0 and 5 candidates of different lengths, interleaved
    index = torch.tensor([2, 0, 2, 2, 0, 2, 0, 2])
    sizes = torch.randint(1, 6, (8,), generator=g).tolist()
    cands = [torch.randint(3, 12, (n,), generator=g).tolist() for n in sizes]
    with torch.no_grad():
        enc, lens = model.encode(audio, video, LENS)
        together = _scorer(model, enc, lens)(cands, index)
        alone = [_scorer(model, enc[u : u + 1], lens[u : u + 1])([c], torch.tensor([0]))
                 for c, u in zip(cands, index.tolist())]
    for got, want in zip(together, zip(*alone)):
        torch.testing.assert_close(got, torch.cat(want), atol=1e-4, rtol=1e-5)


def test_a_sequence_longer_than_its_frames_scores_minus_infinity():
    model = _model()
    audio, video = _inputs()
    with torch.no_grad():
        enc, lens = model.encode(audio, video, LENS)
        _, ctc, score = _scorer(model, enc, lens)([[3] * 12, [4, 5]], torch.tensor([1, 1]))
    assert ctc[0] == float("-inf") and score[0] == float("-inf")
    assert torch.isfinite(ctc[1]) and torch.isfinite(score[1])


def test_the_gate_mean_is_the_mean_of_the_gate_that_fusion_applies_over_valid_frames():
    model = _model()
    audio, video = _inputs()
    seen = []
    hook = model.encoder.audio_gate.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        model.encode(audio, video, LENS)
        feats = model.encoder.encode_video(video, LENS)
        mean = model.encoder.gate_means(audio, feats, LENS)[0]
    hook.remove()
    gate = seen[0][:, 0]  # (B, T)
    expected = torch.stack([gate[i, :n].mean() for i, n in enumerate(LENS.tolist())])
    torch.testing.assert_close(mean, expected)
    assert float(mean.std()) > 0  # the gate depends on the input
    assert _model(gate=False).encoder.gate_means(audio, feats, LENS) == (None, None)


def _views(model, audio, video, enc_lens):
    """As the searcher sees them: the fused, video-only and audio-only views' encoder outputs, their own
    searches (``nbest`` 4, no ranking) and scorers, in that order, and the utterances' mean audio gate."""
    feats = model.encoder.encode_video(video, LENS)
    encs = [model.encode(audio, None, LENS, feats)[0], model.encode(None, None, LENS, feats)[0],
            model.encode(audio, None, LENS)[0]]
    wide = _config(nbest=4, video_weight=0.0, audio_weight=0.0)
    searcher = Searcher(model, _config())
    searches = [searcher.search(e, enc_lens, config=wide) for e in encs]
    scorers = [_scorer(model, e, enc_lens) for e in encs]
    return encs, searches, scorers, model.encoder.gate_means(audio, feats, LENS)[0]


@pytest.mark.parametrize("weights", [(2.0, 0.0), (1.5, 0.5), (0.0, 1.0)])
def test_audio_visual_hypotheses_are_ranked_by_the_fused_score_plus_the_weighted_single_views(weights):
    wv, wa = weights
    model = _model()
    audio, video = _inputs()
    cfg = _config(nbest=4, video_weight=wv, audio_weight=wa)
    with torch.no_grad():
        hyps, ctc_logp, enc_lens, _, _ = searcher(model, cfg).decode(audio, video, LENS)
        encs, (av, v, _), (s_av, s_v, s_a), gate = _views(model, audio, video, enc_lens)
        torch.testing.assert_close(ctc_logp, model.ctc_log_probs(encs[0]))  # word timings: the fused view's
        for u in range(3):
            got = hyps[u]
            assert 1 <= len(got) <= 4
            assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
            index = torch.full((len(got),), u)
            att, _, a = s_av([h.tokens for h in got], index)
            joint = a + gate[u] * (wv * s_v([h.tokens for h in got], index)[2]
                                   + wa * s_a([h.tokens for h in got], index)[2])
            torch.testing.assert_close(torch.tensor([h.score for h in got]), joint)
            torch.testing.assert_close(torch.tensor([h.att_score for h in got]), att)
            # the candidates: the fused search's, and the video-only search's when the video view has a weight
            candidates = {tuple(h.tokens) for h in av[u] + (v[u] if wv > 0 else [])}
            assert all(tuple(h.tokens) in candidates for h in got)
            # the winner is at least as good, by the joint score, as the best of each search
            rivals = [av[u][0].tokens] + ([v[u][0].tokens] if wv > 0 else [])
            idx = torch.full((len(rivals),), u)
            best = s_av(rivals, idx)[2] + gate[u] * (wv * s_v(rivals, idx)[2] + wa * s_a(rivals, idx)[2])
            assert got[0].score >= float(best.max()) - 1e-4


@pytest.mark.parametrize("confidence", [0.5, 2.0])
def test_the_audio_confidence_check_adds_the_audio_search_and_scales_its_weight(confidence):
    model = _model()
    audio, video = _inputs()
    wv, wa = 1.0, 3.0
    cfg = _config(nbest=4, video_weight=wv, audio_weight=wa, audio_confidence=confidence)
    with torch.no_grad():
        hyps, _, enc_lens, _, _ = searcher(model, cfg).decode(audio, video, LENS)
        _, searches, (s_av, s_v, s_a), gate = _views(model, audio, video, enc_lens)
        for u in range(3):
            best_a = searches[2][u][0]
            per_token = best_a.score / (len(best_a.tokens) + 1)  # no length bonus in this config
            scale = min(1.0, math.exp(confidence * per_token))
            assert per_token < 0 and 0 < scale < 1
            got = hyps[u]
            index = torch.full((len(got),), u)
            toks = [h.tokens for h in got]
            joint = s_av(toks, index)[2] + gate[u] * (
                wv * s_v(toks, index)[2] + wa * scale * s_a(toks, index)[2])
            torch.testing.assert_close(torch.tensor([h.score for h in got]), joint)
            # the candidates are the three searches' hypotheses, and the winner beats the best of each
            candidates = {tuple(h.tokens) for search in searches for h in search[u]}
            assert all(tuple(h.tokens) in candidates for h in got)
            rivals = [search[u][0].tokens for search in searches]
            idx = torch.full((3,), u)
            best = s_av(rivals, idx)[2] + gate[u] * (
                wv * s_v(rivals, idx)[2] + wa * scale * s_a(rivals, idx)[2])
            assert got[0].score >= float(best.max()) - 1e-4


def test_no_weight_a_single_stream_or_a_closed_gate_leave_the_fused_search_alone():
    model = _model()
    audio, video = _inputs()
    with torch.no_grad():
        enc, lens = model.encode(audio, video, LENS)
        plain = Searcher(model, _config()).search(enc, lens, config=_config())
        none = _config(video_weight=0.0, audio_weight=0.0)
        assert searcher(model, none).decode(audio, video, LENS)[0] == plain
        for a, v in ((audio, None), (None, video)):  # one stream: one view, nothing to rescore
            enc1, _ = model.encode(a, v, LENS)
            assert searcher(model, _config(video_weight=3.0, audio_weight=1.0)).decode(a, v, LENS)[0] == \
                Searcher(model, _config()).search(enc1, lens, config=_config())
        model.encoder.audio_gate.proj.weight.zero_()
        model.encoder.audio_gate.proj.bias.fill_(-60.0)  # closed: the single views get no weight
        enc, lens = model.encode(audio, video, LENS)
        strong = _config(video_weight=5.0, audio_weight=5.0, nbest=2)
        joint = searcher(model, strong).decode(audio, video, LENS)[0]
        fused = _scorer(model, enc, lens)
        for u in range(3):
            _, _, s = fused([h.tokens for h in joint[u]], torch.full((len(joint[u]),), u))
            torch.testing.assert_close(torch.tensor([h.score for h in joint[u]]), s)


def test_the_default_weights_come_from_the_checkpoint_decode_section_and_need_an_audio_gate():
    tuned = {"video_weight": 2.5, "audio_weight": 0.75}
    gated, plain = _model(decode_defaults=tuned), _model(gate=False)
    assert searcher(gated, DecodeConfig()).view_weights == (2.5, 0.75, 0)
    assert searcher(_model(), DecodeConfig()).view_weights == (0, 0, 0)  # nothing tuned: one search
    assert searcher(plain, DecodeConfig()).view_weights == (0, 0, 0)
    assert searcher(gated, DecodeConfig(video_weight=0.25)).view_weights == (0.25, 0.75, 0)
    assert searcher(gated, DecodeConfig(audio_weight=0.0)).view_weights == (2.5, 0.0, 0)
    confident = _model(decode_defaults={**tuned, "audio_confidence": 2.0})
    assert searcher(confident, DecodeConfig()).view_weights == (2.5, 0.75, 2.0)
    assert searcher(confident, DecodeConfig(audio_confidence=0.0)).view_weights == (2.5, 0.75, 0.0)
    # the views searched besides the fused input: video with a weight, audio with the confidence check
    assert searched_views((2.5, 0.75, 2.0)) == ("video", "audio")
    assert searched_views((2.5, 0.75, 0.0)) == searched_views((2.5, 0.0, 2.0)) == ("video",)
    assert searched_views((0.0, 0.75, 2.0)) == ("audio",) and searched_views((0.0, 0.0, 0.0)) == ()
    assert searcher(gated).config.video_weight == 2.5  # no config given: the checkpoint's decode section
    assert Searcher(gated, DecodeConfig()).view_weights == (0, 0, 0)  # the model itself holds no defaults
    assert not hasattr(gated, "decode_defaults") and not hasattr(gated, "decode")
    fairseq_like = _model(decode_defaults=None)
    assert searcher(fairseq_like, FairseqConfig()).view_weights == (0.0, 0.0, 0.0)
    with pytest.raises(ConfigError, match="decode_defaults: unknown config key .vido_weight."):
        _model(decode_defaults={"vido_weight": 1.0})
    # the defaults travel in the model configuration, so in every checkpoint's model_config
    model = AVSRModel.from_config({**_config_dict(), "decode_defaults": tuned})
    assert checkpoint_decode_defaults(model.config.to_dict()) == tuned
    audio, video = _inputs()
    with torch.no_grad():  # without a gate the default is the single search of the original
        enc, lens = plain.encode(audio, video, LENS)
        assert searcher(plain, _config()).decode(audio, video, LENS)[0] == \
            Searcher(plain, _config()).search(enc, lens)
    with pytest.raises(ValueError, match="video_weight 1 needs a model with an audio gate"):
        searcher(plain, _config(video_weight=1.0))
    with pytest.raises(ValueError, match="audio_weight 0.5 needs a model with an audio gate"):
        searcher(plain, _config(audio_weight=0.5))


def _config_dict() -> dict:
    return dict(vocab_size=12, encoder_conf=dict(TINY_ENCODER, audio_gate=True), decoder_conf=TINY_DECODER)


def test_bad_weights_and_a_weight_for_the_fairseq_search_are_refused():
    with pytest.raises(ValueError, match="video_weight: expected a finite number >= 0"):
        DecodeConfig(video_weight=-0.5)
    with pytest.raises(ValueError, match="video_weight: expected a finite number >= 0"):
        DecodeConfig(video_weight=float("inf"))
    with pytest.raises(ConfigError, match="video_weight"):
        DecodeConfig.from_mapping({"video_weight": "high"}, "conf/decode/x.yaml")
    with pytest.raises(ValueError, match="audio_weight: expected a finite number >= 0"):
        DecodeConfig(audio_weight=-1.0)
    with pytest.raises(ConfigError, match="video_weight is not used by search 'fairseq'"):
        DecodeConfig.from_mapping({"search": "fairseq", "ctc_weight": 0.0, "video_weight": 1.0})
    with pytest.raises(ConfigError, match="audio_weight is not used by search 'fairseq'"):
        DecodeConfig.from_mapping({"search": "fairseq", "ctc_weight": 0.0, "audio_weight": 1.0})


def test_rescore_with_views_joins_the_lists_without_repeats_and_checks_their_sizes():
    hyp = lambda toks, s: Hypothesis(toks, s, 0.0, 0.0)  # noqa: E731
    table = {(1,): (-1.0, -5.0, -1.0), (2,): (-2.0, -1.0, float("-inf")), (3,): (-4.0, -0.5, -2.0)}

    def score(which):
        def f(cands, index):
            s = torch.tensor([table[tuple(c)][which] for c in cands])
            return s, s, s
        return f

    lists = [[[hyp([1], 0), hyp([2], 0)]], [[hyp([2], 0), hyp([3], 0)]]]
    zero = torch.tensor([0.0])
    out = rescore_with_views(lists, score(0), [(zero, score(1)), (zero, score(2))], nbest=3)
    assert [h.tokens for h in out[0]] == [[1], [2], [3]]  # weights 0: the fused scores alone, no nan of -inf
    one = torch.tensor([1.0])
    out = rescore_with_views(lists, score(0), [(one, score(1))], penalty=0.5, nbest=3)
    assert [h.tokens for h in out[0]] == [[2], [3], [1]]  # -3, -4.5, -6 (+ 1 of length bonus each)
    assert [h.score for h in out[0]] == pytest.approx([-2.0, -3.5, -5.0])
    out = rescore_with_views(lists, score(0), [(one, score(1)), (torch.tensor([0.5]), score(2))], nbest=3)
    assert [h.tokens for h in out[0]] == [[3], [1], [2]]  # -5.5, -6.5, -inf: the audio view vetoes [2]
    assert rescore_with_views([[[]]], score(0), [(one, score(1))]) == [[]]
    with pytest.raises(ValueError, match="must agree"):
        rescore_with_views([lists[0], []], score(0), [(one, score(1))])
    with pytest.raises(ValueError, match="must agree"):
        rescore_with_views(lists, score(0), [(torch.tensor([1.0, 2.0]), score(1))])


def test_rescore_with_views_takes_a_views_own_search_scores_and_scores_only_the_rest():
    # sequence scores per view (att, ctc, weighted): fused 0, video 1, audio 2
    table = {
        (1,): [(-1.0, -2.0, -1.5), (-3.0, -1.0, -2.0), (-0.5, -0.5, -0.5)],
        (2,): [(-2.0, -1.0, -1.5), (-1.0, -1.0, -1.0), (-4.0, -6.0, -5.0)],
        (3, 4): [(-6.0, -2.0, -4.0), (-0.2, -0.4, -0.3), (-1.0, float("-inf"), float("-inf"))],
        (5,): [(-9.0, -9.0, -9.0), (-1.0, -1.0, -1.0), (-0.1, -0.3, -0.2)],
    }
    penalty = 0.5
    calls: dict[int, list[tuple[int, ...]]] = {0: [], 1: [], 2: []}

    def score(view):
        def f(cands, index):
            calls[view].append(tuple(tuple(c) for c in cands))
            return tuple(torch.tensor([table[tuple(c)][view][k] for c in cands]) for k in range(3))
        return f

    def searched(view, keys):  # a view's own search: its hypotheses carry its scores and the length bonus
        return [[Hypothesis(list(k), table[k][view][2] + penalty * (len(k) + 1), *table[k][view][:2])
                 for k in keys]]

    lists = [searched(0, [(1,), (2,)]), searched(1, [(2,), (3, 4)]), searched(2, [(5,)])]
    views = [(torch.tensor([1.0]), score(1)), (torch.tensor([0.5]), score(2))]
    full = rescore_with_views(lists, score(0), views, penalty=penalty, nbest=4)
    assert calls == {0: [((1,), (2,), (3, 4), (5,))], 1: [((1,), (2,), (3, 4), (5,))],
                     2: [((1,), (2,), (3, 4), (5,))]}
    for v in calls:
        calls[v].clear()
    reused = rescore_with_views(lists, score(0), views, penalty=penalty, nbest=4, own_lists=[1, 2])
    assert calls == {0: [((3, 4), (5,))], 1: [((1,), (5,))], 2: [((1,), (2,), (3, 4))]}  # the rest only
    assert [(h.tokens, h.att_score, h.ctc_score) for h in reused[0]] == [
        (h.tokens, h.att_score, h.ctc_score) for h in full[0]]
    assert [h.score for h in reused[0]] == pytest.approx([h.score for h in full[0]])
    assert [h.tokens for h in reused[0]] == [[1], [2], [5], [3, 4]]  # -3.75, -5, -10.1, -inf (+ bonus)
    # a view that scores without a search of its own (None) scores every candidate
    for v in calls:
        calls[v].clear()
    rescore_with_views(lists[:2], score(0), views, penalty=penalty, own_lists=[1, None])
    assert calls[1] == [((1,),)] and calls[2] == [((1,), (2,), (3, 4))]
    with pytest.raises(ValueError, match="own_lists"):
        rescore_with_views(lists, score(0), views, own_lists=[1])
    with pytest.raises(ValueError, match="own_lists"):
        rescore_with_views(lists, score(0), views, own_lists=[0, 3])
