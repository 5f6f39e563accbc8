"""Official AV-HuBERT checkpoints: safe loading, key mapping, the original's numbers, fairseq's beam search.

Checkpoints are built here in the original layout (fairseq's key names and configuration structure, random
weights, tiny transformer, the original ResNet-18 video front-end) and the outputs are compared with
independent re-implementations of the original's computations (tests/fairseq_reference.py).
"""

from __future__ import annotations

import argparse
import copy
import os

import numpy as np
import pytest
import sentencepiece as spm
import torch
import yaml

from avsr.compat import (
    CheckpointError,
    FairseqDictionary,
    FairseqTokenizer,
    NotAVHubertCheckpointError,
    UnsupportedConfigError,
    read_checkpoint,
)
from avsr.decode.config import DecodeConfig, FairseqConfig
from avsr.encoder import AVHubertEncoder
from avsr.inference.pretrained import AVHUBERT_S2S, checkpoint_decode_defaults
from avsr.models.asr import AVSRModel
from tests import fairseq_reference as ref
from tests.decoding import decode, decode_nbest

B, T, H = 3, 12, 16
LENS = torch.tensor([12, 9, 7])
V = 24  # dictionary size of the tiny seq2seq/CTC models


def inputs(seed: int = 0, lens: torch.Tensor = LENS):
    """Zero-padded audio (B, 104, T) and video (B, 1, T, H, H), as the original collater pads."""
    g = torch.Generator().manual_seed(seed)
    audio = torch.randn(B, 104, T, generator=g)
    video = torch.randn(B, 1, T, H, H, generator=g)
    pad = torch.arange(T)[None, :] >= lens[:, None]
    audio = audio.masked_fill(pad[:, None, :], 0.0)
    video = video.masked_fill(pad[:, None, :, None, None], 0.0)
    return audio, video, pad


def save(obj, path):
    torch.save(obj, path)
    return path


def pretrain_ckpt(tmp_path, name="pt.pt", **model_kw):
    mcfg = ref.pretrain_model_cfg(**model_kw)
    sd = ref.avhubert_state(mcfg)
    ckpt = {"args": None, "cfg": ref.full_cfg(mcfg), "model": sd, "criterion": None,
            "optimizer_history": [{"criterion_name": "AVHubertCriterion", "optimizer_name": "FairseqAdam",
                                   "lr_scheduler_state": {"best": 3.2}, "num_updates": 400000}],
            "task_state": {}, "extra_state": {"metrics": {}, "previous_training_time": 1.0e5}}
    return save(ckpt, tmp_path / name), mcfg, sd


def finetune_ckpt(tmp_path, kind="av_hubert_seq2seq", name="ft.pt", pretrain_kw=None, ft_kw=None,
                  task_state=None):
    pcfg = ref.pretrain_model_cfg(**(pretrain_kw or {}))
    w2v_args = ref.full_cfg(pcfg)
    mcfg = ref.finetune_model_cfg(kind, w2v_args, **(ft_kw or {}))
    prefix = "encoder.w2v_model." if kind == "av_hubert_seq2seq" else "w2v_encoder.w2v_model."
    sd = ref.avhubert_state(pcfg, prefix=prefix)
    del sd[prefix + "final_proj.weight"], sd[prefix + "final_proj.bias"]  # remove_pretraining_modules()
    if kind == "av_hubert_seq2seq":
        sd.update(ref.decoder_state(mcfg, V))
    else:
        g = torch.Generator().manual_seed(5)
        sd["w2v_encoder.proj.weight"] = torch.randn(V, pcfg["encoder_embed_dim"], generator=g) * 0.3
        sd["w2v_encoder.proj.bias"] = torch.randn(V, generator=g) * 0.1
    task = ref.task_cfg(is_s2s=kind == "av_hubert_seq2seq", fine_tuning=True, labels=["wrd"])
    cfg = ref.full_cfg(mcfg, task, {"_name": "label_smoothed_cross_entropy", "label_smoothing": 0.1})
    ckpt = {"args": None, "cfg": cfg, "model": sd, "task_state": task_state or {}, "extra_state": {}}
    return save(ckpt, tmp_path / name), mcfg, pcfg, sd


