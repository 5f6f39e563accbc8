"""Test helpers: AV-HuBERT checkpoints in the original (fairseq) layout, and independent re-implementations of
the original's computations on the raw state-dict tensors.

Nothing here uses avsr's modules. The layouts and the math follow facebookresearch/av_hubert
(``avhubert/hubert.py``: ``AVHubertModel.extract_finetune``, ``SubModel``; ``resnet.py``; ``hubert_asr.py``;
``decoder.py``; ``sequence_generator.py``) and fairseq (``models/wav2vec/wav2vec2.py``:
``TransformerEncoder``, ``TransformerSentenceEncoderLayer``; ``modules/multihead_attention.py``;
``modules/transformer_layer.py``: ``TransformerDecoderLayer``;
``modules/sinusoidal_positional_embedding.py``; ``utils.make_positions``; ``data/dictionary.py``), written
time-first as fairseq is, with explicit tensor operations.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
from collections import OrderedDict

import torch
import torch.nn.functional as F

PAD, EOS, BOS, UNK = 1, 2, 0, 3
RESNET = [64, 128, 256, 512]


# ----------------------------------------------------------------------------------------------- configs
def pretrain_model_cfg(**kw) -> dict:
    """``cfg.model`` of an ``av_hubert`` checkpoint (AVHubertConfig fields, as to_container writes)."""
    cfg = {
        "_name": "av_hubert", "label_rate": 25, "input_modality": "image", "extractor_mode": "default",
        "encoder_layers": 3, "encoder_embed_dim": 32, "encoder_ffn_embed_dim": 64,
        "encoder_attention_heads": 4,
        "activation_fn": "gelu", "dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.0,
        "encoder_layerdrop": 0.05, "dropout_input": 0.1, "dropout_features": 0.1, "final_dim": 16,
        "untie_final_proj": True, "layer_norm_first": True,
        "conv_feature_layers": "[(512,10,5)] + [(512,3,2)] * 4 + [(512,2,2)] * 2", "conv_bias": False,
        "logit_temp": 0.1, "target_glu": False, "feature_grad_mult": 0.1, "mask_length_audio": 10,
        "mask_prob_audio": 0.8, "mask_length_image": 5, "mask_prob_image": 0.3, "mask_selection": "static",
        "mask_other": 0.0, "no_mask_overlap": False, "mask_min_space": 1, "mask_channel_length": 10,
        "mask_channel_prob": 0.0, "mask_channel_selection": "static", "mask_channel_other": 0.0,
        "no_mask_channel_overlap": False, "mask_channel_min_space": 1, "conv_pos": 8, "conv_pos_groups": 4,
        "latent_temp": [2.0, 0.5, 0.999995], "skip_masked": False, "skip_nomask": False,
        "resnet_relu_type": "prelu", "resnet_weights": None, "sim_type": "cosine", "sub_encoder_layers": 0,
        "audio_feat_dim": 104, "modality_dropout": 0.5, "audio_dropout": 0.5, "modality_fuse": "concat",
        "selection_type": "same_seq", "masking_type": "input", "decoder_embed_dim": 768,
        "decoder_ffn_embed_dim": 3072, "decoder_layers": 6, "decoder_layerdrop": 0.0,
        "decoder_attention_heads": 4, "decoder_learned_pos": False, "decoder_normalize_before": False,
        "no_token_positional_embeddings": False, "decoder_dropout": 0.1, "decoder_attention_dropout": 0.1,
        "decoder_activation_dropout": 0.0, "max_target_positions": 2048,
        "share_decoder_input_output_embed": False, "no_scale_embedding": True,
    }
    cfg.update(kw)
    return cfg


def task_cfg(**kw) -> dict:
    cfg = {"_name": "av_hubert_pretraining", "data": "/data", "labels": ["km"], "label_dir": "/labels",
           "label_rate": 25, "sample_rate": 25, "normalize": True, "enable_padding": False,
           "max_sample_size": 2000, "min_sample_size": 5, "max_trim_sample_size": 2000,
           "single_target": False, "random_crop": False, "pad_audio": True, "pdb": False,
           "stack_order_audio": 4, "skip_verify": False,
           "image_aug": True, "image_crop_size": 88, "image_mean": 0.421, "image_std": 0.165,
           "modalities": ["video", "audio"], "is_s2s": False, "tokenizer_bpe_name": None,
           "tokenizer_bpe_model": None, "noise_wav": None, "noise_prob": 0.0, "noise_snr": "0",
           "noise_num": 1,
           "fine_tuning": False}
    cfg.update(kw)
    return cfg


def full_cfg(model: dict, task: dict | None = None, criterion: dict | None = None) -> dict:
    return {"_name": None, "common": {"fp16": True, "seed": 1337, "user_dir": "/avhubert"},
            "checkpoint": {"save_interval": 2}, "task": task or task_cfg(),
            "criterion": criterion or {"_name": "av_hubert", "pred_masked_weight": 1.0},
            "optimizer": {"_name": "adam", "lr": [0.002]}, "model": model}


def finetune_model_cfg(name: str, w2v_args: dict, **kw) -> dict:
    """``cfg.model`` of a fine-tuned checkpoint (AVHubertAsrConfig / AVHubertSeq2SeqConfig fields)."""
    cfg = {"_name": name, "w2v_path": "/pretrained/base_vox_iter5.pt", "no_pretrained_weights": False,
           "dropout_input": 0.0, "final_dropout": 0.0, "dropout": 0.0, "attention_dropout": 0.0,
           "activation_dropout": 0.1, "apply_mask": False, "mask_length": 10, "mask_prob": 0.75,
           "mask_selection": "static", "mask_other": 0.0, "no_mask_overlap": False, "mask_channel_length": 64,
           "mask_channel_prob": 0.5, "mask_channel_selection": "static", "mask_channel_other": 0.0,
           "no_mask_channel_overlap": False, "freeze_finetune_updates": 0, "feature_grad_mult": 1.0,
           "layerdrop": 0.1, "normalize": True, "data": "/data", "w2v_args": w2v_args}
    if name == "av_hubert_seq2seq":
        cfg.update({"decoder_embed_dim": 32, "decoder_ffn_embed_dim": 48, "decoder_layers": 2,
                    "decoder_layerdrop": 0.0, "decoder_attention_heads": 4, "decoder_learned_pos": False,
                    "decoder_normalize_before": True, "no_token_positional_embeddings": False,
                    "decoder_dropout": 0.1, "decoder_attention_dropout": 0.0,
                    "decoder_activation_dropout": 0.1,
                    "max_target_positions": 2048, "share_decoder_input_output_embed": True,
                    "no_scale_embedding": True})
    cfg.update(kw)
    return cfg


# ------------------------------------------------------------------------------------------ state dicts
def _rand(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _bn(sd: dict, name: str, c: int, g: torch.Generator) -> None:
    sd[f"{name}.weight"] = 1.0 + _rand(g, c, scale=0.1)
    sd[f"{name}.bias"] = _rand(g, c, scale=0.1)
    sd[f"{name}.running_mean"] = _rand(g, c, scale=0.1)
    sd[f"{name}.running_var"] = 0.5 + torch.rand(c, generator=g)
    sd[f"{name}.num_batches_tracked"] = torch.tensor(1234)


def _linear(sd: dict, name: str, out_dim: int, in_dim: int, g: torch.Generator, bias: bool = True) -> None:
    sd[f"{name}.weight"] = _rand(g, out_dim, in_dim, scale=in_dim ** -0.5)
    if bias:
        sd[f"{name}.bias"] = _rand(g, out_dim, scale=0.1)


def _ln(sd: dict, name: str, d: int, g: torch.Generator) -> None:
    sd[f"{name}.weight"] = 1.0 + _rand(g, d, scale=0.1)
    sd[f"{name}.bias"] = _rand(g, d, scale=0.1)


def avhubert_state(cfg: dict, seed: int = 0, prefix: str = "", pretraining: bool = True) -> OrderedDict:
    """A random state dict with exactly the keys and shapes of ``AVHubertModel(cfg).state_dict()``."""
    g = torch.Generator().manual_seed(seed)
    d, f, ffn = cfg["encoder_embed_dim"], cfg["audio_feat_dim"], cfg["encoder_ffn_embed_dim"]
    sd: dict = OrderedDict()
    _linear(sd, "feature_extractor_audio.proj", d, f, g)
    v = "feature_extractor_video.resnet."
    sd[v + "frontend3D.0.weight"] = _rand(g, 64, 1, 5, 7, 7, scale=(5 * 49) ** -0.5)
    _bn(sd, v + "frontend3D.1", 64, g)
    prelu = cfg["resnet_relu_type"] == "prelu"
    if prelu:
        sd[v + "frontend3D.2.weight"] = 0.25 + _rand(g, 64, scale=0.05)
    inplanes = 64
    for layer, planes in enumerate(RESNET, 1):
        for block in range(2):
            name = f"{v}trunk.layer{layer}.{block}."
            cin = inplanes if block == 0 else planes
            sd[name + "conv1.weight"] = _rand(g, planes, cin, 3, 3, scale=(9 * cin) ** -0.5)
            _bn(sd, name + "bn1", planes, g)
            if prelu:
                sd[name + "relu1.weight"] = 0.25 + _rand(g, planes, scale=0.05)
            sd[name + "conv2.weight"] = _rand(g, planes, planes, 3, 3, scale=(9 * planes) ** -0.5)
            _bn(sd, name + "bn2", planes, g)
            if prelu:
                sd[name + "relu2.weight"] = 0.25 + _rand(g, planes, scale=0.05)
            if block == 0 and (layer > 1 or inplanes != planes):
                sd[name + "downsample.0.weight"] = _rand(g, planes, cin, 1, 1, scale=cin ** -0.5)
                _bn(sd, name + "downsample.1", planes, g)
        inplanes = planes
    _linear(sd, "feature_extractor_video.proj", d, 512, g)
    embed = 2 * d if cfg["modality_fuse"] == "concat" else d
    if pretraining:
        sd["mask_emb"] = torch.rand(f, generator=g)
    _ln(sd, "layer_norm", embed, g)
    if embed != d:
        _linear(sd, "post_extract_proj", d, embed, g)
    k, groups = cfg["conv_pos"], cfg["conv_pos_groups"]
    sd["encoder.pos_conv.0.bias"] = _rand(g, d, scale=0.1)
    sd["encoder.pos_conv.0.weight_g"] = 0.5 + torch.rand(1, 1, k, generator=g)
    sd["encoder.pos_conv.0.weight_v"] = _rand(g, d, d // groups, k)
    for i in range(cfg["encoder_layers"]):
        p = f"encoder.layers.{i}."
        for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
            _linear(sd, p + "self_attn." + proj, d, d, g)
        _ln(sd, p + "self_attn_layer_norm", d, g)
        _linear(sd, p + "fc1", ffn, d, g)
        _linear(sd, p + "fc2", d, ffn, g)
        _ln(sd, p + "final_layer_norm", d, g)
    _ln(sd, "encoder.layer_norm", d, g)
    if pretraining:
        final = cfg["final_dim"] or d
        sd["label_embs_concat"] = torch.rand(30, final, generator=g)
        _linear(sd, "final_proj", final * (2 if cfg["untie_final_proj"] else 1), d, g)
    return OrderedDict((prefix + k, t) for k, t in sd.items())


def decoder_state(cfg: dict, vocab: int, seed: int = 1) -> OrderedDict:
    """Keys and shapes of AV-HuBERT's ``TransformerDecoder`` (with its fairseq layers) under ``decoder.``."""
    g = torch.Generator().manual_seed(seed)
    d, ffn = cfg["decoder_embed_dim"], cfg["decoder_ffn_embed_dim"]
    sd: dict = OrderedDict()
    sd["decoder.embed_tokens.weight"] = _rand(g, vocab, d, scale=d ** -0.5)
    sd["decoder.embed_tokens.weight"][PAD] = 0
    sd["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    for i in range(cfg["decoder_layers"]):
        p = f"decoder.layers.{i}."
        for att in ("self_attn", "encoder_attn"):
            for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
                _linear(sd, f"{p}{att}.{proj}", d, d, g)
            _ln(sd, f"{p}{att}_layer_norm", d, g)
        _linear(sd, p + "fc1", ffn, d, g)
        _linear(sd, p + "fc2", d, ffn, g)
        _ln(sd, p + "final_layer_norm", d, g)
    if not cfg["share_decoder_input_output_embed"]:
        sd["decoder.embed_out"] = _rand(g, vocab, d, scale=d ** -0.5)
    if cfg["decoder_normalize_before"]:
        _ln(sd, "decoder.layer_norm", d, g)
    return OrderedDict(sd)


# ------------------------------------------------------------------------------------- fake fairseq classes
@contextlib.contextmanager
def fake_fairseq_modules():
    """Modules ``fairseq.data.dictionary`` and ``fairseq.data.encoders.sentencepiece_bpe`` with classes named
    as fairseq's, so that pickles made here name the same globals as real checkpoints."""
    names = ["fairseq", "fairseq.data", "fairseq.data.dictionary", "fairseq.data.encoders",
             "fairseq.data.encoders.sentencepiece_bpe"]
    saved = {n: sys.modules.get(n) for n in names}
    mods = {n: types.ModuleType(n) for n in names}

    class Dictionary:
        def __init__(self, entries):
            self.bos_word, self.unk_word, self.pad_word, self.eos_word = "<s>", "<unk>", "<pad>", "</s>"
            self.symbols, self.count, self.indices = [], [], {}
            for s in ["<s>", "<pad>", "</s>", "<unk>", *entries]:
                self.indices[s] = len(self.symbols)
                self.symbols.append(s)
                self.count.append(1)
            self.bos_index, self.pad_index, self.eos_index, self.unk_index = 0, 1, 2, 3
            self.nspecial = 4

    class SentencepieceBPE:
        def __init__(self, sp):
            self.sp = sp

    Dictionary.__module__, SentencepieceBPE.__module__ = names[2], names[4]
    Dictionary.__qualname__, SentencepieceBPE.__qualname__ = "Dictionary", "SentencepieceBPE"
    mods[names[2]].Dictionary = Dictionary
    mods[names[4]].SentencepieceBPE = SentencepieceBPE
    sys.modules.update(mods)
    try:
        yield Dictionary, SentencepieceBPE
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


# ------------------------------------------------------------------------------------------- the encoder
def _bn_eval(x, sd, name):
    return F.batch_norm(x, sd[name + ".running_mean"], sd[name + ".running_var"], sd[name + ".weight"],
                        sd[name + ".bias"], training=False, eps=1e-5)


def _act(x, sd, name, relu_type):
    return F.prelu(x, sd[name + ".weight"]) if relu_type == "prelu" else F.relu(x)


def ref_resnet(video, sd, p, relu_type):
    """``ResEncoder.forward``: (B, 1, T, H, W) -> (B, 512, T)."""
    b = video.size(0)
    x = F.conv3d(video, sd[p + "frontend3D.0.weight"], stride=(1, 2, 2), padding=(2, 3, 3))
    x = _act(_bn_eval(x, sd, p + "frontend3D.1"), sd, p + "frontend3D.2", relu_type)
    x = F.max_pool3d(x, kernel_size=(1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
    t = x.size(2)
    x = x.transpose(1, 2).contiguous().reshape(b * t, x.size(1), x.size(3), x.size(4))
    for layer in range(1, 5):
        for block in range(2):
            n = f"{p}trunk.layer{layer}.{block}."
            stride = 2 if (layer > 1 and block == 0) else 1
            out = F.conv2d(x, sd[n + "conv1.weight"], stride=stride, padding=1)
            out = _act(_bn_eval(out, sd, n + "bn1"), sd, n + "relu1", relu_type)
            out = _bn_eval(F.conv2d(out, sd[n + "conv2.weight"], padding=1), sd, n + "bn2")
            res = x
            if n + "downsample.0.weight" in sd:
                res = F.conv2d(x, sd[n + "downsample.0.weight"], stride=stride)
                res = _bn_eval(res, sd, n + "downsample.1")
            x = _act(out + res, sd, n + "relu2", relu_type)
    x = x.mean(dim=(2, 3))
    return x.view(b, t, -1).transpose(1, 2)


def _layer_norm(x, sd, name):
    return F.layer_norm(x, (x.size(-1),), sd[name + ".weight"], sd[name + ".bias"], eps=1e-5)


def _lin(x, sd, name):
    return x @ sd[name + ".weight"].t() + (sd[name + ".bias"] if name + ".bias" in sd else 0.0)


def ref_mha(query, key, sd, name, heads, key_padding_mask=None, attn_mask=None):
    """fairseq ``MultiheadAttention`` (time-first ``(T, B, C)``), eval mode."""
    tq, b, d = query.shape
    ts = key.size(0)
    hd = d // heads
    q = _lin(query, sd, name + ".q_proj") * hd ** -0.5
    k = _lin(key, sd, name + ".k_proj")
    v = _lin(key, sd, name + ".v_proj")
    q = q.contiguous().view(tq, b * heads, hd).transpose(0, 1)
    k = k.contiguous().view(ts, b * heads, hd).transpose(0, 1)
    v = v.contiguous().view(ts, b * heads, hd).transpose(0, 1)
    w = torch.bmm(q, k.transpose(1, 2))
    if attn_mask is not None:
        w = w + attn_mask.unsqueeze(0)
    if key_padding_mask is not None:
        w = w.view(b, heads, tq, ts).masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        w = w.view(b * heads, tq, ts)
    w = torch.softmax(w.float(), dim=-1)
    out = torch.bmm(w, v).transpose(0, 1).contiguous().view(tq, b, d)
    return _lin(out, sd, name + ".out_proj")


def _activation(name):
    return {"gelu": F.gelu, "relu": F.relu}[name]


def ref_encoder(sd, cfg, audio, video, padding_mask=None, output_layer=None, prefix=""):
    """``AVHubertModel.extract_finetune`` in eval mode, ``output_layer`` 1-based as the original.

    audio ``(B, F, T)`` or None, video ``(B, 1, T, H, W)`` or None, padding_mask ``(B, T)`` bool or None.
    Returns ``(B, T, D)``.
    """
    sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    d = cfg["encoder_embed_dim"]
    if audio is not None:
        fa = _lin(audio.transpose(1, 2), sd, "feature_extractor_audio.proj").transpose(1, 2)
    if video is not None:
        fv = ref_resnet(video, sd, "feature_extractor_video.resnet.", cfg["resnet_relu_type"])
        fv = _lin(fv.transpose(1, 2), sd, "feature_extractor_video.proj").transpose(1, 2)
    if audio is None:
        fa = fv.new_zeros(fv.size(0), d, fv.size(-1))
    if video is None:
        fv = fa.new_zeros(fa.size(0), d, fa.size(-1))
    features = torch.cat([fa, fv], dim=1) if cfg["modality_fuse"] == "concat" else fa + fv
    x = _layer_norm(features.transpose(1, 2), sd, "layer_norm")
    if "post_extract_proj.weight" in sd:
        x = _lin(x, sd, "post_extract_proj")
    # fairseq TransformerEncoder.extract_features
    if padding_mask is not None:
        x = x.clone()
        x[padding_mask] = 0
    gw, vw = sd["encoder.pos_conv.0.weight_g"], sd["encoder.pos_conv.0.weight_v"]
    k = vw.size(2)
    norm = vw.permute(2, 0, 1).reshape(k, -1).norm(dim=1).view(1, 1, k)  # torch norm_except_dim(v, 2, dim=2)
    conv = F.conv1d(x.transpose(1, 2), vw * (gw / norm), sd["encoder.pos_conv.0.bias"], padding=k // 2,
                    groups=cfg["conv_pos_groups"])
    if k % 2 == 0:  # SamePad
        conv = conv[:, :, :-1]
    x = x + F.gelu(conv).transpose(1, 2)
    lnf = cfg["layer_norm_first"]
    if not lnf:
        x = _layer_norm(x, sd, "encoder.layer_norm")
    x = x.transpose(0, 1)
    act = _activation(cfg["activation_fn"])
    tgt = None if output_layer is None else output_layer - 1
    for i in range(cfg["encoder_layers"]):
        p = f"encoder.layers.{i}."
        res = x
        if lnf:
            h = _layer_norm(x, sd, p + "self_attn_layer_norm")
            x = res + ref_mha(h, h, sd, p + "self_attn", cfg["encoder_attention_heads"], padding_mask)
            res = x
            h = _layer_norm(x, sd, p + "final_layer_norm")
            x = res + _lin(act(_lin(h, sd, p + "fc1")), sd, p + "fc2")
        else:
            x = ref_mha(x, x, sd, p + "self_attn", cfg["encoder_attention_heads"], padding_mask)
            x = _layer_norm(res + x, sd, p + "self_attn_layer_norm")
            res = x
            h = _lin(act(_lin(x, sd, p + "fc1")), sd, p + "fc2")
            x = _layer_norm(res + h, sd, p + "final_layer_norm")
        if i == tgt:
            break
    x = x.transpose(0, 1)
    if lnf and output_layer is None:
        x = _layer_norm(x, sd, "encoder.layer_norm")
    return x


# ------------------------------------------------------------------------------------------- the decoder
def sinusoidal_table(num: int, dim: int, padding_idx: int) -> torch.Tensor:
    """fairseq ``SinusoidalPositionalEmbedding.get_embedding``."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -step)
    ang = torch.arange(num, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    emb = torch.cat([torch.sin(ang), torch.cos(ang)], dim=1).view(num, -1)
    if dim % 2 == 1:
        emb = torch.cat([emb, torch.zeros(num, 1)], dim=1)
    emb[padding_idx, :] = 0
    return emb


def ref_decoder(sd, cfg, prev_tokens, enc_out, enc_padding_mask):
    """AV-HuBERT ``TransformerDecoder.forward`` (no incremental state), eval mode: logits ``(B, L, V)``.

    ``enc_out`` ``(B, T, C)`` batch-first; ``enc_padding_mask`` ``(B, T)`` bool (True = padded) or None.
    """
    d, heads = cfg["decoder_embed_dim"], cfg["decoder_attention_heads"]
    emb = sd["decoder.embed_tokens.weight"]
    mask = prev_tokens.ne(PAD).int()
    positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + PAD  # utils.make_positions
    table = sinusoidal_table(PAD + 1 + prev_tokens.size(1), d, PAD)
    scale = 1.0 if cfg["no_scale_embedding"] else math.sqrt(d)
    x = scale * emb[prev_tokens] + table[positions]
    x = x.transpose(0, 1)
    enc = enc_out.transpose(0, 1)
    length = x.size(0)
    future = torch.triu(torch.full((length, length), float("-inf")), 1)
    pre = cfg["decoder_normalize_before"]
    for i in range(cfg["decoder_layers"]):
        p = f"decoder.layers.{i}."
        blocks = (("self_attn", None, None, future), ("encoder_attn", enc, enc_padding_mask, None))
        for att, kv, kpm, am in blocks:
            res = x
            h = _layer_norm(x, sd, f"{p}{att}_layer_norm") if pre else x
            h = ref_mha(h, h if kv is None else kv, sd, p + att, heads, kpm, am)
            x = res + h
            if not pre:
                x = _layer_norm(x, sd, f"{p}{att}_layer_norm")
        res = x
        h = _layer_norm(x, sd, p + "final_layer_norm") if pre else x
        x = res + _lin(F.relu(_lin(h, sd, p + "fc1")), sd, p + "fc2")
        if not pre:
            x = _layer_norm(x, sd, p + "final_layer_norm")
    if pre:
        x = _layer_norm(x, sd, "decoder.layer_norm")
    x = x.transpose(0, 1)
    out = emb if cfg["share_decoder_input_output_embed"] else sd["decoder.embed_out"]
    return torch.matmul(x, out.transpose(0, 1))


# ------------------------------------------------------------------------------------------ the generator
def ref_generate(next_logprobs, bsz, beam, vocab, max_len, min_len=1, lenpen=1.0, unkpen=0.0,
                 normalize=True):
    """fairseq ``SequenceGenerator`` + ``search.BeamSearch``, one utterance at a time with Python lists.

    ``next_logprobs(b, prefix)`` gives the ``(V,)`` log-probabilities after ``prefix`` (which starts with
    ``</s>``) for utterance ``b``. Returns per utterance a list of ``(tokens without </s>, score, raw
    score)``, best first.
    """
    beam = min(beam, vocab - 1)
    results = []
    for b in range(bsz):
        beams = [([EOS], 0.0)]  # at step 0 all beams are the same: keep one
        finalized = []
        for step in range(max_len + 1):
            cands = []
            for bi, (toks, score) in enumerate(beams):
                lp = next_logprobs(b, toks).clone()
                lp[lp != lp] = float("-inf")
                lp[PAD] = float("-inf")
                lp[UNK] -= unkpen
                if step >= max_len:
                    keep = lp[EOS].clone()
                    lp[:] = float("-inf")
                    lp[EOS] = keep
                elif step < min_len:
                    lp[EOS] = float("-inf")
                for v in range(vocab):
                    cands.append((score + float(lp[v]), bi * vocab + v, bi, v))
            n_cand = min(2 * beam, len(cands) - 1)
            top = sorted(cands, key=lambda c: (-c[0], c[1]))[:n_cand]
            for s, _, bi, v in top[:beam]:
                if v == EOS and s != float("-inf") and len(finalized) < beam:
                    norm = s / (step + 1) ** lenpen if normalize else s
                    finalized.append((beams[bi][0][1:], norm, s))
            if len(finalized) >= beam or step >= max_len:
                break
            active = [c for c in top if not (c[3] == EOS and c[0] != float("-inf"))][:beam]
            beams = [(beams[bi][0] + [v], s) for s, _, bi, v in active]
        results.append(sorted(finalized, key=lambda h: -h[1]))
    return results
