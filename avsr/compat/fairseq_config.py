"""The configuration of a fairseq AV-HuBERT checkpoint, read as avsr options.

Sources (facebookresearch/av_hubert): ``AVHubertConfig`` (``avhubert/hubert.py``, model ``av_hubert``),
``AVHubertAsrConfig`` / ``AVHubertSeq2SeqConfig`` (``avhubert/hubert_asr.py``, models ``av_hubert_ctc`` and
``av_hubert_seq2seq``), ``AVHubertPretrainingConfig`` (``avhubert/hubert_pretraining.py``, the task);
fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` / ``_upgrade_state_dict`` for the two ways a
configuration is stored (Hydra ``cfg`` as plain dicts, or the older argparse ``args``).

A fine-tuned checkpoint stores the pretraining configuration in ``cfg.model.w2v_args`` (the encoder's
architecture) and applies its own dropout options to the encoder on top (``HubertEncoder`` /
``AVHubertSeq2Seq.build_model``: ``arg_overrides``); its encoder runs ``extract_finetune``, which applies
no modality dropout.

Every field the original reads is either mapped, accepted as irrelevant to an eval-mode forward
(masking, pretraining losses, paths), or -- where its value changes the network in a way avsr does not
implement -- refused with :class:`UnsupportedConfigError` naming the field.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from avsr.compat.safe_load import CheckpointError, InertObject, PickledObject

logger = logging.getLogger(__name__)

__all__ = [
    "UnsupportedConfigError",
    "NotAVHubertCheckpointError",
    "FAIRSEQ_MODELS",
    "plain",
    "checkpoint_config",
    "model_name",
    "pretraining_model_cfg",
    "encoder_conf_from_cfg",
    "decoder_conf_from_cfg",
]

#: fairseq model names (``cfg.model._name``) of AV-HuBERT checkpoints.
FAIRSEQ_MODELS = ("av_hubert", "av_hubert_seq2seq", "av_hubert_ctc")


class NotAVHubertCheckpointError(CheckpointError):
    """The file is a torch checkpoint, but neither an AV-HuBERT one nor one of avsr's own."""


