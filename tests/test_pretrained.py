"""Models shipped with the package, by name (:mod:`avsr.pretrained`): ``Transcriber.from_pretrained("name")``,
``avsr transcribe`` and ``avsr demo`` without ``--checkpoint``.

No model is part of the checkout yet: the tests copy the tiny model of ``tests/test_inference.py`` into a
temporary folder that stands for ``avsr/pretrained``, in both layouts (an experiment directory; ``model.pt``
with ``bpe.model`` and ``decode.yaml``).
"""

from __future__ import annotations

import configparser
import fnmatch
import shutil
from pathlib import Path

import pytest
import yaml

import avsr.pretrained
from avsr.checkpoint import load_checkpoint, save_atomic
from avsr.cli import main as avsr_main
from avsr.inference import Transcriber
from avsr.pretrained import DEFAULT_MODEL, available_models, resolve_model
from tests.test_inference import DECODE, env  # noqa: F401 (the fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def shipped(env, tmp_path, monkeypatch):  # noqa: F811
    """A stand-in for avsr/pretrained: ``tiny`` (an experiment dir), ``one`` (model.pt, bpe.model,
    decode.yaml, MODEL_CARD.md) and ``empty`` (a folder without weights)."""
    root = tmp_path / "pretrained"
    shutil.copytree(env["exp"], root / "tiny")
    one = root / "one"
    one.mkdir()
    save_atomic(load_checkpoint(env["exp"] / "epoch2.pt"), one / "model.pt")
    shutil.copy(env["exp"] / "bpe.model", one / "bpe.model")
    (one / "decode.yaml").write_text(yaml.safe_dump({**DECODE, "beam_size": 3}))
    (one / "MODEL_CARD.md").write_text("# one\n")
    (root / "empty").mkdir()
    monkeypatch.setattr(avsr.pretrained, "ROOT", root)
    return root


def test_a_name_resolves_to_the_shipped_model_and_a_path_stays_a_path(shipped, tmp_path, monkeypatch):
    assert available_models() == ["one", "tiny"]
    assert resolve_model("tiny") == shipped / "tiny"  # an experiment dir
    assert resolve_model("one") == shipped / "one" / "model.pt"
    assert resolve_model(tmp_path / "x" / "model.pt") == tmp_path / "x" / "model.pt"  # a path, even missing
    assert resolve_model("nope.pt") == Path("nope.pt")  # a checkpoint's file name is no model name
    monkeypatch.chdir(tmp_path)
    Path("tiny").mkdir()  # an existing path wins over a name
    assert resolve_model("tiny") == Path("tiny")


def test_from_pretrained_loads_a_shipped_model_by_name(shipped, env):  # noqa: F811
    mp4, wav = env["utts"][1]
    by_name = Transcriber.from_pretrained("tiny", decode_config=DECODE)
    by_path = Transcriber.from_pretrained(env["exp"], decode_config=DECODE)
    assert by_name(video=mp4, audio=wav).tokens == by_path(video=mp4, audio=wav).tokens
    one = Transcriber.from_pretrained("one")
    assert one.config.beam_size == 3  # its decode.yaml, unless another configuration is given
    assert Transcriber.from_pretrained("one", decode_config=DECODE).config.beam_size == DECODE["beam_size"]
    single = Transcriber.from_pretrained(env["exp"], decode_config=DECODE, average_nbest=1)  # epoch2.pt
    assert (Transcriber.from_pretrained("one", decode_config=DECODE)(audio=wav).tokens
            == single(audio=wav).tokens)


def test_an_unknown_or_missing_model_is_one_line_naming_the_installed_ones(shipped, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as err:
        Transcriber.from_pretrained("tinny")
    assert str(err.value) == (
        "'tinny' is neither a file or directory nor a pretrained model (installed: one, tiny)")
    with pytest.raises(FileNotFoundError, match="'empty' is not installed in this package"):
        Transcriber.from_pretrained("empty")
    monkeypatch.setattr(avsr.pretrained, "ROOT", tmp_path / "nothing")
    with pytest.raises(FileNotFoundError) as err:
        Transcriber.from_pretrained(DEFAULT_MODEL)
    message = str(err.value)
    assert "\n" not in message and f"'{DEFAULT_MODEL}' is not installed in this package" in message
    assert "none is installed" in message and "give the path of a trained model" in message


def test_the_tools_load_the_default_model_without_checkpoint(shipped, env, tmp_path, capsys,  # noqa: F811
                                                                monkeypatch):
    from avsr.bin import demo

    wav = env["utts"][0][1]
    decode = tmp_path / "decode.yaml"
    decode.write_text(yaml.safe_dump(DECODE))
    assert avsr_main(["transcribe", str(wav), "--decode-config", str(decode)]) == 1  # not installed here
    assert capsys.readouterr().err.strip().splitlines() == [
        f"avsr-transcribe: error: the pretrained model '{DEFAULT_MODEL}' is not installed in this package "
        f"(no model.pt in {shipped / DEFAULT_MODEL}; installed: one, tiny): give the path of a trained "
        "model's experiment directory or checkpoint instead"]
    shutil.copytree(shipped / "tiny", shipped / DEFAULT_MODEL)
    assert avsr_main(["transcribe", str(wav), "--decode-config", str(decode)]) == 0
    expected = Transcriber.from_pretrained(env["exp"], decode_config=DECODE)(audio=wav).text
    assert capsys.readouterr().out == f"{wav}\t{expected}\n"
    assert demo._parser().parse_args([]).checkpoint == DEFAULT_MODEL == demo.DEFAULT_CHECKPOINT
    pytest.importorskip("fastapi", reason="needs the [demo] extra")
    import uvicorn
    from fastapi.testclient import TestClient

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    assert avsr_main(["demo", "--decode-config", str(decode), "--port", "8123"]) == 0
    assert TestClient(served["app"]).get("/api/info").json()["model"] == DEFAULT_MODEL


def test_shipped_models_are_package_data():
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg", encoding="utf-8")
    globs = [g.strip() for g in cfg["options.package_data"]["avsr"].splitlines() if g.strip()]
    for name in ("model.pt", "epoch3.pt", "bpe.model", "decode.yaml", "MODEL_CARD.md"):
        assert any(fnmatch.fnmatch(f"pretrained/{DEFAULT_MODEL}/{name}", g) for g in globs), name
    assert not any(fnmatch.fnmatch("pretrained/__pycache__/__init__.cpython-311.pyc", g) for g in globs)