def train_sentencepiece(tmp_path) -> spm.SentencePieceProcessor:
    """A unigram model with AV-HuBERT's special ids (gen_subword.py: bos 0, pad 1, eos 2, unk 3), at
    ``tmp_path / "sp.model"``."""
    texts = ["bin blue at f two now", "place red by g nine soon", "lay green with c one again"] * 30
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=V, model_type="unigram", bos_id=0, pad_id=1, eos_id=2, unk_id=3,
                                   hard_vocab_limit=False, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))


# --------------------------------------------------------------------------------------------- encoder
def test_pretraining_checkpoint_loads_every_key(tmp_path, caplog):
    path, mcfg, sd = pretrain_ckpt(tmp_path)
    loaded = read_checkpoint(path)
    assert loaded.kind == "av_hubert"
    assert sorted(loaded.ignored) == sorted(["mask_emb", "label_embs_concat", "final_proj.weight",
                                             "final_proj.bias"])
    enc = AVHubertEncoder.from_pretrained(path)
    own = enc.state_dict()
    assert set(own) == set(sd) - set(loaded.ignored)  # no missing, no unexpected key
    for k, v in own.items():
        torch.testing.assert_close(v, sd[k], rtol=0, atol=0)
    assert not enc.training and enc.config.encoder_layers == 3 and enc.config.conv_pos == 8
    assert enc.config.resnet_widths == [64, 128, 256, 512] and enc.config.audio_feat_dim == 104


@pytest.mark.parametrize("variant", [
    dict(),
    dict(layer_norm_first=False, conv_pos=5, modality_fuse="add", resnet_relu_type="relu"),
])
def test_encoder_matches_the_original_for_every_modality_and_layer(tmp_path, variant):
    path, mcfg, sd = pretrain_ckpt(tmp_path, **variant)
    enc = AVHubertEncoder.from_pretrained(path)
    audio, video, pad = inputs()
    valid = ~pad
    for a, v in ((audio, video), (audio, None), (None, video)):
        with torch.no_grad():
            ours, olens, _ = enc({"audio": a, "video": v}, LENS)
            layers, _ = enc.extract_layer_outputs({"audio": a, "video": v}, LENS)
            want = ref.ref_encoder(sd, mcfg, a, v, pad)
            assert torch.equal(olens, LENS)
            torch.testing.assert_close(ours[valid], want[valid], atol=1e-4, rtol=0)
            for i, layer in enumerate(layers, 1):
                want_i = ref.ref_encoder(sd, mcfg, a, v, pad, output_layer=i)
                torch.testing.assert_close(layer[valid], want_i[valid], atol=1e-4, rtol=0)
            # an utterance alone gives the same output as in the padded batch
            alone, _, _ = enc({"audio": None if a is None else a[2:, :, :7],
                               "video": None if v is None else v[2:, :, :7]}, LENS[2:])
            torch.testing.assert_close(alone[0], ours[2, :7], atol=1e-4, rtol=0)


def test_finetuned_checkpoints_hold_the_encoder_under_their_prefix(tmp_path):
    for kind in ("av_hubert_seq2seq", "av_hubert_ctc"):
        path, mcfg, pcfg, sd = finetune_ckpt(tmp_path, kind, name=f"{kind}.pt")
        enc = AVHubertEncoder.from_pretrained(path)
        prefix = "encoder.w2v_model." if kind == "av_hubert_seq2seq" else "w2v_encoder.w2v_model."
        # fine-tuning options replace the pretraining ones; extract_finetune has no modality dropout
        assert enc.config.encoder_layerdrop == 0.1 and enc.config.feature_grad_mult == 1.0
        assert enc.config.modality_dropout == 0.0 and enc.config.dropout == 0.0
        audio, video, pad = inputs(1)
        with torch.no_grad():
            ours, _, _ = enc({"audio": audio, "video": video}, LENS)
        want = ref.ref_encoder(sd, pcfg, audio, video, pad, prefix=prefix)
        torch.testing.assert_close(ours[~pad], want[~pad], atol=1e-4, rtol=0)


