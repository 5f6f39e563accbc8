"""The auxiliary phone CTC loss: the pronunciation lexicon, the model's phone head and loss, and training
with ``avsr.bin.train --phone-lexicon``."""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from avsr.config import ConfigError
from avsr.corpora.synthgrid.grammar import SLOTS, sample_sentence, transcript
from avsr.corpora.synthgrid.voices import ENGLISH_PRONUNCIATIONS, english_lexicon
from avsr.data.datadir import write_datadir
from avsr.data.dataset import AVDataset, collate
from avsr.data.lexicon import LexiconError, PhoneLexicon
from avsr.data.tokenizer import Tokenizer, train_sentencepiece
from avsr.models.asr import AVSRModel
from tests.test_data import make_utt
from tests.test_trainer import MODEL

pytestmark = pytest.mark.usefixtures("one_thread")


def test_lexicon_file_round_trip_ids_and_errors_that_name_the_line_or_utterance(tmp_path):
    path = tmp_path / "lexicon.txt"
    path.write_text("# GRID\nBIN b ih n\n\nBY b ay\nBIN b ih n\n")
    lex = PhoneLexicon.from_file(path)
    assert lex.phones == ["ay", "b", "ih", "n"] and lex.num_classes == 5  # 0 is the CTC blank
    assert lex.encode("BIN BY") == [2, 3, 4, 2, 1]
    lex.write(tmp_path / "copy.txt")
    assert (tmp_path / "copy.txt").read_text() == "BIN b ih n\nBY b ay\n"
    assert PhoneLexicon.from_file(tmp_path / "copy.txt").entries == lex.entries
    with pytest.raises(LexiconError, match="utterance 'u1': word 'BLUE' is not in the phone lexicon"):
        lex.encode("BIN BLUE", "utterance 'u1'")
    with pytest.raises(LexiconError, match=r"data/text: 1 utterances .* e.g. 'u2' \(BLUE\)"):
        lex.check_texts({"u1": "BIN BY", "u2": "BY BLUE"}, "data/text")
    path.write_text("BIN b ih n\nBIN b iy n\n")
    with pytest.raises(LexiconError, match=r"lexicon.txt:2: word 'BIN' has a second pronunciation"):
        PhoneLexicon.from_file(path)
    path.write_text("BIN\n")
    with pytest.raises(LexiconError, match=r"lexicon.txt:1: word 'BIN' has no phones"):
        PhoneLexicon.from_file(path)
    with pytest.raises(LexiconError, match="CTC blank"):
        PhoneLexicon({"X": ["<blank>"]})


def test_the_grid_lexicon_gives_every_grid_word_festivals_phones():
    lex = english_lexicon()
    assert set(lex.entries) == {w for slot in SLOTS for w in slot}
    words = sample_sentence(np.random.default_rng(3))
    ids = lex.encode(transcript(words))
    phones = [p for w in words for p, _ in ENGLISH_PRONUNCIATIONS[w]]
    assert [lex.phones[i - 1] for i in ids] == phones and min(ids) >= 1
    # the letters share their phones with other words: what the phone loss lets the encoder learn from them
    assert all(any(p in lex.entries[w] for w in lex.entries if len(w) > 1) for p in lex.entries["B"])


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("phone")
    rng = np.random.default_rng(0)
    texts = [transcript(sample_sentence(rng)) for _ in range(6)]
    tok = Tokenizer(train_sentencepiece(texts * 20, root / "bpe", vocab_size=40))
    utts = [make_utt(root, f"s1_{i}", frames=40 + i, text=t) for i, t in enumerate(texts)]
    return root, tok, utts


def _config(tok, lex, weight, **model_conf):
    no_dropout = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    enc = {**MODEL["encoder_conf"], **no_dropout, "dropout_features": 0.0, "dropout_input": 0.0,
           "modality_dropout": 0.0, "encoder_layerdrop": 0.0}
    return {"vocab_size": tok.vocab_size, **MODEL, "encoder_conf": enc,
            "decoder_conf": {**MODEL["decoder_conf"], **no_dropout},
            "model_conf": {"ctc_weight": 0.3, "phone_ctc_weight": weight, "phone_vocab_size": lex.num_classes,
                           **model_conf}}


