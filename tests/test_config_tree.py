"""One typed configuration tree: ranges live in the field definitions and hold for every construction; a
model's sections are one :class:`ModelConfig`, built once from YAML, that the models' constructors take; a
training YAML is that tree with the loop's settings; resuming compares settings with their defaults filled."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from avsr.config import Config, ConfigError, Rule, from_dict
from avsr.decode.config import DecodeConfig, FairseqConfig
from avsr.encoder import AVHubertEncoderConfig
from avsr.models import AVHubertPretrainModel, AVSRModel
from avsr.models.config import AVHubertPretrainConfig, AVSRModelConfig, ModelConfig
from avsr.nn.decoder import TransformerDecoderConfig
from avsr.train.config import ExperimentConfig, TrainConfig, load_experiment_config, resolved_settings
from avsr.train.experiment import keep_promise
from tests.test_config import CLASSES

TREE = (AVHubertEncoderConfig, TransformerDecoderConfig, AVSRModelConfig, AVHubertPretrainConfig, ModelConfig,
        TrainConfig, DecodeConfig, FairseqConfig)

TINY = {"encoder_conf": {"encoder_layers": 1, "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32,
                         "encoder_attention_heads": 2, "conv_pos": 4, "conv_pos_groups": 4,
                         "resnet_widths": [2, 2, 4, 4]},
        "decoder_conf": {"decoder_layers": 1, "decoder_embed_dim": 16, "decoder_ffn_embed_dim": 32,
                         "decoder_attention_heads": 2}}


def _outside(rule: Rule, default):
    """A value of the field's type that ``rule`` refuses."""
    if rule.choices is not None:
        return ["no-such-choice"] if isinstance(default, (list, tuple)) else "no-such-choice"
    if rule.non_empty:
        return []
    bound = next((b for b in (rule.ge, rule.gt, rule.le, rule.lt) if b is not None), None)
    if bound is None:
        return float("inf")  # finite only
    below = rule.ge is not None or rule.gt is not None
    integral = isinstance(default, int) or (isinstance(default, (list, tuple)) and default
                                            and isinstance(default[0], int))
    value = (bound - 1 if below else bound + 1) if integral else (bound - 0.5 if below else bound + 0.5)
    if isinstance(default, (list, tuple)):
        return [value] * max(1, len(default))
    return value


def test_the_tree_classes_are_configs_and_walked():
    assert all(issubclass(cls, Config) for cls in TREE)
    assert set(TREE) <= set(CLASSES)


@pytest.mark.parametrize("cls", TREE, ids=lambda c: c.__name__)
def test_every_rule_in_a_field_definition_refuses_from_yaml_and_from_python(cls):
    ruled = [f for f in dataclasses.fields(cls) if "rule" in f.metadata]
    assert ruled or cls is ModelConfig
    for f in ruled:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        bad = _outside(f.metadata["rule"], default)
        with pytest.raises(ConfigError) as err:
            from_dict(cls, {f.name: bad}, "conf/x.yaml")
        message = str(err.value)
        assert message.startswith("conf/x.yaml: ") and f"{f.name}: expected" in message, message
        with pytest.raises(ConfigError, match=f"^{f.name}: expected"):
            cls(**{f.name: bad})  # the same check when built from Python: one layer of checks


def test_rules_describe_what_they_expect():
    assert Rule(ge=0, le=1).describe() == "a probability in [0, 1]"
    assert Rule(gt=0).describe() == "a number > 0"
    assert Rule(ge=0, lt=1).describe() == "a number in [0, 1)"
    assert Rule(gt=0, le=1).describe() == "a number in (0, 1]"
    assert Rule(choices=("a", "b")).describe() == "one of ['a', 'b']"
    assert not Rule(ge=1).allows([2, 0]) and Rule(ge=1).allows([2, 1])
    with pytest.raises(ConfigError, match=r"lr: expected a number > 0, got -1.0"):
        TrainConfig(lr=-1.0)
    with pytest.raises(ConfigError, match=r"precision: expected one of \['auto', 'fp32', 'bf16'\]"):
        TrainConfig(precision="fp16")
    assert TrainConfig(betas=[0.9, 0.99]).betas == (0.9, 0.99)  # converted by the field's type


def test_the_model_tree_is_built_once_and_round_trips():
    tree = ModelConfig.from_mapping({"vocab_size": 12, **TINY, "model_conf": {"ctc_weight": 0.5},
                                     "decode_defaults": {"video_weight": 2.0}}, "m.yaml")
    assert isinstance(tree.encoder_conf, AVHubertEncoderConfig) and tree.encoder_conf.encoder_layers == 1
    assert isinstance(tree.model_conf, AVSRModelConfig) and tree.model_conf.ctc_weight == 0.5
    assert ModelConfig.from_mapping(yaml.safe_load(yaml.safe_dump(tree.to_dict()))) == tree
    model = AVSRModel(tree)
    assert model.config.decoder_conf == tree.decoder_conf and model.conf is model.config.model_conf
    assert model.config.decode_defaults == {"video_weight": 2.0} and model.ctc_weight == 0.5
    assert not hasattr(model, "decode_defaults")  # kept for the checkpoint's decode section, not the model's
    full = model.config.to_dict()  # what checkpoints save: every section complete
    assert set(full) == {"vocab_size", "encoder_conf", "decoder_conf", "model_conf", "decode_defaults"}
    assert full["model_conf"]["lsm_weight"] == 0.1 and full["encoder_conf"]["audio_feat_dim"] == 104
    rebuilt = AVSRModel.from_config(full)
    rebuilt.load_state_dict(model.state_dict())  # same architecture