# --------------------------------------------------------------------------------------------- seq2seq
@pytest.mark.parametrize("ft_kw", [
    dict(),
    dict(share_decoder_input_output_embed=False, decoder_normalize_before=False, no_scale_embedding=False),
])
def test_seq2seq_decoder_matches_the_original(tmp_path, ft_kw):
    path, mcfg, pcfg, sd = finetune_ckpt(tmp_path, ft_kw=ft_kw)
    model = AVSRModel.from_pretrained(path)
    assert model.decoder is not None and model.ctc_lo is None and not model.training
    assert (model.sos, model.eos, model.pad, model.unk, model.blank) == (2, 2, 1, 3, 0)
    audio, video, pad = inputs(2)
    with torch.no_grad():
        enc, enc_lens = model.encode(audio, video, LENS)
        tokens = torch.cat([torch.full((B, 1), ref.EOS), torch.randint(4, V, (B, 6))], dim=1)
        ours = model.decoder(tokens, enc, ~pad)
    enc_ref = ref.ref_encoder(sd, pcfg, audio, video, pad, prefix="encoder.w2v_model.")
    want = ref.ref_decoder(sd, mcfg, tokens, enc_ref, pad)
    torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)


def test_fairseq_checkpoint_with_pickled_dictionary_and_sentencepiece(tmp_path):
    sp = train_sentencepiece(tmp_path)
    pieces = [sp.id_to_piece(i) for i in range(4, sp.get_piece_size())]
    pieces += [f"extra{i}" for i in range(V - 4 - len(pieces))]
    with ref.fake_fairseq_modules() as (Dictionary, SentencepieceBPE):
        task_state = {"target_dictionary": Dictionary(pieces), "s2s_tokenizer": SentencepieceBPE(sp),
                      "dictionaries": [Dictionary(["1", "2"])]}
        path, *_ = finetune_ckpt(tmp_path, task_state=task_state)
    loaded = read_checkpoint(path)
    assert loaded.dictionary.symbols == ["<s>", "<pad>", "</s>", "<unk>", *pieces]
    model = AVSRModel.from_pretrained(path)
    assert model.token_list == loaded.dictionary.symbols
    # text side, as fairseq: lower-case, pieces looked up; decode drops <s>/<pad>/</s>, joins, ▁ -> space
    tok = FairseqTokenizer(loaded.sentencepiece, FairseqDictionary(model.token_list))
    ids = tok.encode("BIN BLUE AT F TWO NOW")
    assert ids == [loaded.dictionary.index(p) for p in sp.encode("bin blue at f two now", out_type=str)]
    assert tok.decode([ref.EOS, *ids, ref.PAD, ref.EOS]) == "bin blue at f two now"
    assert tok.decode([ref.UNK]) == "<unk>"
    # the gen_subword.py rule gives the same dictionary from the sentencepiece model
    built = FairseqDictionary.from_sentencepiece(sp)
    assert built.symbols == loaded.dictionary.symbols[: len(built)]
    (tmp_path / "dict.txt").write_text("".join(f"{p} 1\n" for p in pieces))
    assert FairseqDictionary.load(tmp_path / "dict.txt").symbols == loaded.dictionary.symbols


def test_old_sentencepiece_pickles_and_numpy_meters_are_read(tmp_path, monkeypatch):
    texts = ["bin blue at f two now", "place red by g nine soon"] * 30
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=30, hard_vocab_limit=False, minloglevel=2)
    proto = (tmp_path / "sp.model").read_bytes()

    class OldProcessor:  # sentencepiece < 0.2 pickles the serialized model alone
        def __getstate__(self):
            return proto

        def __setstate__(self, state):
            self.proto = state

    OldProcessor.__module__, OldProcessor.__qualname__ = "sentencepiece", "SentencePieceProcessor"
    monkeypatch.setattr(spm, "SentencePieceProcessor", OldProcessor)
    with ref.fake_fairseq_modules() as (Dictionary, SentencepieceBPE):
        task_state = {"s2s_tokenizer": SentencepieceBPE(OldProcessor())}
        path, *_ = finetune_ckpt(tmp_path, task_state=task_state)
        ckpt = torch.load(path, weights_only=False)
        meter = {"val": np.float64(2.5), "sum": np.arange(3.0)}
        ckpt["extra_state"]["metrics"] = {"train": [(0, "loss", "AverageMeter", meter)]}
        save(ckpt, path)
    monkeypatch.undo()
    loaded = read_checkpoint(path)
    assert loaded.sentencepiece == proto


