"""Official AV-HuBERT checkpoints (fairseq) and avsr's own: read and map state-dict keys onto avsr's names.

The modules are built by their own classes (``AVHubertEncoder.from_checkpoint``,
``AVSRModel.from_checkpoint``), which import this module; it imports none of them.

Layouts of the original (facebookresearch/av_hubert ``avhubert/hubert.py``, ``hubert_asr.py``,
``decoder.py``; fairseq ``wav2vec2.py``, ``multihead_attention.py``, ``transformer_layer.py``,
``sinusoidal_positional_embedding.py``):

* ``av_hubert`` (pretraining): the encoder's parameters at the top of ``model`` plus the pretraining-only
  ``mask_emb``, ``final_proj.*``, ``label_embs_concat`` (and ``target_glu.*`` when configured);
* ``av_hubert_seq2seq``: the pretraining model under ``encoder.w2v_model.`` and the transformer decoder under
  ``decoder.`` (``embed_tokens``, ``embed_out`` unless the output projection is tied to the embedding,
  ``embed_positions._float_tensor`` -- a dtype buffer --, ``layers.N.*``, ``layer_norm``);
* ``av_hubert_ctc``: the pretraining model under ``w2v_encoder.w2v_model.`` and the CTC projection
  ``w2v_encoder.proj``.

avsr's module names are the original's, so the key mapping is the identity except for the rules listed in
:data:`KEY_RULES`. Everything in the file is accounted for: a key is mapped, or ignored by a listed rule
(and reported), or it is an error.

Licence: the official AV-HuBERT checkpoints are Meta's, under the AV-HuBERT License Agreement
(non-commercial research use only), not under avsr's Apache-2.0 licence; reading, converting or fine-tuning
one with avsr does not change their terms. The agreement: https://github.com/facebookresearch/av_hubert/blob/main/LICENSE
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from avsr.compat.dictionary import FairseqDictionary, FairseqTokenizer
from avsr.compat.fairseq_config import (
    NotAVHubertCheckpointError,
    checkpoint_config,
    decoder_conf_from_cfg,
    encoder_conf_from_cfg,
    model_name,
)
from avsr.compat.safe_load import (
    CheckpointError,
    PickledDictionary,
    PickledSentencePieceModel,
    safe_torch_load,
)

logger = logging.getLogger(__name__)

__all__ = [
    "KEY_RULES",
    "LoadedCheckpoint",
    "read_checkpoint",
    "map_encoder_state",
    "map_decoder_state",
    "load_state_strict",
    "resolve_token_list",
    "tokenizer_for",
]

#: fairseq model name -> prefix of the pretraining model's keys.
ENCODER_PREFIX = {
    "av_hubert": "",
    "av_hubert_seq2seq": "encoder.w2v_model.",
    "av_hubert_ctc": "w2v_encoder.w2v_model.",
}

#: The key-mapping rules, in words (the code below implements exactly these).
KEY_RULES = (
    "encoder: '<prefix>NAME' -> 'NAME' for every parameter and buffer of AVHubertEncoder (prefix '' for "
    "av_hubert, 'encoder.w2v_model.' for av_hubert_seq2seq, 'w2v_encoder.w2v_model.' for av_hubert_ctc)",
    "encoder: 'encoder.pos_conv.0.parametrizations.weight.original0|original1' (torch's parametrized weight "
    "norm) -> 'encoder.pos_conv.0.weight_g|weight_v'",
    "encoder and decoder: '*.in_proj_weight|in_proj_bias' (fairseq's legacy packed projection, rows q|k|v) "
    "-> '*.q_proj|k_proj|v_proj.weight|bias'",
    "encoder: BatchNorm 'num_batches_tracked' missing (checkpoints of torch < 0.4.1) -> 0",
    "encoder: ignored, reported: 'mask_emb', 'label_embs_concat', 'final_proj.*', 'target_glu.*' "
    "(pretraining only)",
    "decoder: 'decoder.NAME' -> 'decoder.NAME' (embed_tokens, layers.N.*, layer_norm)",
    "decoder: 'decoder.embed_out' (V, D) -> 'decoder.output_projection.weight'; with "
    "share_decoder_input_output_embed, output_projection.weight is decoder.embed_tokens.weight",
    "decoder: ignored, reported: 'decoder.embed_positions._float_tensor' (sinusoidal positions are "
    "computed), '*.version'",
    "ctc: 'w2v_encoder.proj.weight|bias' -> 'ctc_lo.weight|bias'",
)

ENCODER_IGNORED_KEYS = ("mask_emb", "label_embs_concat")
ENCODER_IGNORED_PREFIXES = ("final_proj.", "target_glu.")
BUFFER_IGNORED_SUFFIXES = ("_float_tensor", ".version")


@dataclass
class LoadedCheckpoint:
    """A checkpoint read and mapped onto avsr's names, before any module is built.

    Attributes:
        path: the file.
        kind: ``av_hubert``, ``av_hubert_seq2seq``, ``av_hubert_ctc`` (fairseq) or ``avsr`` (own).
        encoder_conf: ``AVHubertEncoder`` options (complete).
        encoder_state: the encoder's state dict in avsr names.
        model_config: for avsr ASR checkpoints, and fairseq fine-tuned ones, the ``AVSRModel.from_config``
            mapping (``token_list`` filled in later by ``AVSRModel.from_checkpoint``); None for encoders.
        model_state: the ``AVSRModel`` state dict (ASR checkpoints), else None.
        dictionary: the fairseq target dictionary pickled in ``task_state`` (seq2seq/ctc), or None.
        sentencepiece: the sentencepiece model pickled in ``task_state.s2s_tokenizer`` (bytes), or None.
        task: the fairseq task configuration (``normalize``, ``image_crop_size``, ...), ``{}`` for avsr files.
        ignored: keys of the file that were deliberately not loaded (see :data:`KEY_RULES`).
        data_stats: what an avsr trainer recorded about its training data (``max_frames``: the longest
            utterance in 25 fps frames), ``{}`` otherwise.
    """

    path: Path
    kind: str
    encoder_conf: dict[str, Any]
    encoder_state: dict[str, Tensor]
    model_config: dict[str, Any] | None = None
    model_state: dict[str, Tensor] | None = None
    dictionary: FairseqDictionary | None = None
    sentencepiece: bytes | None = None
    task: dict[str, Any] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    data_stats: dict[str, Any] = field(default_factory=dict)


def _split_in_proj(name: str, value: Tensor, out: dict[str, Tensor]) -> bool:
    """Rule: ``*.in_proj_weight|bias`` (rows q, k, v) -> ``*.{q,k,v}_proj.weight|bias``. True if applied."""
    for suffix, kind in (("in_proj_weight", "weight"), ("in_proj_bias", "bias")):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if value.size(0) % 3:
                raise CheckpointError(f"{name}: packed projection of {value.size(0)} rows is not 3 x D")
            for part, chunk in zip(("q", "k", "v"), value.chunk(3, dim=0)):
                out[f"{base}{part}_proj.{kind}"] = chunk.clone()
            return True
    return False


def map_encoder_state(
    state: Mapping[str, Any], prefix: str, where: str
) -> tuple[dict[str, Tensor], list[str]]:
    """The pretraining model's keys under ``prefix``, mapped onto ``AVHubertEncoder``'s names.

    Args:
        state: the checkpoint's ``model`` state dict.
        prefix: ``""``, ``"encoder.w2v_model."`` or ``"w2v_encoder.w2v_model."``.
        where: the file, for messages.

    Returns:
        ``(encoder_state, ignored_keys)`` (ignored keys with their full name).

    Raises:
        CheckpointError: a value that is not a tensor, or a packed projection that is not 3 x D.
    """
    out: dict[str, Tensor] = {}
    ignored: list[str] = []
    for full, value in state.items():
        if not full.startswith(prefix):
            continue
        name = full[len(prefix):]
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{where}: model[{full!r}] is a {type(value).__name__}, not a tensor")
        if (name in ENCODER_IGNORED_KEYS or name.startswith(ENCODER_IGNORED_PREFIXES)
                or name.endswith(BUFFER_IGNORED_SUFFIXES)):
            ignored.append(full)
        elif name.endswith("pos_conv.0.parametrizations.weight.original0"):
            out[name.replace("parametrizations.weight.original0", "weight_g")] = value
        elif name.endswith("pos_conv.0.parametrizations.weight.original1"):
            out[name.replace("parametrizations.weight.original1", "weight_v")] = value
        elif not _split_in_proj(name, value, out):
            out[name] = value
    return out, ignored


def map_decoder_state(
    state: Mapping[str, Any], share: bool, where: str
) -> tuple[dict[str, Tensor], list[str]]:
    """AV-HuBERT's decoder keys (``decoder.*``) mapped onto ``AVSRModel.decoder`` names (still prefixed
    ``decoder.``).

    Raises:
        CheckpointError: no ``decoder.embed_tokens.weight``; an untied model without ``decoder.embed_out``; a
            value that is not a tensor.
    """
    out: dict[str, Tensor] = {}
    ignored: list[str] = []
    for full, value in state.items():
        if not full.startswith("decoder."):
            continue
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{where}: model[{full!r}] is a {type(value).__name__}, not a tensor")
        if full.endswith(BUFFER_IGNORED_SUFFIXES):
            ignored.append(full)
        elif full == "decoder.embed_out":
            out["decoder.output_projection.weight"] = value
        elif not _split_in_proj(full, value, out):
            out[full] = value
    if "decoder.embed_tokens.weight" not in out:
        raise CheckpointError(f"{where}: no decoder.embed_tokens.weight in an av_hubert_seq2seq checkpoint")
    if share:
        out["decoder.output_projection.weight"] = out["decoder.embed_tokens.weight"]
    elif "decoder.output_projection.weight" not in out:
        raise CheckpointError(
            f"{where}: share_decoder_input_output_embed is false but decoder.embed_out is missing"
        )
    return out, ignored


def _resnet_widths(state: Mapping[str, Tensor]) -> list[int]:
    """The video ResNet's stage widths, read from the weights (ResNet-18's 64-128-256-512 in the original)."""
    widths = []
    for i in range(1, 5):
        w = state.get(f"feature_extractor_video.resnet.trunk.layer{i}.0.conv1.weight")
        if w is None:
            return [64, 128, 256, 512]
        widths.append(int(w.shape[0]))
    return widths


def _read_fairseq(ckpt: Mapping[str, Any], path: Path) -> LoadedCheckpoint:
    where = str(path)
    cfg = checkpoint_config(ckpt, where)
    kind = model_name(cfg, where)
    state = ckpt.get("model")
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{where}: 'model' is not a state dict ({type(state).__name__})")
    enc_conf = encoder_conf_from_cfg(cfg, where)
    enc_state, ignored = map_encoder_state(state, ENCODER_PREFIX[kind], where)
    if not enc_state:
        raise CheckpointError(
            f"{where}: no encoder parameter under '{ENCODER_PREFIX[kind]}' in a {kind} checkpoint"
        )
    enc_conf["resnet_widths"] = _resnet_widths(enc_state)
    proj = enc_state.get("feature_extractor_audio.proj.weight")
    if proj is not None:
        found = int(proj.shape[1])
        if enc_conf["audio_feat_dim"] not in (-1, found):
            raise CheckpointError(
                f"{where}: audio_feat_dim is {enc_conf['audio_feat_dim']} in the configuration but "
                f"feature_extractor_audio.proj takes {found} features"
            )
        enc_conf["audio_feat_dim"] = found
    task = dict((cfg.get("model", {}).get("w2v_args") or {}).get("task") or {}) if kind != "av_hubert" else {}
    task.update(cfg.get("task") or {})
    loaded = LoadedCheckpoint(path, kind, enc_conf, enc_state, task=task, ignored=ignored)

    used = {k for k in state if k.startswith(ENCODER_PREFIX[kind])}
    model_state: dict[str, Tensor] = {f"encoder.{k}": v for k, v in enc_state.items()}
    if kind == "av_hubert_seq2seq":
        dec_conf = decoder_conf_from_cfg(cfg, where)
        share = bool(dec_conf["share_decoder_input_output_embed"])
        dec_state, dec_ignored = map_decoder_state(state, share, where)
        loaded.ignored += dec_ignored
        used |= {k for k in state if k.startswith("decoder.")}
        model_state.update(dec_state)
        vocab = int(dec_state["decoder.embed_tokens.weight"].shape[0])
        model_conf = {"ctc_weight": 0.0}
    elif kind == "av_hubert_ctc":
        dec_conf = {}
        for part in ("weight", "bias"):
            key = f"w2v_encoder.proj.{part}"
            if key not in state:
                raise CheckpointError(
                    f"{where}: {key} (the CTC projection) is missing in an av_hubert_ctc checkpoint"
                )
            model_state[f"ctc_lo.{part}"] = state[key]
            used.add(key)
        vocab = int(state["w2v_encoder.proj.weight"].shape[0])
        model_conf = {"ctc_weight": 1.0}
    else:
        vocab, dec_conf, model_conf = None, None, None
    leftover = sorted(k for k in state if k not in used)
    if leftover:
        raise CheckpointError(f"{where}: {len(leftover)} key(s) of this {kind} checkpoint match no rule: "
                              f"{leftover[:8]}")
    if vocab is not None:
        smoothing = (cfg.get("criterion") or {}).get("label_smoothing", 0.1)
        model_conf.update(lsm_weight=float(smoothing) if 0 <= float(smoothing) < 1 else 0.1,
                          token_convention="fairseq")
        loaded.model_config = {"vocab_size": vocab, "encoder_conf": enc_conf, "decoder_conf": dec_conf,
                               "model_conf": model_conf}
        loaded.model_state = model_state
    task_state = ckpt.get("task_state") or {}
    if isinstance(task_state, Mapping):
        if isinstance(task_state.get("target_dictionary"), PickledDictionary):
            loaded.dictionary = FairseqDictionary.from_pickled(task_state["target_dictionary"], where)
        sp = getattr(task_state.get("s2s_tokenizer"), "sp", None)
        if isinstance(sp, PickledSentencePieceModel):
            loaded.sentencepiece = sp.model_proto
    if loaded.ignored:
        logger.info("%s: not loaded (pretraining-only or computed): %s", where, ", ".join(loaded.ignored))
    return loaded


def _read_own(ckpt: Mapping[str, Any], path: Path) -> LoadedCheckpoint:
    where = str(path)
    config, state = ckpt["model_config"], ckpt["model"]
    if not isinstance(config, Mapping) or not isinstance(state, Mapping):
        raise CheckpointError(f"{where}: 'model_config' and 'model' must be mappings")
    stats = ckpt.get("data_stats")
    stats = dict(stats) if isinstance(stats, Mapping) else {}
    if "vocab_size" in config:  # an AVSRModel
        enc_state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        return LoadedCheckpoint(path, "avsr", dict(config.get("encoder_conf") or {}), enc_state,
                                model_config=dict(config), model_state=dict(state), data_stats=stats)
    if "encoder_conf" in config:
        enc_state = dict(state)  # an encoder alone: front-ends at the top level
        if any(k.startswith("encoder.feature_extractor_") for k in state):  # a whole model (e.g. pretraining)
            enc_state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
        return LoadedCheckpoint(path, "avsr", dict(config["encoder_conf"] or {}), enc_state)
    raise NotAVHubertCheckpointError(f"{where}: 'model_config' has neither 'vocab_size' nor 'encoder_conf'")


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Read an AV-HuBERT checkpoint (fairseq ``av_hubert``/``av_hubert_seq2seq``/``av_hubert_ctc``, ``cfg`` or
    ``args`` style) or an avsr one (``model`` + ``model_config``) safely, and map it onto avsr's names.

    Raises:
        FileNotFoundError: no such file.
        avsr.compat.CheckpointError: truncated or not a torch file, a disallowed pickled object, keys no rule
            accounts for; :class:`NotAVHubertCheckpointError` for other models;
            :class:`avsr.compat.UnsupportedConfigError` naming an unsupported configuration field.
    """
    path = Path(path)
    ckpt = safe_torch_load(path, map_location)
    if not isinstance(ckpt, Mapping):
        raise NotAVHubertCheckpointError(f"{path}: holds a {type(ckpt).__name__}, not a checkpoint dict")
    if "model_config" in ckpt and "model" in ckpt:
        return _read_own(ckpt, path)
    return _read_fairseq(ckpt, path)


