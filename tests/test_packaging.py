"""Packaging: the wheel's contents (package discovery, package data), configs by name, the encoder factories.

The installed wheel itself is exercised by ``scripts/wheel_smoke.sh`` (part of the README's test command).
"""

import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import setuptools
import torch

import avsr
from avsr.config import (
    CONFIG_KINDS,
    TRAIN_KINDS,
    ConfigError,
    conf_dir,
    config_path,
    load_yaml,
    shipped_config,
    shipped_configs,
)
from avsr.decode.config import DecodeConfig
from avsr.encoder import AVHubertEncoder
from avsr.models.asr import AVSRModel
from avsr.train.config import load_experiment_config

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "avsr"


def setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    return cfg


def package_data_globs() -> list[str]:
    """The globs of ``[options.package_data] avsr =`` in setup.cfg."""
    value = setup_cfg()["options.package_data"]["avsr"]
    return [line.strip() for line in value.splitlines() if line.strip()]


def test_setup_cfg_discovers_packages_with_find():
    cfg = setup_cfg()
    assert cfg["options"]["packages"].strip() == "find:"
    include = [s.strip() for s in cfg["options.packages.find"]["include"].split(",")]
    assert include == ["avsr", "avsr.*"]


def test_every_directory_of_modules_is_a_discovered_package():
    found = set(setuptools.find_packages(where=str(REPO), include=["avsr", "avsr.*"]))
    with_modules = {
        ".".join(d.relative_to(REPO).parts)
        for d in [PKG, *PKG.rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    }
    assert {"avsr", "avsr.train", "avsr.models", "avsr.corpora.synthgrid"} <= with_modules
    missing = sorted(with_modules - found)
    assert not missing, f"directories of modules without __init__.py (left out of the wheel): {missing}"


def test_package_data_globs_match_every_config_and_asset():
    globs = package_data_globs()
    matched = {p for pattern in globs for p in PKG.glob(pattern) if p.is_file()}
    data_files = [p for d in ("conf", "data/assets", "demo/static") for p in (PKG / d).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts]
    assert any(p.suffix == ".yaml" for p in data_files)
    unmatched = sorted(str(p.relative_to(PKG)) for p in data_files if p not in matched)
    assert not unmatched, f"files left out of the wheel by the package_data globs {globs}: {unmatched}"


def test_top_level_conf_is_the_packaged_directory():
    assert (REPO / "conf").resolve() == PKG / "conf"
    assert conf_dir().resolve() == (PKG / "conf").resolve()
    assert sorted(p.name for p in conf_dir().iterdir() if p.is_dir()) == sorted(CONFIG_KINDS)


def test_shipped_names_are_the_file_stems():
    for kind in CONFIG_KINDS:
        names = shipped_configs(kind)
        assert names == sorted(p.stem for p in (PKG / "conf" / kind).glob("*.yaml"))
    assert {"avhubert_base", "avhubert_large", "avsr_synthgrid_cpu"} <= set(shipped_configs("model"))
    assert {"default", "avhubert_s2s"} <= set(shipped_configs("decode"))
    merged = shipped_configs(TRAIN_KINDS)
    assert len(merged) == sum(len(shipped_configs(k)) for k in TRAIN_KINDS)  # no name under two kinds


@pytest.mark.parametrize(("name", "kind"), [("avhubert_base", "model"), ("default", "decode"),
                                            ("avhubert_s2s", "decode"), ("avsr_synthgrid_cpu", TRAIN_KINDS)])
def test_config_path_resolves_names_into_the_package(name, kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # names do not depend on the working directory
    path = config_path(name, kind)
    assert path.is_file() and path.name == f"{name}.yaml"
    assert path.resolve().parent.parent == (PKG / "conf").resolve()
    assert config_path(Path(name), kind) == path  # as argparse's type=Path hands it over


def test_unknown_name_lists_the_shipped_names_of_its_kind():
    with pytest.raises(ConfigError, match="avhubert_basse") as err:
        config_path("avhubert_basse", "model")
    for name in shipped_configs("model"):
        assert name in str(err.value)
    assert "default" not in str(err.value)  # a decode name, not listed for models
    with pytest.raises(ConfigError, match="nope.yaml"):
        config_path("nope.yaml", "decode")  # a file name, not a config name
    with pytest.raises(ConfigError, match="bogus"):
        config_path("default", "bogus")
    with pytest.raises(ConfigError, match="avhubert_s2s, default"):
        DecodeConfig.from_yaml("fast")


def test_existing_path_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("default").write_text("beam_size: 3\nctc_weight: 1.0\n")
    assert config_path("default", "decode") == Path("default")
    local = DecodeConfig.from_yaml("default")
    assert (local.beam_size, local.ctc_weight) == (3, 1.0)
    shipped = DecodeConfig.from_yaml(shipped_config("default", "decode"))
    assert shipped == DecodeConfig.from_yaml(PKG / "conf/decode/default.yaml") != local


def test_from_yaml_by_name_equals_by_path():
    by_path = DecodeConfig.from_yaml(REPO / "conf/decode/avhubert_s2s.yaml")
    assert DecodeConfig.from_yaml("avhubert_s2s") == by_path
    assert DecodeConfig.from_yaml("default", beam_size=4).beam_size == 4
    with torch.device("meta"):
        by_name = AVHubertEncoder.from_yaml("avhubert_large")
        by_path = AVHubertEncoder.from_yaml(REPO / "conf/model/avhubert_large.yaml")
    assert by_name.config == by_path.config
    file_conf = load_yaml(REPO / "conf/model/avhubert_large.yaml")["encoder_conf"]
    assert {k: getattr(by_name.config, k) for k in file_conf} == file_conf


def test_avsr_model_from_yaml_by_name_with_overrides():
    model = AVSRModel.from_yaml("avsr_synthgrid_cpu", vocab_size=12, model_conf={"ctc_weight": 0.5})
    assert model.vocab_size == 12 and model.ctc_lo.out_features == 12
    assert model.conf.ctc_weight == 0.5 and model.conf.lsm_weight == 0.1  # merged into the file's model_conf
    assert model.encoder.config.encoder_layers == 4
    with pytest.raises(ConfigError, match="vocab_size"):
        AVSRModel.from_yaml("avsr_synthgrid_cpu")  # the shipped config leaves it to the tokenizer
    with pytest.raises(ConfigError, match="vocab_sise"):
        AVSRModel.from_yaml("avsr_synthgrid_cpu", vocab_sise=12)


def test_train_config_by_name_keeps_the_relative_model_config():
    by_name = load_experiment_config("avsr_synthgrid_cpu")
    by_path = load_experiment_config(REPO / "conf/train/avsr_synthgrid_cpu.yaml")
    assert (by_name.train, by_name.model) == (by_path.train, by_path.model)
    model_yaml = load_yaml(PKG / "conf/model/avsr_synthgrid_cpu.yaml")
    train_yaml = load_yaml(REPO / "conf/train/avsr_synthgrid_cpu.yaml")
    # model_config: ../model/... followed, the training config's own encoder_conf keys on top
    encoder = by_name.model.to_dict()["encoder_conf"]
    assert encoder == {**encoder, **model_yaml["encoder_conf"], **train_yaml.get("encoder_conf", {})}
    assert encoder["encoder_layers"] == model_yaml["encoder_conf"]["encoder_layers"]
    assert load_experiment_config("avhubert_synthgrid_cpu").model.pretrain_conf  # pretrain/ is searched too
    with pytest.raises(ConfigError, match="avsr_synthgrid_cpu_finetune"):
        load_experiment_config("avsr_synthgrid")


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("factory", "name", "dim", "low", "high"), [
    ("avhubert_base", "avhubert_base", 768, 102e6, 104e6),  # the paper: 103M
    ("avhubert_large", "avhubert_large", 1024, 324e6, 326e6),  # the paper: 325M
    ("avhubert_synthgrid_cpu", "avsr_synthgrid_cpu", 192, 1e6, 5e6),
])
def test_factories_build_the_shipped_configs(factory, name, dim, low, high):
    with torch.device("meta"):
        enc = getattr(avsr, factory)()
        ref = AVHubertEncoder.from_yaml(PKG / "conf/model" / f"{name}.yaml")
    assert isinstance(enc, AVHubertEncoder) and enc.output_size() == dim
    assert enc.config == ref.config
    assert low < n_params(enc) < high


def test_factory_overrides_replace_keys_and_unknown_ones_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("avsr_synthgrid_cpu").write_text("encoder_conf:\n  encoder_layers: 1\n")  # factories ignore it
    enc = avsr.avhubert_synthgrid_cpu(encoder_layers=2, dropout=0.2)
    assert enc.config.encoder_layers == 2 and len(enc.encoder.layers) == 2 and enc.config.dropout == 0.2
    assert enc.config.encoder_embed_dim == 192  # the rest from the shipped file
    assert avsr.avhubert_synthgrid_cpu().config.encoder_layers == 4
    with pytest.raises(ConfigError, match=r"avhubert_base\(\).*encoder_layerz"):
        avsr.avhubert_base(encoder_layerz=3)


def test_synthgrid_factory_forward_audio_visual():
    torch.manual_seed(0)
    enc = avsr.avhubert_synthgrid_cpu().eval()
    b, t = 2, 6
    xs = {"audio": torch.randn(b, 104, t), "video": torch.randn(b, 1, t, 88, 88)}
    with torch.no_grad():
        hidden, olens, _ = enc(xs, torch.tensor([t, t - 2]))
    assert hidden.shape == (b, t, 192) and olens.tolist() == [t, t - 2]
    assert torch.isfinite(hidden).all()


def test_public_names_are_exported_lazily():
    for name in ("avhubert_base", "avhubert_large", "avhubert_synthgrid_cpu"):
        assert name in avsr.__all__ and name in dir(avsr)
        assert getattr(avsr, name).__module__ == "avsr.models.factories"


def test_ci_runs_exactly_the_readme_test_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()
          if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert len(ci) == 1 and f"   {ci[0]}\n" in readme
    assert "scripts/wheel_smoke.sh" in ci[0]
    assert os.access(REPO / "scripts/wheel_smoke.sh", os.R_OK)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The avsr modules a module imports anywhere in its body (function-level imports too)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("avsr"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("avsr"))
    return found & modules


def test_no_two_modules_import_each_other():
    """Data flows one way: no import cycle between avsr's modules, lazy function-level imports included
    (shared types such as Hypothesis live in modules of their own)."""
    root = Path(__file__).resolve().parents[1]
    files = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (root / "avsr").rglob("*.py")}
    graph = {m: _imports(p, set(files)) - {m} for m, p in files.items()}
    in_cycle = []
    for start in graph:
        stack, seen = list(graph[start]), set()
        while stack:
            node = stack.pop()
            if node == start:
                in_cycle.append(start)
                break
            if node not in seen:
                seen.add(node)
                stack.extend(graph.get(node, ()))
    assert not in_cycle, f"modules in an import cycle: {sorted(in_cycle)}"