def _generate_both(model, sd, mcfg, pcfg, audio, video, pad, cfg: DecodeConfig):
    ours = decode_nbest(model, audio, video, LENS, cfg)
    enc_ref = ref.ref_encoder(sd, pcfg, audio, video, pad, prefix="encoder.w2v_model.")

    def next_logprobs(b, prefix):
        logits = ref.ref_decoder(sd, mcfg, torch.tensor([prefix]), enc_ref[b: b + 1], pad[b: b + 1])
        return torch.log_softmax(logits[0, -1].float(), dim=-1)

    src_len = audio.shape[1] if audio is not None else T  # the original generator's source length
    max_len = min(int(cfg.max_len_a * src_len + cfg.max_len_b), 2048 - 1)
    want = ref.ref_generate(next_logprobs, B, cfg.beam_size, V, max_len, cfg.min_len, cfg.lenpen, cfg.unkpen,
                            cfg.normalize_scores)
    return ours, want


@pytest.mark.parametrize("beam,lenpen,modality", [(1, 1.0, "av"), (1, 1.0, "video"), (4, 1.0, "video"),
                                                  (4, 0.3, "av"), (3, 2.0, "audio")])
def test_fairseq_search_reproduces_the_original_generator(tmp_path, beam, lenpen, modality):
    path, mcfg, pcfg, sd = finetune_ckpt(
        tmp_path, ft_kw=dict(no_scale_embedding=False, share_decoder_input_output_embed=False))
    # give </s> a logit of about +2.5 (p ~ 0.25) so that hypotheses end at different lengths
    g = torch.Generator().manual_seed(7)
    bias = torch.nn.functional.normalize(torch.randn(mcfg["decoder_embed_dim"], generator=g), dim=0) * 1.5
    sd["decoder.layer_norm.bias"] = bias
    sd["decoder.embed_out"][ref.EOS] = 1.0 * bias / bias.pow(2).sum()
    torch.save({**torch.load(path, weights_only=False), "model": sd}, path)
    model = AVSRModel.from_pretrained(path)
    audio, video, pad = inputs(3)
    audio = audio if modality in ("av", "audio") else None
    video = video if modality in ("av", "video") else None
    cfg = FairseqConfig(ctc_weight=0.0, beam_size=beam, nbest=beam, lenpen=lenpen,
                       max_len_a=0.05 if audio is not None else 0.5, max_len_b=1, unkpen=0.5)
    ours, want = _generate_both(model, sd, mcfg, pcfg, audio, video, pad, cfg)
    lengths = set()
    for hyps, ref_hyps in zip(ours, want):
        assert [h.tokens for h in hyps] == [list(t) for t, _, _ in ref_hyps]
        for h, (_, score, raw) in zip(hyps, ref_hyps):
            assert h.score == pytest.approx(score, abs=1e-4) and h.att_score == pytest.approx(raw, abs=1e-4)
            lengths.add(len(h.tokens))
    assert len(lengths) > 1 or beam == 1  # the search really ended hypotheses at several lengths
    # the best hypotheses; a converted seq2seq model's checkpoint decodes as the original by default
    overrides = dict(beam_size=beam, lenpen=lenpen, max_len_a=cfg.max_len_a, max_len_b=1, unkpen=0.5)
    assert checkpoint_decode_defaults(model.config.to_dict()) == AVHUBERT_S2S
    assert decode(model, audio, video, LENS, **overrides) == [list(w[0][0]) for w in want]


def test_fairseq_search_requires_attention_only_and_checks_lengths(tmp_path):
    with pytest.raises(ValueError, match="ctc_weight"):
        FairseqConfig(ctc_weight=0.3)
    path, *_ = finetune_ckpt(tmp_path)
    model = AVSRModel.from_pretrained(path)
    audio, video, _ = inputs()
    with pytest.raises(ValueError, match="min_len"):
        cfg = FairseqConfig(ctc_weight=0.0, max_len_b=0, min_len=1)
        decode(model, audio, video, LENS, cfg)


# ------------------------------------------------------------------------------------------------- CTC
def test_ctc_checkpoint_gives_the_original_logits(tmp_path):
    path, mcfg, pcfg, sd = finetune_ckpt(tmp_path, "av_hubert_ctc")
    model = AVSRModel.from_pretrained(path)
    assert model.decoder is None and model.ctc_lo is not None and model.blank == 0
    audio, video, pad = inputs(4)
    with torch.no_grad():
        enc, _ = model.encode(audio, video, LENS)
        ours = model.ctc_lo(enc)
    want = ref.ref_encoder(sd, pcfg, audio, video, pad, prefix="w2v_encoder.w2v_model.")
    want = want @ sd["w2v_encoder.proj.weight"].t() + sd["w2v_encoder.proj.bias"]
    torch.testing.assert_close(ours[~pad], want[~pad], atol=1e-4, rtol=0)
    assert checkpoint_decode_defaults(model.config.to_dict()) == {"ctc_weight": 1.0}  # CTC-only: CTC search
    hyps = decode(model, audio, video, LENS, DecodeConfig(ctc_weight=1.0, beam_size=2))
    assert all(ref.PAD not in h and 0 not in h for h in hyps)


