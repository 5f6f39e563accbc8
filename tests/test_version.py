"""The version of avsr: ``avsr.__version__`` (the installed distribution's, else the source tree's setup.cfg),
``avsr --version``, and the ``avsr_version`` that every checkpoint of the trainer records (a checkpoint
without it, written before avsr recorded it, loads and resumes all the same)."""

from __future__ import annotations

import configparser
import importlib.metadata
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import avsr
from avsr.checkpoint import load_checkpoint, save_atomic, written_by
from avsr.cli import main as avsr_main
from tests.test_trainer import make_trainer, setup  # noqa: F401  (setup is a fixture)

REPO = Path(__file__).resolve().parents[1]


def setup_cfg_version() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    return cfg["metadata"]["version"]


def test_version_is_the_installed_distributions():
    assert avsr.__version__ == importlib.metadata.version("avsr")
    assert avsr.__version__[0].isdigit()


def test_version_of_a_source_tree_that_is_not_installed_comes_from_setup_cfg(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert avsr._version() == setup_cfg_version()


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_avsr_version_prints_the_version(flag, capsys):
    assert avsr_main([flag]) == 0
    assert capsys.readouterr().out == f"avsr {avsr.__version__}\n"


def test_avsr_version_as_a_command():
    r = subprocess.run([sys.executable, "-m", "avsr.cli", "--version"], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip() == f"avsr {avsr.__version__}", r.stderr
    assert "--version" in subprocess.run([sys.executable, "-m", "avsr.cli", "--help"], capture_output=True,
                                         text=True, timeout=120, cwd=REPO).stdout


def test_every_checkpoint_of_the_trainer_records_the_version(setup, tmp_path):  # noqa: F811
    tok, utts = setup
    trainer = make_trainer(tok, utts, tmp_path, max_epoch=1)
    trainer.run()
    for name in ("epoch1.pt", "checkpoint.pt"):
        state = load_checkpoint(tmp_path / name)
        assert state["avsr_version"] == avsr.__version__, name
        assert written_by(state) == avsr.__version__


def test_a_checkpoint_without_the_version_still_resumes(setup, tmp_path, caplog):  # noqa: F811
    tok, utts = setup
    make_trainer(tok, utts, tmp_path, max_epoch=1).run()
    path = tmp_path / "checkpoint.pt"
    state = dict(load_checkpoint(path))
    del state["avsr_version"]  # as written before avsr recorded its version
    save_atomic(state, path)
    assert written_by(load_checkpoint(path)) is None
    resumed = make_trainer(tok, utts, tmp_path, max_epoch=2)
    with caplog.at_level(logging.INFO, logger="avsr.train"):
        assert resumed.resume() and resumed.epoch == 1
    assert "(version not recorded)" in caplog.text
    resumed.run()
    assert load_checkpoint(tmp_path / "checkpoint.pt")["avsr_version"] == avsr.__version__