def test_install_refuses_a_full_disk_in_one_line_before_making_the_venv(tmp_path):
    """scripts/install.sh stops with one line naming the free space when .venv (torch: ~7 GB) cannot fit."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    fake = tmp_path / "bin"
    fake.mkdir()
    # every Debian package installed; the repository's filesystem with 2 GiB free
    (fake / "dpkg-query").write_text("#!/bin/sh\nprintf 'install ok installed'\n")
    (fake / "df").write_text(
        "#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
        "echo '/dev/x 100000000 97902848 2097152 98% /'\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "install.sh")], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "2 GiB free" in lines[0] and "about 9 GiB" in lines[0], r.stderr
    assert str(tmp_path) in lines[0]
    assert not (tmp_path / ".venv").exists()


def test_licence_changelog_and_citation_ship_with_the_distributions():
    """LICENSE (the Apache License 2.0 text) goes into the wheel and the sdist through license_files,
    CHANGELOG.md and CITATION.cff into the sdist through MANIFEST.in (scripts/wheel_smoke.sh checks the
    built wheel); CITATION.cff is CFF 1.2.0 naming this version and the papers the code follows."""
    import yaml

    licence = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert licence.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in licence and len(licence.splitlines()) == 202
    metadata = setup_cfg()["metadata"]
    assert metadata["license"] == "Apache-2.0" and metadata["license_files"].split() == ["LICENSE"]
    manifest = (REPO / "MANIFEST.in").read_text(encoding="utf-8").split()
    assert {"CHANGELOG.md", "CITATION.cff"} <= set(manifest)
    assert "## [Unreleased]" in (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "Apache-2.0"
    assert {"message", "title", "authors"} <= set(cff)
    assert str(cff["version"]) == metadata["version"]
    titles = {ref["title"] for ref in cff["references"]}
    for words in ("Masked Multimodal Cluster Prediction", "Robust Self-Supervised Audio-Visual",
                  "ESPnet: End-to-End", "Hybrid CTC/Attention", "Joint CTC/attention decoding"):
        assert any(words in title for title in titles), words