# --------------------------------------------------------------------------- key variants, args, own files
def test_legacy_key_layouts_map_onto_the_same_model(tmp_path):
    path, mcfg, sd = pretrain_ckpt(tmp_path)
    legacy = copy.copy(sd)
    for i in range(mcfg["encoder_layers"]):  # fairseq's old packed in_proj (rows q, k, v)
        p = f"encoder.layers.{i}.self_attn."
        legacy[p + "in_proj_weight"] = torch.cat([legacy.pop(p + f"{x}_proj.weight") for x in "qkv"])
        legacy[p + "in_proj_bias"] = torch.cat([legacy.pop(p + f"{x}_proj.bias") for x in "qkv"])
    g = legacy.pop("encoder.pos_conv.0.weight_g")  # torch's parametrized weight norm
    legacy["encoder.pos_conv.0.parametrizations.weight.original0"] = g
    legacy["encoder.pos_conv.0.parametrizations.weight.original1"] = legacy.pop("encoder.pos_conv.0.weight_v")
    for k in [k for k in legacy if k.endswith("num_batches_tracked")]:  # torch < 0.4.1
        del legacy[k]
    # the pre-Hydra layout: a flat argparse Namespace instead of cfg
    args = argparse.Namespace(arch="av_hubert", task="av_hubert_pretraining", lr=[0.002], normalize=True,
                              **{k: v for k, v in mcfg.items() if k != "_name"})
    old = {"args": args, "model": legacy, "optimizer_history": [], "extra_state": {}}
    path2 = save(old, tmp_path / "l.pt")
    a, b = AVHubertEncoder.from_pretrained(path), AVHubertEncoder.from_pretrained(path2)
    for k, v in a.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            torch.testing.assert_close(b.state_dict()[k], v, rtol=0, atol=0)


def test_own_checkpoints_round_trip(tmp_path):
    conf = {"vocab_size": 9,
            "encoder_conf": dict(encoder_layers=1, encoder_embed_dim=16, encoder_ffn_embed_dim=32,
                                 encoder_attention_heads=2, conv_pos=4, conv_pos_groups=2,
                                 resnet_widths=[4, 8, 8, 8]),
            "decoder_conf": dict(decoder_layers=1, decoder_embed_dim=16, decoder_ffn_embed_dim=32,
                                 decoder_attention_heads=2),
            "model_conf": {"ctc_weight": 0.3}}
    torch.manual_seed(0)
    model = AVSRModel.from_config(conf).eval()
    path = save({"model": model.state_dict(), "model_config": conf, "epoch": 3, "valid": {"acc": 0.5}},
                tmp_path / "epoch3.pt")
    again = AVSRModel.from_pretrained(path)
    enc = AVHubertEncoder.from_pretrained(path)
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v)
    for k, v in model.encoder.state_dict().items():
        assert torch.equal(enc.state_dict()[k], v)


def test_convert_cli_writes_checkpoint_and_yaml(tmp_path, capsys):
    from avsr.bin.convert import main

    src, mcfg, pcfg, sd = finetune_ckpt(tmp_path)
    main([str(src), str(tmp_path / "out" / "model.pt")])
    assert capsys.readouterr().out.strip().endswith("model.pt")
    conf = yaml.safe_load((tmp_path / "out" / "model.yaml").read_text())
    assert conf["vocab_size"] == V and conf["model_conf"]["token_convention"] == "fairseq"
    assert conf["decoder_conf"]["no_scale_embedding"] is True and len(conf["token_list"]) == V
    ckpt = torch.load(tmp_path / "out" / "model.pt", weights_only=True)
    assert set(ckpt) >= {"model", "model_config"} and ckpt["model_config"] == conf
    a, b = AVSRModel.from_pretrained(src), AVSRModel.from_pretrained(tmp_path / "out" / "model.pt")
    audio, video, _ = inputs(5)
    cfg = FairseqConfig(ctc_weight=0.0, beam_size=3, max_len_a=0.05, max_len_b=2)
    assert decode(a, audio, video, LENS, cfg) == decode(b, audio, video, LENS, cfg)
    assert AVSRModel.from_yaml(tmp_path / "out" / "model.yaml").decoder.position_offset == 2
    # a pretraining checkpoint converts to an encoder alone
    pt, *_ = pretrain_ckpt(tmp_path)
    main([str(pt), str(tmp_path / "enc.pt"), "--config", str(tmp_path / "enc_conf.yaml")])
    enc = AVHubertEncoder.from_pretrained(tmp_path / "enc.pt")
    enc2 = AVHubertEncoder.from_yaml(tmp_path / "enc_conf.yaml")
    assert enc2.config == enc.config


