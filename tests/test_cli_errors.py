"""Every command-line tool reports bad input and misuse in one line, ``avsr-<tool>: error: ...`` naming the
file, utterance or key, with exit status 2 for usage/config errors and 1 for data/runtime errors; ``--debug``
(or ``AVSR_DEBUG=1``) shows the traceback instead."""

from __future__ import annotations

import importlib

import pytest
import torch


@pytest.fixture()
def files(tmp_path):
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    (tmp_path / "badkey.yaml").write_text("max_epoch: 2\nlrr: 0.1\n")
    (tmp_path / "badtype.yaml").write_text('lr: "abc"\n')
    (tmp_path / "badbool.yaml").write_text("use_amp: yes\n")
    (tmp_path / "empty.yaml").write_text("")
    return tmp_path


def _run(capsys, tool: str, argv: list[str]) -> tuple[int, str]:
    status = importlib.import_module(f"avsr.bin.{tool}").main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return status, err[-1] if err else ""


TRAIN = ["--train-data", "x", "--valid-data", "y", "--exp-dir", "{d}/exp", "--bpemodel", "b.model"]


@pytest.mark.parametrize(
    "tool, argv, status, prog, named",
    [
        ("prepare_data", ["--corpus", "{d}/nope", "--out", "{d}/data"], 1, "avsr-prepare-data", "nope/train"),
        ("subset_data", ["--src", "{d}/nope", "--dst", "{d}/d2", "--percent", "10"], 1, "avsr-subset-data",
         "nope"),
        ("edge_sets", ["--src", "{d}/nope", "--dst", "{d}/d2"], 1, "avsr-edge-test", "nope"),
        ("tokenizer", ["--text", "{d}/nope.txt", "--out", "{d}/tok"], 1, "avsr-tokenizer", "nope.txt"),
        ("train", ["--config", "{d}/nope.yaml", *TRAIN], 2, "avsr-train", "nope.yaml"),
        ("train", ["--config", "{d}/badkey.yaml", *TRAIN], 2, "avsr-train", "unknown config key 'lrr'"),
        ("train", ["--config", "{d}/badtype.yaml", *TRAIN], 2, "avsr-train",
         "lr: expected a number, got 'abc'"),
        ("train", ["--config", "{d}/badbool.yaml", *TRAIN], 2, "avsr-train",
         "use_amp: expected true or false"),
        ("train", ["--config", "avsr_synthgrid_cpu", *TRAIN], 1, "avsr-train", "b.model"),
        ("train", ["--config", "{d}/empty.yaml", *TRAIN], 2, "avsr-train",
         "empty.yaml: no model section: encoder_conf is missing"),
        ("decode", ["--exp-dir", "{d}/nope", "--data", "{d}", "--decode-config", "default", "--out", "{d}/o"],
         1, "avsr-decode", "nope"),
        ("decode", ["--checkpoint", "{d}/garbage.pt", "--data", "{d}", "--decode-config", "defautl", "--out",
                    "{d}/o"], 2, "avsr-decode", "'defautl'"),
        ("transcribe", ["{d}/nope.mp4", "--checkpoint", "{d}/garbage.pt"], 1, "avsr-transcribe", "nope.mp4"),
        ("transcribe", ["{d}/badkey.yaml", "--checkpoint", "{d}/garbage.pt"], 1, "avsr-transcribe",
         "garbage.pt: truncated or not a torch checkpoint"),
        pytest.param("transcribe", ["{d}/badkey.yaml", "--checkpoint", "{d}/garbage.pt", "--device", "cuda"],
                     2, "avsr-transcribe", "device 'cuda': CUDA is not available here",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")),
        ("convert", ["{d}/garbage.pt", "{d}/out.pt"], 1, "avsr-convert", "garbage.pt"),
        ("score", ["--decode-dir", "{d}/nope", "--out", "{d}/res"], 1, "avsr-score", "nope"),
        ("synthgrid", ["--out", "{d}/sg", "--num-train", "-3"], 2, "avsr-synthgrid", "num_train"),
    ],
)
def test_bad_input_is_one_line_naming_it(files, capsys, tool, argv, status, prog, named):
    argv = [a.format(d=files) for a in argv]
    got, line = _run(capsys, tool, argv)
    assert got == status, line
    assert line.startswith(f"{prog}: error: ") and named in line, line


def test_a_crafted_checkpoint_is_refused_as_such(tmp_path, capsys):
    class Evil:
        def __reduce__(self):
            return (print, ("must never run",))

    torch.save({"model": {}, "model_config": {}, "x": Evil()}, tmp_path / "evil.pt")
    status, line = _run(capsys, "convert", [str(tmp_path / "evil.pt"), str(tmp_path / "out.pt")])
    assert status == 1 and "holds objects outside the allowed set (" in line and "print)" in line
    assert "truncated" not in line and "weights_only" not in line


def test_debug_shows_the_traceback(files, capsys, monkeypatch):
    from avsr.config import ConfigError

    argv = [a.format(d=files) for a in ["--config", str(files / "badkey.yaml"), *TRAIN]]
    with pytest.raises(ConfigError, match="lrr"):
        importlib.import_module("avsr.bin.train").main([*argv, "--debug"])
    monkeypatch.setenv("AVSR_DEBUG", "1")
    with pytest.raises(ConfigError, match="lrr"):
        importlib.import_module("avsr.bin.train").main(argv)


def test_a_genuine_bug_is_not_hidden(monkeypatch):
    from avsr.bin.runner import tool

    @tool("avsr-x")
    def main(argv):
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        main([])


def test_every_mapped_error_class_exists_and_maps_to_its_status():
    """The exit statuses are mapped from the error classes themselves: a class renamed or moved fails to
    import here instead of dropping out of the mapping (its errors would then show a traceback)."""
    from avsr.bin.runner import data_errors, tool, usage_errors

    usage, data = usage_errors(), data_errors()
    assert len(usage) == 2 and len(data) == 16
    for cls in (*usage, *data):
        assert isinstance(cls, type) and issubclass(cls, Exception), cls
    assert not set(usage) & set(data)
    for cls, status in [*((c, 2) for c in usage), *((c, 1) for c in data)]:
        @tool("avsr-x")
        def main(argv, cls=cls):
            raise cls("bad input (somewhere)")

        assert main([]) == status, cls


def test_an_experiment_refuses_to_resume_with_other_settings(tmp_path):
    import yaml

    from avsr.bin.runner import UsageError
    from avsr.train.experiment import keep_promise

    old = {"lr": 0.001, "max_epoch": 3, "encoder_conf": {"encoder_layers": 2}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    keep_promise(tmp_path, {**old, "lr": 0.002}, allow_change=False)  # no checkpoint yet: a new start
    (tmp_path / "checkpoint.pt").write_bytes(b"x")
    keep_promise(tmp_path, dict(old), allow_change=False)  # same settings: resume
    new = {**old, "lr": 0.002, "encoder_conf": {"encoder_layers": 4}}
    with pytest.raises(UsageError) as err:
        keep_promise(tmp_path, new, allow_change=False)
    assert "encoder_conf.encoder_layers: 2 -> 4" in str(err.value) and "lr: 0.001 -> 0.002" in str(err.value)
    assert "--allow-config-change" in str(err.value)
    keep_promise(tmp_path, new, allow_change=True)
    assert yaml.safe_load((tmp_path / "config.1.yaml").read_text()) == old
    assert "lr: 0.001 -> 0.002" in (tmp_path / "config_changes.log").read_text()


def test_stale_temporary_files_are_removed(tmp_path):
    import subprocess

    from avsr.fileio import remove_stale_tmp, tmp_path_for

    proc = subprocess.Popen(["true"])  # a process that has ended: its temporary files are stale
    proc.wait()
    stale = tmp_path / f".epoch3.pt.{proc.pid}.tmp"
    stale.write_bytes(b"half a checkpoint")
    mine = tmp_path_for(tmp_path / "config.yaml")
    mine.write_text("being written")
    other = tmp_path / "notes.tmp"
    other.write_text("not ours")
    assert remove_stale_tmp(tmp_path) == [stale]
    assert not stale.exists() and mine.exists() and other.exists()


def test_training_refuses_a_transcript_the_tokenizer_cannot_encode(tmp_path, capsys):
    from avsr.data.datadir import Utterance, write_datadir
    from avsr.data.tokenizer import train_sentencepiece

    model = train_sentencepiece(["BIN BLUE AT A ONE NOW", "LAY RED BY B TWO SOON"] * 20, tmp_path / "bpe", 20)
    good = [Utterance(f"s-{i}", "s", wav=str(tmp_path / f"{i}.wav"), text="BIN BLUE AT A ONE NOW")
            for i in range(3)]
    bad = Utterance("s-9", "s", wav="x.wav", text="LAY R\u00c9D NOW")
    write_datadir(tmp_path / "train", [*good, bad])  # a training target with <unk>: refused
    write_datadir(tmp_path / "valid", good[:2])
    from avsr.corpora.synthgrid.voices import english_lexicon

    english_lexicon().write(tmp_path / "lexicon.txt")  # the shipped config's phone loss needs it
    argv = ["--config", "avsr_synthgrid_cpu", "--train-data", str(tmp_path / "train"), "--valid-data",
            str(tmp_path / "valid"), "--bpemodel", str(model), "--exp-dir", str(tmp_path / "exp"),
            "--phone-lexicon", str(tmp_path / "lexicon.txt")]
    status, line = _run(capsys, "train", argv)
    assert status == 1 and line.startswith("avsr-train: error: "), line
    assert f"{tmp_path / 'train' / 'text'}: utterance 's-9': characters the tokenizer" in line, line
    assert "'\u00c9' (U+00C9)" in line and "<unk>" in line, line