@pytest.mark.parametrize("mapping, match", [
    ({"vocab_size": 10, "pretrain_conf": {}}, "vocab_size: a pretraining model"),
    ({"num_classes": [5], "decoder_conf": {}}, "decoder_conf: a pretraining model"),
    ({"vocab_size": 3, "token_list": ["a", "b"]}, "token_list has 2 entries but vocab_size is 3"),
    ({"vocab_size": 10, "decode_defaults": {"beam_sise": 3}},
     "decode_defaults: unknown config key 'beam_sise'"),
    ({"vocab_size": 10, "decode_defaults": {"beam_size": 0}}, "beam_size: expected a number >= 1"),
    ({"vocab_size": 2}, "vocab_size: expected a number >= 3, got 2"),
    ({"vocab_size": 10, "encoder_conf": {"dropout": 2.0}}, r"encoder_conf: dropout: expected a probability"),
    ({"vocab_size": 10, "model_conf": {"av_batch_views": ["video", "video"]}},
     "av_batch_views: expected distinct"),
    ({"vocab_size": 10, "decoder_cfg": {}}, "unknown config key 'decoder_cfg'"),
])
def test_the_model_tree_refuses_naming_the_key_and_the_file(mapping, match):
    with pytest.raises(ConfigError, match=match) as err:
        ModelConfig.from_mapping(mapping, "conf/model/m.yaml")
    assert str(err.value).startswith("conf/model/m.yaml: ")


def test_the_models_take_the_tree():
    asr = AVSRModel(ModelConfig(vocab_size=7, encoder_conf=TINY["encoder_conf"],
                                decoder_conf=TINY["decoder_conf"]))
    assert asr.vocab_size == 7 and asr.config.model_conf == AVSRModelConfig()
    pre = AVHubertPretrainModel(ModelConfig(encoder_conf=TINY["encoder_conf"], num_classes=5))
    assert pre.num_classes == [5] and pre.conf == AVHubertPretrainConfig()
    with pytest.raises(ConfigError, match="missing 'vocab_size'"):
        AVSRModel(ModelConfig(encoder_conf=TINY["encoder_conf"]))
    with pytest.raises(ConfigError, match="missing 'num_classes'"):
        AVHubertPretrainModel(ModelConfig(encoder_conf=TINY["encoder_conf"], pretrain_conf={}))
    with pytest.raises(ConfigError, match="no ASR head"):
        AVSRModel(ModelConfig(num_classes=[5]))


def test_a_training_yaml_is_the_model_tree_with_the_loop(tmp_path):
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**TINY, "model_conf": {"ctc_weight": 0.4}}))
    path = tmp_path / "t.yaml"
    path.write_text("model_config: m.yaml\nmax_epoch: 2\nencoder_conf: {dropout: 0.2}\n")
    experiment = load_experiment_config(path)
    assert isinstance(experiment, ExperimentConfig) and experiment.train.max_epoch == 2
    assert experiment.model.encoder_conf.dropout == 0.2 and experiment.model.encoder_conf.encoder_layers == 1
    assert experiment.model.model_conf.ctc_weight == 0.4 and experiment.model_path == tmp_path / "m.yaml"
    resolved = experiment.resolved()
    assert resolved["max_epoch"] == 2 and resolved["betas"] == [0.9, 0.98]
    assert resolved["encoder_conf"]["dropout"] == 0.2
    path.write_text("model_config: m.yaml\nencoder_conf: {dropout: 2}\n")  # a bad value: refused on reading
    with pytest.raises(ConfigError, match=r"t\.yaml \(and its model_config .*m\.yaml\): encoder_conf: dropo"):
        load_experiment_config(path)
    path.write_text("model_config: m.yaml\nencoder_conf: 3\n")
    with pytest.raises(ConfigError, match=r"t\.yaml: encoder_conf: expected a mapping, got 3"):
        load_experiment_config(path)


def test_a_pretraining_yaml_leaves_the_asr_sections_of_its_model_yaml_out(tmp_path, caplog):
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({**TINY, "model_conf": {"ctc_weight": 0.4}}))
    path = tmp_path / "p.yaml"
    path.write_text("model_config: m.yaml\npretrain_conf: {mask_prob_audio: 0.5}\n")
    with caplog.at_level("INFO", logger="avsr.train"):
        model = load_experiment_config(path).model
    assert model.pretraining and model.decoder_conf is None and model.model_conf is None
    assert model.pretrain_conf.mask_prob_audio == 0.5
    assert "decoder_conf, model_conf of" in caplog.text and "not used" in caplog.text


def test_resume_compares_settings_with_their_defaults_filled_in(tmp_path):
    """A ``config.yaml`` written with only the given keys (as older versions did) and the same settings
    written in full are the same settings; a changed value is still refused, naming the key."""
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    partial = {"max_epoch": 3, "vocab_size": 7, "encoder_conf": dict(TINY["encoder_conf"])}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(partial))
    model = AVSRModel(ModelConfig.from_mapping({k: v for k, v in partial.items() if k != "max_epoch"}))
    full = resolved_settings(TrainConfig(max_epoch=3), model.config)
    keep_promise(tmp_path, full, allow_change=False)  # no difference
    changed = {**full, "encoder_conf": {**full["encoder_conf"], "dropout": 0.3}}
    with pytest.raises(Exception, match=r"encoder_conf\.dropout: 0\.1 -> 0\.3"):
        keep_promise(tmp_path, changed, allow_change=False)