def test_the_phone_loss_is_the_weighted_ctc_of_the_phone_head_on_the_encoder_output(grid):
    _, tok, utts = grid
    lex = english_lexicon()
    torch.manual_seed(0)
    plain = AVSRModel.from_config(_config(tok, lex, 0.0)).train()
    assert plain.phone_ctc_lo is None and not hasattr(plain, "batch_keys")
    model = AVSRModel.from_config(_config(tok, lex, 0.5)).train()
    model.load_state_dict(plain.state_dict(), strict=False)
    assert model.batch_keys[-2:] == ("phones_pad", "phones_lens")
    ds = AVDataset(utts, tok, phone_lexicon=lex)
    batch = collate([ds[(i, "audiovisual")] for i in range(3)])
    assert batch["phones_lens"].tolist() == [len(lex.encode(u.text)) for u in utts[:3]]
    assert (batch["phones_pad"][2, batch["phones_lens"][2]:] == -1).all()
    loss, stats = model(*[batch[k] for k in model.batch_keys])
    base, _ = plain(batch["audio"], batch["video"], batch["lengths"], batch["ys_pad"], batch["ys_lens"])
    enc, enc_lens = model.encode(batch["audio"], batch["video"], batch["lengths"])
    logp = torch.log_softmax(model.phone_ctc_lo(enc), -1).transpose(0, 1)
    phone = F.ctc_loss(logp, batch["phones_pad"].clamp(min=0), enc_lens, batch["phones_lens"],
                       reduction="sum", zero_infinity=True) / 3
    torch.testing.assert_close(stats["loss_phone"], phone.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(loss, base + 0.5 * phone, rtol=1e-5, atol=1e-4)
    model.zero_grad()
    (loss - base).backward()  # the phone loss alone trains the head and the encoder under it
    assert model.phone_ctc_lo.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())
    with pytest.raises(ValueError, match="needs phones_pad"):
        model(batch["audio"], batch["video"], batch["lengths"], batch["ys_pad"], batch["ys_lens"])
    # two training views of an audio-visual batch: each view's phone loss counts
    views = AVSRModel.from_config(_config(tok, lex, 0.5, av_batch_views=["audiovisual", "video"])).train()
    views.load_state_dict(model.state_dict())
    _, two = views(*[batch[k] for k in views.batch_keys])
    video_only = model.encode(None, batch["video"], batch["lengths"])
    logp_v = torch.log_softmax(model.phone_ctc_lo(video_only[0]), -1).transpose(0, 1)
    phone_v = F.ctc_loss(logp_v, batch["phones_pad"].clamp(min=0), video_only[1], batch["phones_lens"],
                         reduction="sum", zero_infinity=True) / 3
    torch.testing.assert_close(two["loss_phone"], (phone + phone_v).detach(), rtol=1e-5, atol=1e-4)
    bad = _config(tok, lex, 0.5)
    del bad["model_conf"]["phone_vocab_size"]
    with pytest.raises(ConfigError, match="phone_ctc_weight > 0 needs phone_vocab_size"):
        AVSRModel.from_config(bad)


