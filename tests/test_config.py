"""Typed configuration: every field of every config class refuses values of the wrong type, naming the key,
the value and the file; YAML 1.2 numbers and booleans; value ranges."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import types
import typing

import pytest

import avsr
from avsr.config import ConfigError, from_dict, load_yaml, parse_yaml
from avsr.decode.config import resolve_search_config


def _config_classes() -> list[type]:
    """Every dataclass named ``*Config`` in the package whose fields all have defaults (the classes that
    YAML files and dicts are read into)."""
    found = {}
    for info in pkgutil.walk_packages(avsr.__path__, "avsr."):
        if info.name.startswith("avsr.espnet"):
            continue  # needs espnet
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional extra (mediapipe) that is not installed
            continue
        for value in vars(module).values():
            if (isinstance(value, type) and dataclasses.is_dataclass(value)
                    and value.__name__.endswith("Config") and value.__module__.startswith("avsr")):
                fields = dataclasses.fields(value)
                if all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                       for f in fields):
                    found[f"{value.__module__}.{value.__name__}"] = value
    return [found[k] for k in sorted(found)]


CLASSES = _config_classes()


def test_the_yaml_read_config_classes_are_all_walked():
    names = {c.__name__ for c in CLASSES}
    assert {"AVHubertEncoderConfig", "TransformerDecoderConfig", "AVSRModelConfig", "AVHubertPretrainConfig",
            "DecodeConfig", "FairseqConfig", "TrainConfig", "KMeansConfig"} <= names


def _wrong_values(tp) -> list:
    """Values that a field annotated ``tp`` must refuse."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _wrong_values(inner[0]) if len(inner) == 1 else ["?"]
    if tp is bool:
        return ["yes", "false", 1, [True]]
    if tp is int:
        return ["5", 2.5, True, [1]]
    if tp is float:
        return ["0.5", "3e-3", True, [0.5]]
    if tp is str:
        return [5, ["a"], True]
    if origin in (list, tuple):
        return ["x", 5, {"a": 1}]
    return []


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_refuses_the_wrong_type_naming_key_value_and_file(cls):
    hints = typing.get_type_hints(cls)
    checked = 0
    for f in dataclasses.fields(cls):
        for bad in _wrong_values(hints[f.name]):
            with pytest.raises(ConfigError) as err:
                from_dict(cls, {f.name: bad}, "conf/x.yaml")
            message = str(err.value)
            assert "conf/x.yaml" in message and f.name in message and repr(bad) in message, message
            checked += 1
        # the default itself is accepted
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert getattr(from_dict(cls, {f.name: default}, "conf/x.yaml"), f.name) == default
    assert checked > 0


def test_yaml_numbers_and_booleans_follow_yaml_1_2(tmp_path):
    from avsr.train.config import load_experiment_config

    assert parse_yaml("a: 3e-3\nb: 1e4\nc: yes\nd: true\ne: 5\nf: .5") == {
        "a": 0.003, "b": 10000.0, "c": "yes", "d": True, "e": 5, "f": 0.5}
    path = tmp_path / "train.yaml"
    path.write_text("lr: 3e-3\nwarmup_steps: 1e3\nnoise_snr_db: [0, 5]\nbetas: [0.9, 0.98]\n"
                    "encoder_conf: {encoder_layers: 1}\n")
    cfg = load_experiment_config(path).train
    assert cfg.lr == 0.003 and isinstance(cfg.lr, float)
    assert cfg.warmup_steps == 1000 and isinstance(cfg.warmup_steps, int)
    assert cfg.noise_snr_db == [0.0, 5.0] and cfg.betas == (0.9, 0.98)
    for text, expected in [
        ('noise_snr_db: "5"', "noise_snr_db: expected"),
        ("noise_snr_db: []", "noise_snr_db: expected a non-empty list"),
        ("lr: -0.001", "lr: expected a number > 0, got -0.001"),
        ("noise_prob: 1.5", "noise_prob: expected a probability in [0, 1], got 1.5"),
        ("use_amp: yes", "use_amp: expected true or false, got 'yes'"),
        ("warmup_steps: 2.5", "warmup_steps: expected an integer, got 2.5"),
        ("max_epoch: [3]", "max_epoch: expected an integer, got [3]"),
        ("betas: [0.9]", "betas: expected 2 values"),
        # a key given twice is an error, not the last one silently (PyYAML's own loader keeps the last)
        ("model_conf:\n  ctc_weight: 0.3\n  ctc_weight: 0.5", "key 'ctc_weight' given twice (lines 2 and 3)"),
    ]:
        path.write_text(text + "\n")
        with pytest.raises(ConfigError) as err:
            load_experiment_config(path)
        assert str(path) in str(err.value) and expected in str(err.value), str(err.value)


def test_model_yaml_values_are_typed_and_named_with_the_file(tmp_path):
    from avsr.models.asr import AVSRModel

    path = tmp_path / "model.yaml"
    path.write_text("vocab_size: 10\nencoder_conf:\n  encoder_layers: 1\n  encoder_embed_dim: 16\n"
                    "  encoder_attention_heads: 2\n  conv_pos_groups: 4\n  conv_pos: 4\n"
                    "  resnet_widths: [4, 4, 4, 4]\nmodel_conf:\n  length_normalized_loss: \"false\"\n")
    with pytest.raises(ConfigError) as err:
        AVSRModel.from_yaml(path)
    assert str(path) in str(err.value) and "length_normalized_loss" in str(err.value)
    path.write_text(path.read_text().replace('length_normalized_loss: "false"', "ctc_weight: 1.5"))
    with pytest.raises(ConfigError, match=r"ctc_weight: expected a probability in \[0, 1\], got 1.5"):
        AVSRModel.from_yaml(path)
    path.write_text(path.read_text().replace("ctc_weight: 1.5", "ctc_weight: 0.5").replace(
        "encoder_layers: 1", "encoder_layers: '2'"))
    with pytest.raises(ConfigError, match="encoder_layers: expected an integer, got '2'"):
        AVSRModel.from_yaml(path)