class UnsupportedConfigError(CheckpointError):
    """The checkpoint's configuration sets a field to a value avsr does not implement.

    Attribute ``field``: the dotted path of the field (e.g. ``cfg.model.w2v_args.model.sub_encoder_layers``).
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


# AVHubertConfig field -> avsr AVHubertEncoderConfig field (same names), with the original's defaults.
ENCODER_FIELDS: dict[str, Any] = {
    "encoder_layers": 12,
    "encoder_embed_dim": 768,
    "encoder_ffn_embed_dim": 3072,
    "encoder_attention_heads": 12,
    "layer_norm_first": False,
    "activation_fn": "gelu",
    "feature_grad_mult": 1.0,
    "dropout": 0.1,
    "dropout_input": 0.0,
    "dropout_features": 0.0,
    "attention_dropout": 0.1,
    "activation_dropout": 0.0,
    "encoder_layerdrop": 0.0,
    "conv_pos": 128,
    "conv_pos_groups": 16,
    "modality_fuse": "concat",
    "modality_dropout": 0.0,
    "audio_dropout": 0.0,
    "audio_feat_dim": -1,
    "resnet_relu_type": "prelu",
}

# AVHubertConfig fields that do not change an eval-mode encoder (masking, pretraining heads and losses,
# wav2vec 2.0 leftovers the model never builds, decoder fields the pretraining model never reads).
ENCODER_IGNORED = {
    "_name", "label_rate", "input_modality", "extractor_mode", "final_dim", "untie_final_proj",
    "conv_feature_layers", "conv_bias", "logit_temp", "target_glu", "mask_length_audio", "mask_prob_audio",
    "mask_length_image", "mask_prob_image", "mask_selection", "mask_other", "no_mask_overlap",
    "mask_min_space", "mask_channel_length", "mask_channel_prob", "mask_channel_selection",
    "mask_channel_other", "no_mask_channel_overlap", "mask_channel_min_space", "latent_temp", "skip_masked",
    "skip_nomask", "resnet_weights", "sim_type", "selection_type", "masking_type", "decoder_embed_dim",
    "decoder_ffn_embed_dim", "decoder_layers", "decoder_layerdrop", "decoder_attention_heads",
    "decoder_learned_pos", "decoder_normalize_before", "no_token_positional_embeddings", "decoder_dropout",
    "decoder_attention_dropout", "decoder_activation_dropout", "max_target_positions",
    "share_decoder_input_output_embed", "no_scale_embedding", "sub_encoder_layers", "layer_type",
    "pos_conv_depth", "required_seq_len_multiple", "checkpoint_activations",
}

# Fields whose value must be the one given, else the network differs from what avsr builds.
ENCODER_REQUIRED = {
    "sub_encoder_layers": (0, "a transformer inside each modality front-end"),
    "layer_type": ("transformer", "a non-transformer encoder layer"),
    "pos_conv_depth": (1, "a multi-layer positional convolution"),
}

# AVHubertAsrConfig / AVHubertSeq2SeqConfig fields.
FINETUNE_FIELDS = {
    "_name", "w2v_path", "no_pretrained_weights", "dropout_input", "final_dropout", "dropout",
    "attention_dropout", "activation_dropout", "apply_mask", "mask_length", "mask_prob", "mask_selection",
    "mask_other", "no_mask_overlap", "mask_channel_length", "mask_channel_prob", "mask_channel_selection",
    "mask_channel_other", "no_mask_channel_overlap", "freeze_finetune_updates", "feature_grad_mult",
    "layerdrop", "normalize", "data", "w2v_args", "decoder_embed_dim", "decoder_ffn_embed_dim",
    "decoder_layers", "decoder_layerdrop", "decoder_attention_heads", "decoder_learned_pos",
    "decoder_normalize_before", "no_token_positional_embeddings", "decoder_dropout",
    "decoder_attention_dropout", "decoder_activation_dropout", "max_target_positions",
    "share_decoder_input_output_embed", "no_scale_embedding", "activation_fn", "mask_min_space",
    "mask_channel_min_space", "checkpoint_activations",
}

# AVHubertSeq2SeqConfig field -> (avsr TransformerDecoderConfig field, the original's default).
DECODER_FIELDS: dict[str, tuple[str, Any]] = {
    "decoder_layers": ("decoder_layers", 6),
    "decoder_embed_dim": ("decoder_embed_dim", 768),
    "decoder_ffn_embed_dim": ("decoder_ffn_embed_dim", 3072),
    "decoder_attention_heads": ("decoder_attention_heads", 4),
    "decoder_normalize_before": ("decoder_normalize_before", False),
    "decoder_dropout": ("dropout", 0.0),
    "decoder_attention_dropout": ("attention_dropout", 0.0),
    "decoder_activation_dropout": ("activation_dropout", 0.0),
    "decoder_layerdrop": ("decoder_layerdrop", 0.0),
    "share_decoder_input_output_embed": ("share_decoder_input_output_embed", False),
    "no_scale_embedding": ("no_scale_embedding", True),
    "max_target_positions": ("max_target_positions", 2048),
}

# fairseq decoder options that would change the network (value avsr implements, what it would change).
DECODER_REQUIRED = {
    "decoder_learned_pos": (False, "learned positional embeddings"),
    "no_token_positional_embeddings": (False, "no positional embeddings"),
    "cross_self_attention": (False, "cross+self attention"),
    "layernorm_embedding": (False, "a LayerNorm on the embeddings"),
    "adaptive_softmax_cutoff": (None, "an adaptive softmax"),
}


def plain(obj: Any) -> Any:
    """``obj`` with every stand-in (``argparse.Namespace``, ...) turned into a plain dict, recursively.

    omegaconf ``DictConfig``/``ListConfig`` stand-ins become their ``_content`` (a dict or list; a string for
    an unresolved interpolation ``${...}`` or a missing ``???`` value), value nodes their ``_val``, and an
    object made from one argument (an enum member) that argument.
    """
    if isinstance(obj, InertObject):
        name, state = obj.pickled_name, vars(obj)
        if name.startswith("omegaconf.") and name.endswith(("DictConfig", "ListConfig")):
            return plain(state.get("_content"))
        if name.startswith("omegaconf.nodes."):
            return plain(state.get("_val"))
        args = state.get("args", ())
        if len(args) == 1 and set(state) == {"args"}:
            return plain(args[0])
        return {k: plain(v) for k, v in state.items() if k != "args"}
    if isinstance(obj, PickledObject):
        return {k: plain(v) for k, v in vars(obj).items()}
    if isinstance(obj, Mapping):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    return obj


def _from_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """A flat argparse ``args`` dict in the Hydra layout: every section sees all the flat options (what
    fairseq's ``convert_namespace_to_omegaconf`` selects from them); the model name is ``arch``."""
    flat = dict(args)
    if isinstance(flat.get("w2v_args"), Mapping) and "model" not in flat["w2v_args"]:
        flat["w2v_args"] = _from_args(flat["w2v_args"])
    name = flat.get("_name") or flat.get("arch")
    return {"model": {**flat, "_name": name}, "task": flat, "criterion": flat, "_from_args": True}


def checkpoint_config(ckpt: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The checkpoint's configuration as plain dicts in the Hydra layout (``model``, ``task``, ...).

    Reads ``ckpt["cfg"]`` (fairseq >= 0.10.2 / Hydra) or else ``ckpt["args"]`` (argparse), whose flat options
    are laid out as every section.

    Raises:
        NotAVHubertCheckpointError: neither is present (message names ``where``).
    """
    cfg = ckpt.get("cfg")
    if cfg is not None:
        cfg = plain(cfg)
        if not isinstance(cfg, Mapping) or not isinstance(cfg.get("model"), Mapping):
            raise NotAVHubertCheckpointError(
                f"{where}: 'cfg' has no 'model' section; not a fairseq checkpoint"
            )
        cfg = dict(cfg)
        model = dict(cfg["model"])
        if isinstance(model.get("w2v_args"), Mapping) and "model" not in model["w2v_args"]:
            model["w2v_args"] = _from_args(model["w2v_args"])  # a Namespace kept inside a Hydra config
        cfg["model"] = model
        return cfg
    args = ckpt.get("args")
    if args is not None:
        args = plain(args)
        if isinstance(args, Mapping):
            return _from_args(args)
    raise NotAVHubertCheckpointError(
        f"{where}: no fairseq 'cfg' or 'args' and no avsr 'model_config'; not an AV-HuBERT checkpoint "
        f"(top-level keys: {sorted(map(str, ckpt))[:12]})"
    )


def model_name(cfg: Mapping[str, Any], where: str) -> str:
    """``cfg.model._name``, checked to be an AV-HuBERT model.

    Raises:
        NotAVHubertCheckpointError: another fairseq model (the message names it).
    """
    name = cfg.get("model", {}).get("_name")
    if name not in FAIRSEQ_MODELS:
        raise NotAVHubertCheckpointError(
            f"{where}: fairseq model {name!r} is not an AV-HuBERT model (expected one of {FAIRSEQ_MODELS})"
        )
    return str(name)


def pretraining_model_cfg(cfg: Mapping[str, Any], where: str) -> tuple[dict[str, Any], str]:
    """The ``AVHubertConfig`` section and its dotted path: ``cfg.model`` for ``av_hubert``, else
    ``cfg.model.w2v_args.model``.

    Raises:
        CheckpointError: a fine-tuned checkpoint without ``w2v_args`` (fairseq would read the pretrained
            checkpoint from ``w2v_path``, which is not part of the file).
    """
    name = model_name(cfg, where)
    if name == "av_hubert":
        return dict(cfg["model"]), "cfg.model"
    w2v = cfg["model"].get("w2v_args")
    if not isinstance(w2v, Mapping) or not isinstance(w2v.get("model"), Mapping):
        raise CheckpointError(
            f"{where}: cfg.model.w2v_args is missing; the encoder architecture of this fine-tuned checkpoint "
            f"is unknown (fairseq would read it from w2v_path={cfg['model'].get('w2v_path')!r})"
        )
    return dict(w2v["model"]), "cfg.model.w2v_args.model"


def _require(
    section: Mapping[str, Any], path: str, required: Mapping[str, tuple[Any, str]], where: str
) -> None:
    for key, (ok, what) in required.items():
        if key in section and section[key] != ok and not (ok in (False, None, 0) and not section[key]):
            raise UnsupportedConfigError(
                f"{where}: {path}.{key} = {section[key]!r} ({what}) is not supported by avsr "
                f"(supported: {ok!r})",
                f"{path}.{key}",
            )


def _warn_unknown(section: Mapping[str, Any], path: str, known: set[str], where: str) -> list[str]:
    unknown = sorted(k for k in section if k not in known)
    if unknown:
        logger.warning("%s: fields of %s unknown to avsr, ignored: %s", where, path, ", ".join(unknown))
    return unknown


def encoder_conf_from_cfg(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``AVHubertEncoder`` options for the checkpoint's encoder (without ``resnet_widths``, which the caller
    reads from the weights, and with ``audio_feat_dim`` possibly -1 when the configuration omits it).

    For fine-tuned checkpoints, the fine-tuning dropouts, layerdrop and ``feature_grad_mult`` replace the
    pretraining ones (as the original's ``arg_overrides``) and modality dropout is 0 (``extract_finetune``).

    Raises:
        UnsupportedConfigError: a field with a value avsr does not implement (named with its path).
        NotAVHubertCheckpointError, CheckpointError: as :func:`pretraining_model_cfg`.
    """
    mcfg, path = pretraining_model_cfg(cfg, where)
    _require(mcfg, path, ENCODER_REQUIRED, where)
    if not cfg.get("_from_args"):
        _warn_unknown(mcfg, path, set(ENCODER_FIELDS) | ENCODER_IGNORED, where)
    conf = {k: mcfg.get(k, default) for k, default in ENCODER_FIELDS.items()}
    for key in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads",
                "conv_pos", "conv_pos_groups", "audio_feat_dim"):
        if isinstance(conf[key], bool) or not isinstance(conf[key], int):
            raise UnsupportedConfigError(
                f"{where}: {path}.{key} must be an integer, got {conf[key]!r}", f"{path}.{key}"
            )
    if model_name(cfg, where) != "av_hubert":
        ft = cfg["model"]
        if not cfg.get("_from_args"):
            _warn_unknown(ft, "cfg.model", FINETUNE_FIELDS, where)
        for src, dst in (("dropout", "dropout"), ("attention_dropout", "attention_dropout"),
                         ("activation_dropout", "activation_dropout"), ("dropout_input", "dropout_input"),
                         ("layerdrop", "encoder_layerdrop"), ("feature_grad_mult", "feature_grad_mult")):
            if src in ft:
                conf[dst] = ft[src]
        conf["modality_dropout"] = 0.0
        conf["audio_dropout"] = 0.0
    return conf


def decoder_conf_from_cfg(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``TransformerDecoderConfig`` options of an ``av_hubert_seq2seq`` checkpoint (``cfg.model``).

    The decoder is AV-HuBERT's ``TransformerDecoder`` (``avhubert/decoder.py``) over fairseq's
    ``TransformerDecoderLayer``: its dropouts are the ``decoder_*dropout`` fields, its activation is fairseq's
    default ``relu`` (the seq2seq configuration has no ``activation_fn``), and the token embedding is scaled
    by ``sqrt(decoder_embed_dim)`` only when ``no_scale_embedding`` is false (AV-HuBERT's default: true).

    Raises:
        UnsupportedConfigError: learned or no positional embeddings, cross-self-attention, ... (named).
    """
    mcfg = cfg["model"]
    _require(mcfg, "cfg.model", DECODER_REQUIRED, where)
    conf = {dst: mcfg.get(src, default) for src, (dst, default) in DECODER_FIELDS.items()}
    conf["activation_fn"] = mcfg.get("activation_fn") or "relu"
    return conf