def test_training_with_a_phone_lexicon_keeps_it_in_the_experiment_and_names_bad_input(grid, tmp_path, capsys):
    root, tok, utts = grid
    write_datadir(tmp_path / "train", utts)
    write_datadir(tmp_path / "valid", utts[:2])
    english_lexicon().write(tmp_path / "lexicon.txt")
    model_conf = {**MODEL["model_conf"], "phone_ctc_weight": 0.3}
    cfg = {"encoder_conf": MODEL["encoder_conf"], "decoder_conf": MODEL["decoder_conf"],
           "model_conf": model_conf, "max_epoch": 1, "batch_frames": 100, "warmup_steps": 2,
           "log_interval": 1, "keep_nbest": 1}
    (tmp_path / "phone.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({**cfg, "model_conf": MODEL["model_conf"]}))
    train = importlib.import_module("avsr.bin.train").main

    def run(config, exp, *extra):
        argv = ["--config", str(tmp_path / config), "--train-data", str(tmp_path / "train"), "--valid-data",
                str(tmp_path / "valid"), "--bpemodel", str(root / "bpe.model"), "--exp-dir",
                str(tmp_path / exp), *extra]
        status = train(argv)
        err = capsys.readouterr().err.strip().splitlines()
        return status, err[-1] if err else ""

    lexicon = ["--phone-lexicon", str(tmp_path / "lexicon.txt")]
    assert run("phone.yaml", "exp", *lexicon)[0] in (0, None)
    exp = tmp_path / "exp"
    assert PhoneLexicon.from_file(exp / "lexicon.txt").entries == english_lexicon().entries
    ckpt = torch.load(exp / "epoch1.pt", map_location="cpu", weights_only=False)
    assert ckpt["model_config"]["model_conf"]["phone_vocab_size"] == english_lexicon().num_classes
    loaded = AVSRModel.from_pretrained(exp / "epoch1.pt")
    assert loaded.phone_ctc_lo is not None and loaded.phone_ctc_lo.out_features == 34
    logged = [json.loads(line) for line in (exp / "train_log.jsonl").read_text().splitlines()]
    assert any("loss_phone" in str(entry) for entry in logged)

    status, line = run("phone.yaml", "no_lexicon")
    assert status == 2 and "phone_ctc_weight > 0 needs --phone-lexicon" in line, line
    assert run("plain.yaml", "unused", *lexicon)[0] in (0, None)  # a recipe passes its lexicon to any config
    assert "not used: " in (tmp_path / "unused" / "train.log").read_text()
    assert not (tmp_path / "unused" / "lexicon.txt").exists()
    (tmp_path / "short.txt").write_text("BIN b ih n\n")
    status, line = run("phone.yaml", "short", "--phone-lexicon", str(tmp_path / "short.txt"))
    assert status == 1 and "train/text" in line and "short.txt" in line, line


def test_profile_train_benchmark_profiles_a_config_with_the_phone_loss(grid, tmp_path, capsys):
    """benchmarks/profile_train.py builds the model as avsr.bin.train does: the recipe's config (phone loss
    on) needs the lexicon, and the profiled steps then include the phone head's loss."""
    root, _, utts = grid
    write_datadir(tmp_path / "train", utts)
    english_lexicon().write(tmp_path / "lexicon.txt")
    model_conf = {**MODEL["model_conf"], "phone_ctc_weight": 0.3}
    cfg = {"encoder_conf": MODEL["encoder_conf"], "decoder_conf": MODEL["decoder_conf"],
           "model_conf": model_conf, "batch_frames": 100, "warmup_steps": 2}
    (tmp_path / "phone.yaml").write_text(yaml.safe_dump(cfg))
    spec = importlib.util.spec_from_file_location(
        "profile_train", Path(__file__).resolve().parents[1] / "benchmarks" / "profile_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--config", str(tmp_path / "phone.yaml"), "--train-data", str(tmp_path / "train"),
            "--bpemodel", str(root / "bpe.model"), "--steps", "2", "--skip", "1"]
    with pytest.raises(SystemExit, match="phone_ctc_weight > 0 needs --phone-lexicon"):
        bench.main(argv)
    calls = []
    original = AVSRModel.forward

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls.append(out)
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AVSRModel, "forward", spy)
        bench.main([*argv, "--phone-lexicon", str(tmp_path / "lexicon.txt"),
                    "--json", str(tmp_path / "p.json")])
    figures = json.loads((tmp_path / "p.json").read_text())
    assert figures["steps"] == 2 and figures["wall_ms"]["step"] > 0
    assert sum(v["batches"] for v in figures["kinds"].values()) == 2
    assert calls and all("loss_phone" in stats for _, stats in calls)