def load_state_strict(module: torch.nn.Module, state: Mapping[str, Tensor], where: str, what: str) -> None:
    """``load_state_dict`` with BatchNorm counters defaulted, raising :class:`CheckpointError` with the
    missing, unexpected and mis-shaped keys named (``where``: the file; ``what``: e.g. ``encoder``)."""
    state = dict(state)
    own = module.state_dict()
    for key, value in own.items():
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = torch.zeros_like(value)
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        parts = (("missing", missing), ("unexpected", unexpected), ("shape differs", shapes))
        detail = "; ".join(
            f"{name}: {keys[:6]}{' ...' if len(keys) > 6 else ''}" for name, keys in parts if keys
        )
        raise CheckpointError(f"{where}: the {what} does not match its configuration ({detail})")
    module.load_state_dict(state, strict=True)


def resolve_token_list(loaded: LoadedCheckpoint, vocab: int, dictionary: Any = None, bpemodel: Any = None
                       ) -> list[str]:
    """The symbols of a fine-tuned fairseq model's ``vocab`` output ids: from an explicit ``dictionary``
    (fairseq ``dict.txt`` path or :class:`FairseqDictionary`), else the one pickled in ``task_state``, else
    one built from the given or pickled sentencepiece model (AV-HuBERT's ``gen_subword.py`` rule), else
    placeholders (with a warning).

    Raises:
        avsr.compat.CheckpointError: the dictionary's size differs from ``vocab``.
    """
    where = str(loaded.path)
    if dictionary is not None:
        d = dictionary if isinstance(dictionary, FairseqDictionary) else FairseqDictionary.load(dictionary)
        source = f"dictionary {dictionary}"
    elif loaded.dictionary is not None:
        d, source = loaded.dictionary, "the dictionary pickled in task_state"
    elif bpemodel is not None or loaded.sentencepiece is not None:
        d = FairseqTokenizer(bpemodel if bpemodel is not None else loaded.sentencepiece).dictionary
        source = f"sentencepiece model {bpemodel or '(pickled in task_state)'}"
    else:
        logger.warning("%s: no dictionary or sentencepiece model: token symbols are unknown", where)
        return FairseqDictionary.placeholder(vocab).symbols
    if len(d) != vocab:
        raise CheckpointError(f"{where}: {source} has {len(d)} symbols but the model has {vocab} outputs")
    return d.symbols


def tokenizer_for(model: Any, loaded: LoadedCheckpoint, bpemodel: str | os.PathLike | None):
    """The text side of a loaded model: a :class:`FairseqTokenizer` over the model's dictionary for fairseq
    token ids (with ``bpemodel``, else the sentencepiece model pickled in the checkpoint), else avsr's
    ESPnet-style :class:`avsr.data.tokenizer.Tokenizer` (``bpemodel`` required).

    Raises:
        avsr.compat.CheckpointError: fairseq ids but no sentencepiece model given or pickled.
        FileNotFoundError: ``bpemodel`` does not exist.
    """
    if model.conf.token_convention == "fairseq":
        source = bpemodel if bpemodel is not None else loaded.sentencepiece
        if source is None:
            raise CheckpointError(
                f"{loaded.path}: give the sentencepiece model of this checkpoint (--bpemodel)"
            )
        tok = FairseqTokenizer(source, FairseqDictionary(list(model.token_list)))
        tok.check(str(loaded.path))
        return tok
    from avsr.data.tokenizer import Tokenizer

    if bpemodel is None:
        raise CheckpointError(f"{loaded.path}: give the sentencepiece model of this checkpoint (--bpemodel)")
    return Tokenizer(bpemodel)