# ---------------------------------------------------------------------------------------------- errors
def test_errors_name_the_file_and_the_field(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_checkpoint(tmp_path / "missing.pt")
    path, mcfg, sd = pretrain_ckpt(tmp_path)
    data = path.read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="trunc.pt.*truncated"):
        read_checkpoint(tmp_path / "trunc.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(CheckpointError, match="text.pt"):
        read_checkpoint(tmp_path / "text.pt")
    other = save({"cfg": ref.full_cfg({"_name": "wav2vec2"}), "model": {}}, tmp_path / "w2v.pt")
    with pytest.raises(NotAVHubertCheckpointError, match="'wav2vec2'"):
        AVHubertEncoder.from_pretrained(other)
    with pytest.raises(NotAVHubertCheckpointError, match="not a checkpoint dict"):
        read_checkpoint(save(torch.zeros(3), tmp_path / "tensor.pt"))
    bad, *_ = pretrain_ckpt(tmp_path, name="sub.pt", sub_encoder_layers=2)
    with pytest.raises(UnsupportedConfigError, match="cfg.model.sub_encoder_layers") as e:
        AVHubertEncoder.from_pretrained(bad)
    assert e.value.field == "cfg.model.sub_encoder_layers"
    bad, *_ = finetune_ckpt(tmp_path, name="lp.pt", ft_kw=dict(decoder_learned_pos=True))
    with pytest.raises(UnsupportedConfigError, match="cfg.model.decoder_learned_pos"):
        AVSRModel.from_pretrained(bad)
    bad, *_ = finetune_ckpt(tmp_path, name="dims.pt", pretrain_kw=dict(encoder_ffn_embed_dim=48))
    ckpt = torch.load(bad, weights_only=False)
    ckpt["cfg"]["model"]["w2v_args"]["model"]["encoder_ffn_embed_dim"] = 64
    with pytest.raises(CheckpointError, match="fc1.weight"):
        AVSRModel.from_pretrained(save(ckpt, bad))
    with pytest.raises(CheckpointError, match="no ASR head"):
        AVSRModel.from_pretrained(path)


class Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


class EvilSystem:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


@pytest.mark.parametrize("payload, name", [(Evil(), "print"), (EvilSystem(), "system")])
def test_unsafe_pickles_are_refused(tmp_path, capfd, payload, name):
    from avsr.checkpoint import load_checkpoint

    path, mcfg, sd = pretrain_ckpt(tmp_path)
    ckpt = torch.load(path, weights_only=False)
    ckpt["extra_state"]["payload"] = payload
    evil = save(ckpt, tmp_path / "evil.pt")
    for load in (read_checkpoint, load_checkpoint):
        with pytest.raises(CheckpointError) as err:
            load(evil)
        message = str(err.value)
        assert message.startswith(f"{evil}: holds objects outside the allowed set (") and name in message
        assert "truncated" not in message and "weights_only" not in message and "\n" not in message
    assert "must never run" not in capfd.readouterr().out


# ------------------------------------------------------------------------------------ the decoding tool
def test_decode_tool_takes_an_official_checkpoint_and_its_sentencepiece_model(tmp_path):
    from avsr.bin.decode import main
    from avsr.data.datadir import Utterance, write_datadir
    from avsr.data.media import write_video, write_wav

    sp = train_sentencepiece(tmp_path)
    assert sp.get_piece_size() == V  # so the gen_subword.py dictionary has the model's V entries
    ckpt, *_ = finetune_ckpt(tmp_path)
    g = torch.Generator().manual_seed(0)
    utts = []
    for i, frames in enumerate((10, 7)):
        write_wav(tmp_path / f"u{i}.wav", torch.randn(frames * 640, generator=g) * 0.1)
        pixels = torch.randint(0, 255, (frames, 96, 96), generator=g, dtype=torch.uint8)
        write_video(tmp_path / f"u{i}.mp4", pixels)
        utts.append(Utterance(f"spk_u{i}", "spk", str(tmp_path / f"u{i}.wav"), str(tmp_path / f"u{i}.mp4"),
                              "BIN BLUE", frames))
    write_datadir(tmp_path / "data", utts)
    (tmp_path / "dec.yaml").write_text("search: fairseq\nctc_weight: 0.0\nbeam_size: 2\nmax_len_a: 0.0\n"
                                       "max_len_b: 3\n")
    main(["--checkpoint", str(ckpt), "--bpemodel", str(tmp_path / "sp.model"),
          "--data", str(tmp_path / "data"), "--decode-config", str(tmp_path / "dec.yaml"),
          "--modalities", "audiovisual", "--out", str(tmp_path / "out")])
    hyp = (tmp_path / "out" / "data" / "audiovisual" / "clean" / "hyp").read_text().splitlines()
    assert [line.split()[0] for line in hyp] == ["spk_u0", "spk_u1"]
    # the same hypotheses as the model on the same features, in the original's text convention, upper-cased
    from avsr.data.dataset import AVDataset, collate

    model = AVSRModel.from_pretrained(ckpt, bpemodel=tmp_path / "sp.model")
    batch = collate([AVDataset(utts, None, modalities=["audio", "video"])[i] for i in range(2)])
    ids = decode(model, batch["audio"], batch["video"], batch["lengths"],
                 DecodeConfig.from_yaml(tmp_path / "dec.yaml"))
    tok = FairseqTokenizer(tmp_path / "sp.model")
    want = [f"spk_u{i} {tok.decode(x).upper()}".strip() for i, x in enumerate(ids)]
    assert hyp == want


def test_omegaconf_configuration_is_read_without_omegaconf(tmp_path):
    """tests/data/omegaconf_cfg.pt pickles ``cfg`` as omegaconf 2.0 DictConfigs (structured configs of classes
    in ``avhubert.*``); they are read as inert stand-ins (omegaconf is not installed) and become plain
    data."""
    from pathlib import Path

    from avsr.compat.fairseq_avhubert import _read_fairseq
    from avsr.compat.fairseq_config import checkpoint_config
    from avsr.compat.safe_load import safe_torch_load
    from avsr.models.asr import AVSRModel

    path = Path(__file__).with_name("data") / "omegaconf_cfg.pt"
    ckpt = safe_torch_load(path)
    cfg = checkpoint_config(ckpt, str(path))
    want = {k: v for k, v in ref.pretrain_model_cfg().items() if k != "latent_temp"}
    want["label_rate"] = "${task.label_rate}"  # an unresolved interpolation stays a string
    assert cfg["model"]["w2v_args"]["model"] == want
    assert cfg["model"]["decoder_layers"] == 2 and cfg["task"]["labels"] == ["wrd"]
    # with the weights of the same architecture, the model loads and matches the original
    pcfg, mcfg = ref.pretrain_model_cfg(), ref.finetune_model_cfg("av_hubert_seq2seq", None)
    sd = ref.avhubert_state(pcfg, prefix="encoder.w2v_model.")
    del sd["encoder.w2v_model.final_proj.weight"], sd["encoder.w2v_model.final_proj.bias"]
    sd.update(ref.decoder_state(mcfg, V))
    model = AVSRModel.from_checkpoint(_read_fairseq({**ckpt, "model": sd}, path))
    audio, video, pad = inputs(6)
    tokens = torch.cat([torch.full((B, 1), ref.EOS), torch.randint(4, V, (B, 4))], dim=1)
    with torch.no_grad():
        enc, _ = model.encode(audio, video, LENS)
        ours = model.decoder(tokens, enc, ~pad)
    enc_ref = ref.ref_encoder(sd, pcfg, audio, video, pad, prefix="encoder.w2v_model.")
    torch.testing.assert_close(ours, ref.ref_decoder(sd, mcfg, tokens, enc_ref, pad), atol=1e-4, rtol=0)