@pytest.mark.parametrize("text", ["", "max_epoch: 3\nlr: 0.001\n", "decoder_conf: {decoder_layers: 1}\n",
                                  "model_config: m.yaml\n"])
def test_a_training_yaml_without_its_model_section_is_refused(tmp_path, text):
    from avsr.train.config import load_experiment_config

    (tmp_path / "m.yaml").write_text("decoder_conf: {decoder_layers: 1}\n")  # a model YAML without encoder
    path = tmp_path / "train.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_experiment_config(path)
    message = str(err.value)
    assert message.startswith(str(path)) and "no model section: encoder_conf is missing" in message, message
    assert "\n" not in message
    if "model_config" in text:
        assert str(tmp_path / "m.yaml") in message, message
    # with its model section it loads
    path.write_text(text + "encoder_conf: {encoder_layers: 1}\n")
    assert load_experiment_config(path).model.encoder_conf.encoder_layers == 1


def test_a_mapping_is_required_where_a_section_is(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_yaml(path)
    from avsr.decode.config import DecodeConfig

    with pytest.raises(ConfigError, match="expected a mapping of DecodeConfig options"):
        from_dict(DecodeConfig, ["beam_size", 3], "somewhere")


def test_decode_fields_that_the_chosen_search_ignores_are_refused(tmp_path):
    from avsr.decode.config import DecodeConfig

    path = tmp_path / "decode.yaml"
    path.write_text("search: fairseq\nctc_weight: 0.0\nbeam_size: 5\npenalty: 1.0\n")
    with pytest.raises(ConfigError, match=r"decode.yaml: penalty is not used by search 'fairseq'"):
        DecodeConfig.from_yaml(path)
    path.write_text("beam_size: 5\nlenpen: 0.5\n")
    with pytest.raises(ConfigError, match=r"lenpen is not used by search 'espnet'.*search: fairseq"):
        DecodeConfig.from_yaml(path)
    path.write_text("beam_size: 5\nctc_scoring: full\n")
    assert DecodeConfig.from_yaml(path).ctc_scoring == "full"
    with pytest.raises(ConfigError, match="max_len_b is not used by search 'espnet'"):
        resolve_search_config(DecodeConfig(), max_len_b=3)
    assert resolve_search_config(DecodeConfig(), beam_size=3).beam_size == 3
    assert resolve_search_config(None, {"beam_size": 4}).beam_size == 4  # the defaults under no config
    assert resolve_search_config({"nbest": 2}, {"beam_size": 4}, beam_size=6) == DecodeConfig(beam_size=6,
                                                                                               nbest=2)
    assert resolve_search_config(DecodeConfig(), {"beam_size": 4}).beam_size == 10  # a config keeps its own


@dataclasses.dataclass
class _Checked(avsr.config.Config):
    """A config class whose rule between fields has a bug: it adds a string to a number."""

    size: int = 1
    name: str = "x"

    def check(self) -> None:
        if self.size > 1:
            self.size + self.name  # noqa: B018 -- the bug: a TypeError while the object is checked


@dataclasses.dataclass
class _Required(avsr.config.Config):
    size: int
    rate: float = 0.5


def test_a_type_error_of_a_check_is_a_bug_not_a_configuration_error():
    """Only the mapping's own errors are ConfigErrors: a TypeError raised while the object is built and
    checked (a rule's bug) reaches the caller as what it is."""
    assert from_dict(_Checked, {"size": 1}, "conf/x.yaml").size == 1
    with pytest.raises(TypeError) as info:
        from_dict(_Checked, {"size": 2}, "conf/x.yaml")
    assert not isinstance(info.value, ConfigError)


def test_a_missing_required_key_is_a_configuration_error_naming_it():
    with pytest.raises(ConfigError, match=r"conf/x.yaml: _Required: .*'size'"):
        from_dict(_Required, {"rate": 0.1}, "conf/x.yaml")
    assert from_dict(_Required, {"size": 3}, "conf/x.yaml").size == 3


@dataclasses.dataclass
class _Unresolvable(avsr.config.Config):
    count: NotImportedAnywhere = 0  # noqa: F821 -- a name only a type checker would know


@dataclasses.dataclass
class _Malformed(avsr.config.Config):
    count: "int +" = 0  # noqa: F722


def test_a_class_whose_types_cannot_be_resolved_says_so(caplog):
    """A type that cannot be found turns that class's type checks off with a warning naming the class (once);
    any other failure to read the annotations is raised, never silently skipped."""
    with caplog.at_level("WARNING", logger="avsr.config"):
        assert from_dict(_Unresolvable, {"count": "five"}, "x.yaml").count == "five"
        from_dict(_Unresolvable, {"count": 2}, "x.yaml")
    warnings = [r for r in caplog.records if "_Unresolvable" in r.getMessage()]
    assert len(warnings) == 1 and "NotImportedAnywhere" in warnings[0].getMessage()
    with pytest.raises(SyntaxError):
        _Malformed(count=1)
