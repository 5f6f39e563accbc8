"""avsr.Transcriber: paths and arrays, each modality, batched and single, official-layout checkpoints,
checkpoint averaging, the video cache of the decoding stage, and every kind of bad input.

A tiny random-initialised hybrid CTC/attention model is enough: the properties are equalities between
paths that must give the same words, and the errors, not accuracy.
"""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from avsr.checkpoint import save_atomic
from avsr.corpora.synthgrid import grammar
from avsr.data.media import read_video, read_wav, write_video, write_wav
from avsr.data.tokenizer import Tokenizer, train_sentencepiece
from avsr.decode.config import DecodeConfig
from avsr.inference import InferenceError, TranscribeItem, Transcriber
from avsr.models.asr import AVSRModel
from tests.decoding import decode

CONFIG = {
    "encoder_conf": {
        "encoder_layers": 1,
        "encoder_embed_dim": 32,
        "encoder_ffn_embed_dim": 64,
        "encoder_attention_heads": 2,
        "conv_pos": 8,
        "conv_pos_groups": 4,
        "resnet_widths": [4, 4, 8, 8],
        "modality_dropout": 0.0,
    },
    "decoder_conf": {"decoder_layers": 1, "decoder_embed_dim": 32, "decoder_ffn_embed_dim": 64,
                     "decoder_attention_heads": 2},
    "model_conf": {"ctc_weight": 0.3},
}
DECODE = {"beam_size": 2, "ctc_weight": 0.3, "maxlenratio": 0.3, "minlenratio": 0.1}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A tiny model in an experiment dir (2 epochs), and 4 utterances as ROI mp4 + wav files."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("inference")
    rng = np.random.default_rng(0)
    exp = root / "exp"
    tokenizer = Tokenizer(train_sentencepiece([" ".join(grammar.sample_sentence(rng)) for _ in range(300)],
                                              exp / "bpe", vocab_size=40))
    config = {"vocab_size": tokenizer.vocab_size, **CONFIG}
    models = []
    for epoch in (1, 2):
        torch.manual_seed(epoch)
        model = AVSRModel.from_config(config)
        save_atomic({"model": model.state_dict(), "model_config": config, "epoch": epoch, "step": 0,
                     "valid": {"acc": 0.1 * epoch}}, exp / f"epoch{epoch}.pt")
        models.append(model.eval())
    utts = []
    for i, frames in enumerate((30, 45, 38, 52)):
        roi = rng.integers(0, 256, size=(frames, 96, 96), dtype=np.uint8)
        wav = torch.from_numpy(rng.normal(0, 0.1, frames * 640)).float()
        write_video(root / f"u{i}.mp4", roi)
        write_wav(root / f"u{i}.wav", wav)
        utts.append((root / f"u{i}.mp4", root / f"u{i}.wav"))
    noise = root / "noise.wav"
    write_wav(noise, torch.from_numpy(rng.normal(0, 0.1, 16000)).float())
    return {"root": root, "exp": exp, "models": models, "tokenizer": tokenizer, "utts": utts, "noise": noise}


def _transcriber(env, model=0) -> Transcriber:
    return Transcriber(env["models"][model], env["tokenizer"], DECODE)


@pytest.mark.parametrize("modality", ["audiovisual", "audio", "video"])
def test_paths_and_arrays_give_the_same_transcript(env, modality):
    tr = _transcriber(env)
    mp4, wav = env["utts"][1]
    by_path = tr(video=mp4 if modality != "audio" else None, audio=wav if modality != "video" else None)
    frames, samples = read_video(mp4), read_wav(wav)
    by_array = tr(video=frames.numpy() if modality != "audio" else None,
                  audio=samples if modality != "video" else None)
    assert by_path.modality == by_array.modality == modality  # the default: what was given
    assert by_path.tokens == by_array.tokens and by_path.text == by_array.text
    assert by_path.score == pytest.approx(by_array.score) and math.isfinite(by_path.score)
    assert by_path.num_frames == frames.shape[0] and by_path.duration_s == pytest.approx(45 / 25)
    assert by_path.key == "u1" and by_array.key == "utt0"
    assert by_path.words is not None and [w.word for w in by_path.words] == by_path.text.split()
    # an explicit modality takes only that stream
    assert tr(video=mp4, audio=wav, modality=modality).tokens == by_path.tokens


def test_batched_decoding_gives_the_single_utterance_transcripts(env):
    tr = _transcriber(env)
    items = [TranscribeItem(video=v, audio=a) for v, a in env["utts"]]
    batch = tr.transcribe_batch(items, modality="audiovisual")
    assert [r.key for r in batch] == ["u0", "u1", "u2", "u3"]
    single = [tr(video=v, audio=a) for v, a in env["utts"]]
    assert [r.tokens for r in batch] == [r.tokens for r in single]
    assert [r.score for r in batch] == pytest.approx([r.score for r in single], abs=1e-4)
    # the same through the model directly, one batch of the four
    from avsr.features import avhubert_audio_features, crop_video, normalize_video

    lens = torch.tensor([30, 45, 38, 52])
    audio = torch.zeros(4, 104, 52)
    video = torch.zeros(4, 1, 52, 88, 88)
    for i, (v, a) in enumerate(env["utts"]):
        audio[i, :, : lens[i]] = avhubert_audio_features(read_wav(a), num_video_frames=int(lens[i])).T
        video[i, 0, : lens[i]] = normalize_video(crop_video(read_video(v)))
    direct = decode(env["models"][0], audio, video, lens, DecodeConfig(**DECODE))
    assert [r.tokens for r in batch] == direct


@pytest.mark.cuda
@pytest.mark.parametrize("modality", ["audiovisual", "audio", "video"])
def test_cuda_gives_the_cpus_transcripts(env, modality, exact_cuda_float32):
    """The one inference path on a GPU: a batch decoded on CUDA (float32, and bf16 where the GPU has it)
    gives the CPU's words; float32 scores agree to rounding."""
    items = [TranscribeItem(video=v, audio=a) for v, a in env["utts"]]
    cpu = _transcriber(env).transcribe_batch(items, modality=modality)
    gpu = Transcriber(copy.deepcopy(env["models"][0]), env["tokenizer"], DECODE, device="cuda",
                      precision="fp32").transcribe_batch(items, modality=modality)
    assert [r.tokens for r in gpu] == [r.tokens for r in cpu]
    assert [r.score for r in gpu] == pytest.approx([r.score for r in cpu], rel=1e-4, abs=1e-3)
    auto = Transcriber(copy.deepcopy(env["models"][0]), env["tokenizer"], DECODE, device="cuda",
                       precision="auto")
    assert auto.precision == ("bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp32")
    assert all(math.isfinite(r.score) for r in auto.transcribe_batch(items, modality=modality))


def test_an_experiment_dir_averages_its_best_checkpoints(env):
    tr = Transcriber.from_pretrained(env["exp"], decode_config=DECODE, average_nbest=2)
    a, b = (m.state_dict() for m in env["models"])
    for k, v in tr.model.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(v, (a[k] + b[k]) / 2)
    one = Transcriber.from_pretrained(env["exp"], decode_config=DECODE, average_nbest=1)  # epoch 2: best acc
    assert torch.equal(one.model.ctc_lo.weight, env["models"][1].ctc_lo.weight)
    file = Transcriber.from_pretrained(env["exp"] / "epoch1.pt", decode_config=DECODE)  # bpe.model beside
    mp4, wav = env["utts"][0]
    assert file(video=mp4, audio=wav).tokens == _transcriber(env)(video=mp4, audio=wav).tokens
    assert tr.config == DecodeConfig(**DECODE)
    assert Transcriber.from_pretrained(env["exp"]).config == DecodeConfig()  # the model's defaults
    with pytest.raises(FileNotFoundError, match="no such experiment directory"):
        Transcriber.from_pretrained(env["root"] / "missing")


@pytest.mark.parametrize("kind", ["av_hubert_seq2seq", "av_hubert_ctc"])
def test_official_checkpoints_transcribe_with_the_originals_search(env, kind, tmp_path):
    from tests.test_compat import finetune_ckpt, train_sentencepiece

    train_sentencepiece(tmp_path)
    ckpt, *_ = finetune_ckpt(tmp_path, kind)
    tr = Transcriber.from_pretrained(ckpt, bpemodel=tmp_path / "sp.model")
    if kind == "av_hubert_seq2seq":  # AV-HuBERT's s2s_decode.yaml: fairseq's beam search, beam 50
        assert tr.config.search == "fairseq" and tr.config.beam_size == 50 and tr.config.ctc_weight == 0
        tr = Transcriber.from_pretrained(ckpt, bpemodel=tmp_path / "sp.model",
                                         decode_config={"beam_size": 2, "max_len_a": 0.0, "max_len_b": 3})
    else:
        assert tr.config.ctc_weight == 1.0
    mp4, wav = env["utts"][0]
    result = tr(video=mp4, audio=wav)
    assert result.text == result.text.upper()
    if kind == "av_hubert_ctc":
        assert result.words is not None and [w.word for w in result.words] == result.text.split()
    else:
        assert result.words is None and "no CTC head" in result.info["words_note"]


def test_the_video_cache_skips_the_video_and_changes_nothing(env, monkeypatch):
    tr = _transcriber(env)
    items = [TranscribeItem(video=v, audio=a) for v, a in env["utts"]]
    plain = {snr: tr.transcribe_batch(items, noise=env["noise"] if snr is not None else None, snr_db=snr)
             for snr in (None, 0.0)}
    cache: dict = {}
    first = tr.transcribe_batch(items, video_cache=cache)
    assert sorted(cache) == [(f"u{i}", (0, 0)) for i in range(4)] and cache["u1", (0, 0)].shape == (32, 45)

    def no_video(*args, **kwargs):
        raise AssertionError("the video was read although it is cached")

    monkeypatch.setattr("avsr.inference.inputs.read_video_frames", no_video)
    second = tr.transcribe_batch(items, noise=env["noise"], snr_db=0.0, video_cache=cache)
    assert [r.tokens for r in first] == [r.tokens for r in plain[None]]
    assert [r.tokens for r in second] == [r.tokens for r in plain[0.0]]
    assert second[0].info["snr_db"] == 0.0 and second[0].info["noise"] == str(env["noise"])
    with pytest.raises(InferenceError, match="unique item keys"):
        tr.transcribe_batch([items[0], items[0]], video_cache={})


def test_noise_is_keyed_by_the_utterance_and_changes_the_audio(env):
    from avsr.data.noise import NoiseSource

    tr = _transcriber(env)
    _, wav = env["utts"][2]
    clean = tr(audio=wav)
    noisy = [tr(audio=wav, noise=env["noise"], snr_db=-10.0) for _ in range(2)]
    assert noisy[0].tokens == noisy[1].tokens and noisy[0].score == noisy[1].score  # the same segment
    assert noisy[0].score != clean.score
    in_memory = NoiseSource.from_waveform(read_wav(env["noise"]), name=str(env["noise"]))
    by_array = tr(audio=read_wav(wav), noise=in_memory, snr_db=-10.0, key="u2")
    assert by_array.score == noisy[0].score  # the segment is a function of the key (and the noise's name)
    with pytest.raises(InferenceError, match="go together"):
        tr(audio=wav, noise=env["noise"])


def test_audio_at_another_sample_rate_is_resampled(env, tmp_path):
    import torchaudio

    tr = _transcriber(env)
    wav = read_wav(env["utts"][0][1])
    wav48 = torchaudio.functional.resample(wav, 16000, 48000)
    write_wav(tmp_path / "a48.wav", wav48, sample_rate=48000)
    from_file = tr(audio=tmp_path / "a48.wav")
    from_array = tr(audio=wav48, sample_rate=48000)
    assert from_file.info["resampled_from_hz"] == 48000 and from_array.info["resampled_from_hz"] == 48000
    assert abs(from_file.num_frames - 30) <= 1 and from_array.num_frames == from_file.num_frames


def test_audio_recorded_below_16k_gets_a_warning_unless_the_model_heard_narrowband(env, tmp_path, caplog):
    import torchaudio

    wav = read_wav(env["utts"][0][1])
    wav8 = torchaudio.functional.resample(wav, 16000, 8000)
    write_wav(tmp_path / "a8.wav", wav8, sample_rate=8000)
    wav48 = torchaudio.functional.resample(wav, 16000, 48000)
    tr = _transcriber(env)
    with caplog.at_level(logging.WARNING, logger="avsr.inference"):
        out = tr.transcribe_batch([TranscribeItem(audio=tmp_path / "a8.wav", key="phone"),
                                   TranscribeItem(audio=wav48, sample_rate=48000, key="studio"),
                                   TranscribeItem(audio=wav, key="plain")], modality="audio")
    assert "recorded at 8000 Hz: no frequencies above 4000 Hz" in out[0].info["warning"]
    assert "warning" not in out[1].info and "warning" not in out[2].info
    lines = [r.getMessage() for r in caplog.records if "below 16 kHz" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("1 of 3 inputs") and "phone at 8000 Hz" in lines[0]
    trained = Transcriber(env["models"][0], env["tokenizer"], DECODE, narrowband_trained=True)
    assert "warning" not in trained(audio=tmp_path / "a8.wav").info


def test_an_array_without_sample_rate_that_sounds_like_8k_gets_a_warning(env, caplog):
    """An array is read as 16 kHz unless ``sample_rate`` says otherwise: one that has (almost) nothing above
    5 kHz while it has energy below gets a warning naming it (8 kHz audio: pass its rate); full-band audio,
    silence and an array with its rate given get none."""
    from avsr.features import narrowband
    from avsr.inference.inputs import high_band_db

    t = torch.arange(16000 * 2) / 16000
    tones = sum(0.1 * torch.sin(2 * math.pi * f * t + f) for f in (220, 700, 1500, 2600, 3400))
    rng = torch.Generator().manual_seed(0)
    noise = 0.1 * torch.randn(32000, generator=rng)
    assert high_band_db(tones) < -60 and high_band_db(narrowband(noise)) < -45 < -10 < high_band_db(noise)
    assert high_band_db(torch.zeros(32000)) is None
    tr = _transcriber(env)
    with caplog.at_level(logging.WARNING, logger="avsr.inference"):
        out = tr.transcribe_batch([TranscribeItem(audio=tones, key="tones"),
                                   TranscribeItem(audio=narrowband(noise), key="phone"),
                                   TranscribeItem(audio=noise, key="wide"),
                                   TranscribeItem(audio=torch.zeros(32000), key="silence"),
                                   TranscribeItem(audio=tones, key="told", sample_rate=16000)])
    assert [r.ok for r in out] == [True] * 5
    for r in out[:2]:
        assert "looks like 8 kHz audio" in r.info["warning"] and "sample_rate=8000" in r.info["warning"]
        assert "expect a higher WER" in r.info["warning"] and r.info["narrowband_db"] <= -45
    assert all("warning" not in r.info and "narrowband_db" not in r.info for r in out[2:])
    lines = [r.getMessage() for r in caplog.records if "8 kHz" in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith("tones: the audio array has almost no energy above 5 kHz")
    assert "\n" not in lines[0] and lines[1].startswith("phone: ")
    # one call, one line; a model trained with the 8 kHz channel reads it well, but the rate may be wrong
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="avsr.inference"):
        single = tr(audio=tones)
    assert "sample_rate=8000" in single.info["warning"]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["utt0"]
    trained = Transcriber(env["models"][0], env["tokenizer"], DECODE, narrowband_trained=True)
    warning = trained(audio=tones).info["warning"]
    assert "sample_rate=8000" in warning and "expect a higher WER" not in warning
    # the caller that reports warnings itself (avsr transcribe): in info, not in the log
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="avsr.inference"):
        quiet = tr.transcribe_batch([TranscribeItem(audio=tones), TranscribeItem(video="gone.mp4")],
                                    report=False)
    assert "sample_rate=8000" in quiet[0].info["warning"] and not quiet[1].ok and not caplog.records


def test_bad_inputs_are_errors_naming_the_input(env, tmp_path):
    tr = _transcriber(env)
    mp4, wav = env["utts"][0]
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video at all" * 100)
    roi = read_video(mp4).numpy()
    samples = read_wav(wav)
    cases = [
        (dict(video=tmp_path / "missing.mp4"), "missing.mp4: no such file"),
        (dict(video=garbage), "garbage.mp4: cannot read"),
        (dict(video=mp4, audio=mp4), "no audio track"),  # a ROI mp4 without sound as the audio
        (dict(audio=wav, modality="video"), "no video given"),
        (dict(audio=torch.zeros(0)), "is empty"),
        (dict(audio=samples[:500]), "1 frame(s) long"),
        (dict(video=roi[:1]), "1 frame(s) long"),
        (dict(audio=torch.full((16000,), float("nan"))), "NaN or infinite"),
        (dict(audio=torch.zeros(2, 16000)), "must be mono"),
        (dict(audio=torch.zeros(16000, dtype=torch.int16)), "must be float"),
        (dict(audio=samples, sample_rate=100), "cannot be right"),
        (dict(video=roi.astype(np.float32)), "must be uint8"),
        (dict(video=roi[:, :50, :50]), "(T, H, W) with H, W >= 88"),
        (dict(video=mp4, audio=samples[: 640 * 20]), "must agree within 2 frames"),
        (dict(video="x" * 3), "xxx: no such file"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(InferenceError) as err:
            tr(**kwargs)
        assert expected in str(err.value), (kwargs, str(err.value))
    with pytest.raises(InferenceError, match="modality must be one of"):
        tr(audio=wav, modality="lips")


def test_a_bad_item_in_a_batch_is_reported_and_the_others_returned(env, tmp_path):
    tr = _transcriber(env)
    (m0, w0), (m1, w1) = env["utts"][:2]
    items = [TranscribeItem(video=m0, audio=w0),
             TranscribeItem(video=tmp_path / "gone.mp4", audio=w1, key="gone"),
             {"video": m1, "audio": w1}, TranscribeItem(audio=torch.full((9000,), float("inf")), key="inf")]
    out = tr.transcribe_batch(items)
    assert [r.key for r in out] == ["u0", "gone", "u1", "inf"]
    assert [r.ok for r in out] == [True, False, True, False]
    assert "gone.mp4: no such file" in out[1].error and out[1].text == ""
    assert "inf: the audio array has NaN or infinite samples" in out[3].error
    assert out[0].tokens == tr(video=m0, audio=w0).tokens
    with pytest.raises(InferenceError) as err:
        tr.transcribe_batch(items, strict=True)
    assert "gone.mp4" in str(err.value) and "inf:" in str(err.value)
    with pytest.raises(InferenceError, match="unknown field"):
        tr.transcribe_batch([{"vid": m0}])


def test_bare_paths_take_the_streams_the_file_has(env, tmp_path):
    from avsr.data.media import write_av_video

    tr = _transcriber(env)
    mp4, wav = env["utts"][3]
    both = tmp_path / "both.mp4"
    write_av_video(both, read_video(mp4).numpy(), read_wav(wav))
    out = tr.transcribe_batch([both, wav, mp4])
    assert [r.modality for r in out] == ["audiovisual", "audio", "video"]
    assert all(r.ok for r in out)


def test_the_decoding_stage_reports_bad_utterances_and_guards_its_results(env, tmp_path, capsys):
    from avsr.bin.decode import main as decode
    from avsr.data.datadir import Utterance, write_datadir
    from avsr.eval.scoring import collect_decode_dir

    utts = [Utterance(f"spk-u{i}", "spk", wav=str(w), video=str(v), text="BIN BLUE AT F TWO NOW")
            for i, (v, w) in enumerate(env["utts"])]
    utts.append(Utterance("spk-gone", "spk", wav=str(env["utts"][0][1]), video=str(tmp_path / "gone.mp4"),
                          text="LAY RED BY G NINE SOON"))
    write_datadir(tmp_path / "data", utts)
    decode_yaml = tmp_path / "decode.yaml"
    decode_yaml.write_text("beam_size: 2\nctc_weight: 0.3\nmaxlenratio: 0.3\nminlenratio: 0.1\n")
    args = ["--exp-dir", str(env["exp"]), "--data", str(tmp_path / "data"), "--test-set", "t",
            "--decode-config", str(decode_yaml), "--modalities", "audiovisual",
            "--out", str(tmp_path / "dec"), "--noise-file", str(env["noise"]), "--snrs", "0"]
    # a missing media file: refused before anything is decoded, the utterance and the file named
    capsys.readouterr()
    assert decode(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("avsr-decode: error: "), err
    assert "video.scp: utterance 'spk-gone'" in err and "gone.mp4: no such file" in err, err
    assert not list((tmp_path / "dec").glob("t/*/*/hyp"))
    # ... also where only the audio is missing but video-only decoding reads it for the training edges
    (tmp_path / "gone.mp4").write_bytes(env["utts"][0][0].read_bytes())
    (tmp_path / "data/wav.scp").write_text((tmp_path / "data/wav.scp").read_text().replace(
        str(env["utts"][0][1]), str(tmp_path / "gone.wav")))
    assert decode([*args[:9], "video", *args[10:], "--edge-frames", "5,4"]) == 1
    assert "wav.scp: utterance 'spk-gone'" in capsys.readouterr().err
    # a file that exists but cannot be decoded: listed in failed, scored as all errors (an unreadable video
    # alone would be decoded from the audio: tests/test_video_input.py)
    scp = (tmp_path / "data/wav.scp").read_text().replace(str(tmp_path / "gone.wav"), str(env["utts"][0][1]))
    (tmp_path / "data/wav.scp").write_text("".join(
        f"spk-gone {tmp_path / 'gone.wav'}\n" if line.startswith("spk-gone ") else line
        for line in scp.splitlines(keepends=True)))
    (tmp_path / "gone.wav").write_bytes(b"not a wav")
    (tmp_path / "gone.mp4").write_bytes(b"not a video")
    assert decode(args) == 0
    clean = tmp_path / "dec/t/audiovisual/clean"
    failed = (clean / "failed").read_text()
    assert failed.startswith("spk-gone ") and "gone.wav" in failed
    hyps = (clean / "hyp").read_text().splitlines()
    assert [h.split()[0] for h in hyps] == [f"spk-u{i}" for i in range(4)]
    rows = {r["noise"]: r for r in collect_decode_dir(tmp_path / "dec")}
    assert rows["clean"]["num_failed"] == 1 and rows["clean"]["num_utts"] == 5  # counted, all words deleted
    before = (clean / "hyp").stat().st_mtime_ns
    assert decode(args) == 0 and (clean / "hyp").stat().st_mtime_ns == before  # resumed: nothing to do
    decode_yaml.write_text("beam_size: 3\nctc_weight: 0.3\nmaxlenratio: 0.3\nminlenratio: 0.1\n")
    capsys.readouterr()
    assert decode(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("avsr-decode: error:") and "decode_config differ" in err and "--overwrite" in err
    assert len(err.splitlines()) == 1
    assert decode([*args, "--overwrite"]) == 0 and (clean / "hyp").stat().st_mtime_ns != before


@pytest.mark.parametrize("pause", [(40, 41), (40, 43), (39, 42)], ids=["one_frame", "from_there", "around"])
def test_pause_cuts_take_a_pause_right_at_max_frames(pause):
    from avsr.inference import pause_cuts

    max_frames = 40
    activity = torch.full((100,), 50.0)
    activity[pause[0] : pause[1]] = -40.0  # its smoothed minimum at frame 40 or 41
    cuts = pause_cuts(activity, max_frames)
    assert cuts[0] == max_frames  # a first piece of exactly max_frames frames, cut in the pause
    bounds = [0, *cuts, 100]
    assert all(0 < b - a <= max_frames for a, b in zip(bounds[:-1], bounds[1:]))
    # at the limit itself nothing is cut; one frame more is
    assert pause_cuts(activity[:max_frames], max_frames) == []
    assert pause_cuts(activity[: max_frames + 1], max_frames) == [max_frames]


def test_pause_cuts_cut_in_the_quietest_stretch_within_the_limit():
    from avsr.inference import pause_cuts

    activity = torch.full((100,), 50.0)
    activity[30:34] = -40.0  # a pause
    activity[70:72] = -30.0  # a shorter, louder pause
    assert pause_cuts(activity, max_frames=50) == [32, 71]  # the middle of the smoothed minimum of each pause
    assert all(b - a <= 40 for a, b in zip([0, *pause_cuts(activity, 40)], [*pause_cuts(activity, 40), 100]))
    assert pause_cuts(activity[:40], max_frames=50) == []


def test_long_input_is_cut_at_pauses_decoded_batched_and_joined(env):
    rng = np.random.default_rng(7)
    lengths, gap = [45, 60, 38, 52, 47, 58, 41, 55, 49, 44], 12
    wav, frames, gaps, t = [], [], [], 0
    for n in lengths:
        wav += [torch.from_numpy(rng.normal(0, 0.1, n * 640)).float(), torch.zeros(gap * 640)]
        frames += [torch.from_numpy(rng.integers(0, 256, (n, 96, 96), dtype=np.uint8)),
                   torch.full((gap, 96, 96), 128, dtype=torch.uint8)]
        gaps.append((t + n, t + n + gap))
        t += n + gap
    wav, frames = torch.cat(wav), torch.cat(frames)
    tr = Transcriber(env["models"][0], env["tokenizer"], DECODE, max_segment_s=3.0)
    long = tr(video=frames, audio=wav)
    bounds = [[round(a * 25), round(b * 25)] for a, b in long.info["segments_s"]]
    assert bounds[0][0] == 0 and bounds[-1][1] == t == long.num_frames
    assert all(b - a <= 75 for a, b in bounds) and all(x[1] == y[0] for x, y in zip(bounds, bounds[1:]))
    for a, _ in bounds[1:]:  # every cut lies in a pause
        assert any(lo <= a <= hi for lo, hi in gaps), (a, gaps)
    pieces = [tr(video=frames[a:b], audio=wav[a * 640 : b * 640]) for a, b in bounds]
    assert long.text == " ".join(p.text for p in pieces if p.text)
    assert long.tokens == [x for p in pieces for x in p.tokens]
    assert long.score == pytest.approx(sum(p.score for p in pieces), rel=1e-4)
    times = [x for w in long.words for x in (w.start, w.end)]
    assert times == sorted(times) and times[-1] <= t / 25
    # a video cache over two conditions: the noisy audio is cut at other bounds, whose segments take none
    # of the clean segments' video front-end output (segments are cached by their bounds)
    cache: dict = {}
    tr.transcribe_batch([TranscribeItem(video=frames, audio=wav, key="long")], video_cache=cache)
    noisy = tr.transcribe_batch([TranscribeItem(video=frames, audio=wav, key="long")], noise=env["noise"],
                                snr_db=0.0, video_cache=cache)[0]
    plain = tr.transcribe_batch([TranscribeItem(video=frames, audio=wav, key="long")], noise=env["noise"],
                                snr_db=0.0)[0]
    assert noisy.info["segments_s"] == plain.info["segments_s"] != long.info["segments_s"]
    assert noisy.tokens == plain.tokens and noisy.score == plain.score
    # not cut: a warning when the input is longer than the training range
    whole = Transcriber(env["models"][0], env["tokenizer"], DECODE, train_max_s=3.0)(video=frames, audio=wav)
    assert "longer than the longest training utterance" in whole.info["warning"]


def test_avsr_transcribe_reports_a_missing_input_and_writes_the_others(env, tmp_path, capsys):
    import json

    from avsr.cli import main as avsr_main

    decode = tmp_path / "decode.yaml"
    decode.write_text("beam_size: 2\nctc_weight: 0.3\nmaxlenratio: 0.3\nminlenratio: 0.1\n")
    good = env["utts"][0][0]
    status = avsr_main(["transcribe", str(tmp_path / "missing.mp4"), str(good), "--checkpoint",
                        str(env["exp"]), "--decode-config", str(decode), "--modality", "video", "--json",
                        str(tmp_path / "o.json")])
    captured = capsys.readouterr()
    assert status == 1
    first = captured.err.strip().splitlines()[0]
    assert first == f"avsr-transcribe: error: {tmp_path / 'missing.mp4'}: no such file or folder"
    assert captured.out.startswith(f"{good}\t")
    rows = json.loads((tmp_path / "o.json").read_text())
    assert rows[0]["file"] == str(tmp_path / "missing.mp4") and "no such file" in rows[0]["error"]
    assert rows[1]["file"] == str(good) and rows[1]["modality"] == "video" and "error" not in rows[1]


def _edged(env, before: int, after: int, utt: int = 1):
    """Utterance ``utt`` with ``before``/``after`` frames of digital silence (and the mouth at rest)."""
    mp4, wav = env["utts"][utt]
    frames, samples = read_video(mp4), read_wav(wav)
    rest = [frames[:1].expand(before, -1, -1), frames, frames[-1:].expand(after, -1, -1)]
    return torch.cat(rest), torch.cat([torch.zeros(640 * before), samples, torch.zeros(640 * after)])


def test_inputs_get_the_models_training_edges_in_sync_and_keep_their_time_line(env):
    off = _transcriber(env)
    on = Transcriber(env["models"][0], env["tokenizer"], DECODE, edge_frames=(5, 4))
    frames, wav = _edged(env, 9, 1)
    target_frames, target_wav = _edged(env, 5, 4)  # what the input becomes: 4 frames cut, 3 added
    for modality in ("audiovisual", "audio", "video"):
        got = on(video=frames, audio=wav, modality=modality)
        want = off(video=target_frames, audio=target_wav, modality=modality)
        assert got.info["edges_changed_frames"] == [-4, 3]
        assert got.tokens == want.tokens and got.score == pytest.approx(want.score, rel=1e-5)
        assert got.num_frames == 45 + 10  # the input's own length, not the changed one
        assert all(0 <= w.start <= w.end <= got.duration_s for w in got.words)
        starts = [w.start for w in want.words]  # the word times, moved back by the 4 frames cut
        assert [w.start for w in got.words] == pytest.approx([min(max(x + 4 / 25, 0), 2.2) for x in starts])
    # edges that cannot be found change nothing, and say why
    noisy = on(audio=wav, noise=env["noise"], snr_db=0.0, key="x")
    assert "edges_changed_frames" not in noisy.info and "no silence" in noisy.info["edges_note"]
    assert noisy.tokens == off(audio=wav, noise=env["noise"], snr_db=0.0, key="x").tokens
    assert "no audio" in on(video=frames).info["edges_note"]
    assert on(video=target_frames, audio=target_wav).info.get("edges_changed_frames") is None
    ranged = Transcriber(env["models"][0], env["tokenizer"], DECODE, edge_frames=((4, 6), (3, 5)))
    assert ranged(video=frames, audio=wav).info["edges_changed_frames"] == [-3, 2]  # to 6 and 3
    assert "edges_changed_frames" not in ranged(video=target_frames, audio=target_wav).info  # inside: kept
    for bad in ((5, -1), (5, (4, 3)), (5, 51), "54"):
        with pytest.raises(ValueError, match="edge_frames"):
            Transcriber(env["models"][0], env["tokenizer"], DECODE, edge_frames=bad)


def test_the_video_cache_keeps_each_change_of_the_edges_apart(env):
    on = Transcriber(env["models"][0], env["tokenizer"], DECODE, edge_frames=(5, 4))
    frames, wav = _edged(env, 9, 1)
    items = [TranscribeItem(video=frames, audio=wav, key="a"),
             TranscribeItem(video=read_video(env["utts"][2][0]), audio=read_wav(env["utts"][2][1]), key="b")]
    cache: dict = {}
    clean = on.transcribe_batch(items, video_cache=cache)
    assert sorted(cache) == [("a", (-4, 3)), ("b", (0, 0))]  # "b" has no silence: as given
    model = on.model
    encode, frames_run = model.encoder.encode_video, []

    def counted(video, lengths):
        frames_run.append(int(lengths.sum()))
        return encode(video, lengths)

    model.encoder.encode_video = counted
    try:  # "a" as given too: made from its cached version and its two ends, run through the front-end
        noisy = on.transcribe_batch(items, noise=env["noise"], snr_db=0.0, video_cache=cache)
    finally:
        del model.encoder.encode_video
    # of 55 frames: 0-5 (the 4 cut before plus the stem's reach) and 53-54, each clip with its 2-frame
    # window; "b" is cached as it is
    assert frames_run == [(6 + 2) + (2 + 2)]
    assert sorted(cache) == [("a", (-4, 3)), ("a", (0, 0)), ("b", (0, 0))]
    assert cache["a", (0, 0)].shape[-1] == 55
    plain = [on.transcribe_batch(items, noise=n, snr_db=s) for n, s in ((None, None), (env["noise"], 0.0))]
    assert [r.tokens for r in clean] == [r.tokens for r in plain[0]]
    assert [r.tokens for r in noisy] == [r.tokens for r in plain[1]]


def test_from_pretrained_takes_the_edges_its_trainer_recorded(env, tmp_path):
    from avsr.inference import model_edge_frames, parse_edge_frames

    ckpt = torch.load(env["exp"] / "epoch2.pt", weights_only=False)
    ckpt["data_stats"] = {"max_frames": 60, "num_utts": 4, "edge_frames": [[4, 6], [3, 5]]}
    exp = tmp_path / "exp"
    exp.mkdir()
    save_atomic(ckpt, exp / "epoch2.pt")
    (exp / "bpe.model").write_bytes((env["exp"] / "bpe.model").read_bytes())
    assert model_edge_frames(exp) == ((4, 6), (3, 5)) and model_edge_frames(env["exp"]) is None
    assert Transcriber.from_pretrained(exp, decode_config=DECODE).edge_frames == ((4, 6), (3, 5))
    assert Transcriber.from_pretrained(exp, decode_config=DECODE, edge_frames=None).edge_frames is None
    assert Transcriber.from_pretrained(exp, decode_config=DECODE, edge_frames=(2, 2)).edge_frames == (
        (2, 2), (2, 2))
    assert Transcriber.from_pretrained(env["exp"], decode_config=DECODE).edge_frames is None
    assert not Transcriber.from_pretrained(exp, decode_config=DECODE).narrowband_trained
    ckpt["data_stats"]["narrowband_prob"] = 0.2  # the trainer records it: the model heard 8 kHz audio
    save_atomic(ckpt, exp / "epoch2.pt")
    assert Transcriber.from_pretrained(exp, decode_config=DECODE).narrowband_trained
    assert parse_edge_frames("model") == "model" and parse_edge_frames("off") is None
    assert parse_edge_frames(" 5,4 ") == ((5, 5), (4, 4))
    assert parse_edge_frames("4-6,3") == ((4, 6), (3, 3))
    for bad in ("5", "a,b", "5,4,3", "-1,2", "51,0", "6-4,3", "1-2-3,4"):
        with pytest.raises(ValueError, match="edge frames"):
            parse_edge_frames(bad)


def test_the_model_defaults_come_from_one_checkpoint_read(env, tmp_path):
    from avsr.inference import model_defaults, model_view_weights

    assert model_defaults(env["exp"]) == (None, (0.0, 0.0, 0.0), {})
    assert model_view_weights(env["exp"]) == (0.0, 0.0, 0.0)
    ckpt = torch.load(env["exp"] / "epoch2.pt", weights_only=False)
    ckpt["data_stats"] = {"edge_frames": [[4, 6], [3, 5]]}
    ckpt["model_config"]["encoder_conf"]["audio_gate"] = True  # read from the config, the model not built
    ckpt["model_config"]["decode_defaults"] = {"video_weight": 2.5, "audio_weight": 0.75,
                                               "audio_confidence": 2.0, "video_sync_margin": 0.2}
    save_atomic(ckpt, tmp_path / "gated.pt")
    defaults = model_defaults(tmp_path / "gated.pt")
    assert defaults == (((4, 6), (3, 5)), (2.5, 0.75, 2.0), ckpt["model_config"]["decode_defaults"])
    assert defaults.view_weights.audio_weight == 0.75 and defaults.edge_frames == ((4, 6), (3, 5))
    assert model_view_weights(tmp_path / "gated.pt") == (2.5, 0.75, 2.0)
    with pytest.raises(FileNotFoundError, match="no such experiment directory"):
        model_defaults(tmp_path / "missing")


def test_each_piece_of_a_long_input_gets_the_edges_of_its_own(env):
    rng = np.random.default_rng(8)
    lengths, gap = [45, 60, 38, 52, 47], 12
    wav, t = [], 0
    for n in lengths:
        wav += [torch.from_numpy(rng.normal(0, 0.1, n * 640)).float(), torch.zeros(gap * 640)]
        t += n + gap
    wav = torch.cat(wav)
    tr = Transcriber(env["models"][0], env["tokenizer"], DECODE, max_segment_s=3.0, edge_frames=(5, 4))
    long = tr(audio=wav)
    assert long.num_frames == t and "edges_changed_frames" not in long.info
    bounds = [[round(a * 25), round(b * 25)] for a, b in long.info["segments_s"]]
    changes = long.info["segments_edges_changed_frames"]
    assert len(changes) == len(bounds) >= 2
    pieces = [tr(audio=wav[a * 640: b * 640]) for a, b in bounds]  # each piece alone gets the same change
    assert changes == [p.info.get("edges_changed_frames") for p in pieces]
    assert changes[0][0] == 5 and changes[-1][1] == 4 - gap  # speech at the first frame; 12 silent at the end
    assert long.tokens == [x for p in pieces for x in p.tokens]
    times = [x for w in long.words for x in (w.start, w.end)]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= t / 25


def test_video_only_calls_give_the_decoding_stages_hypotheses_given_the_audio_for_the_edges(
        env, tmp_path, caplog):
    from avsr.bin.decode import main as decode
    from avsr.data.datadir import Utterance, write_datadir
    from avsr.data.media import write_video as write_mp4

    utts = []
    for i, (before, after) in enumerate([(9, 1), (0, 8)]):  # silent frames to cut, to add
        frames, wav = _edged(env, before, after, utt=i)
        write_wav(tmp_path / f"e{i}.wav", wav)
        write_mp4(tmp_path / f"e{i}.mp4", frames.numpy())
        utts.append(Utterance(f"spk-e{i}", "spk", wav=str(tmp_path / f"e{i}.wav"),
                              video=str(tmp_path / f"e{i}.mp4"), text="BIN BLUE AT F TWO NOW"))
    write_datadir(tmp_path / "data", utts)
    decode_yaml = tmp_path / "decode.yaml"
    decode_yaml.write_text(yaml.safe_dump(DECODE))
    assert decode(["--exp-dir", str(env["exp"]), "--data", str(tmp_path / "data"), "--test-set", "t",
                   "--decode-config", str(decode_yaml), "--modalities", "video", "--edge-frames", "5,4",
                   "--average-nbest", "1", "--out", str(tmp_path / "dec")]) == 0
    lines = (tmp_path / "dec/t/video/clean/hyp").read_text().splitlines()
    stage = {k: v for k, _, v in (line.partition(" ") for line in lines)}
    on = Transcriber(env["models"][1], env["tokenizer"], DECODE, edge_frames=(5, 4))  # the best epoch's
    for u in utts:  # the audio given too: it places the edges, as the stage's wav.scp does
        assert on(video=u.video, audio=u.wav, modality="video", key=u.utt_id).text == stage[u.utt_id]
    caplog.clear()
    alone = on(video=utts[0].video, key=utts[0].utt_id)  # the video alone: edges kept, and said so
    assert alone.info["edges_note"].startswith("no audio") and "edges_changed_frames" not in alone.info
    assert "without audio (the first: spk-e0)" in caplog.text
    assert alone.text == _transcriber(env, 1)(video=utts[0].video).text  # as decoded with the edges off
    assert alone.text != stage["spk-e0"]  # which is why the two paths differ without the audio


def test_the_decoding_stage_gives_the_training_edges_and_decodes_video_in_every_condition(env, tmp_path):
    from avsr.bin.decode import main as decode
    from avsr.data.datadir import Utterance, write_datadir
    from avsr.data.media import write_video as write_mp4

    frames, wav = _edged(env, 9, 1)
    write_wav(tmp_path / "e.wav", wav)
    write_mp4(tmp_path / "e.mp4", frames.numpy())
    write_datadir(tmp_path / "data", [Utterance("spk-e", "spk", wav=str(tmp_path / "e.wav"),
                                                video=str(tmp_path / "e.mp4"), text="BIN BLUE AT F TWO NOW")])
    decode_yaml = tmp_path / "decode.yaml"
    decode_yaml.write_text("beam_size: 2\nctc_weight: 0.3\nmaxlenratio: 0.3\nminlenratio: 0.1\n")
    args = ["--exp-dir", str(env["exp"]), "--data", str(tmp_path / "data"), "--test-set", "t",
            "--decode-config", str(decode_yaml), "--modalities", "video", "--out", str(tmp_path / "dec"),
            "--noise-file", str(env["noise"]), "--snrs", "0", "--edge-frames", "5,4"]
    assert decode(args) == 0
    settings = yaml.safe_load((tmp_path / "dec/t/video/decode_settings.yaml").read_text())
    assert settings["edge_frames"] == [[5, 5], [4, 4]]
    tr = Transcriber.from_pretrained(env["exp"], decode_config=DECODE)  # each condition: the clean edges
    stored = read_video(tmp_path / "e.mp4")  # H.264: not the frames written
    index = torch.arange(4, stored.shape[0] + 3).clamp(max=stored.shape[0] - 1)  # 4 frames cut, 3 added
    want = {"clean": tr(video=stored[index]).text, "babble_0": tr(video=stored).text}  # noisy: edges kept
    assert want["clean"] != want["babble_0"]
    for cond, text in want.items():
        assert (tmp_path / f"dec/t/video/{cond}/hyp").read_text().split(maxsplit=1)[1].strip() == text
    assert decode([*args[:-2], "--edge-frames", "off"]) == 2  # other settings: refused, named


def test_settings_are_given_when_the_transcriber_is_built(env, tmp_path):
    from avsr.inference import DEFAULT_SEGMENT_S

    tr = Transcriber(env["models"][0], env["tokenizer"], DECODE, decode_overrides={"beam_size": 3})
    assert tr.config == DecodeConfig(**{**DECODE, "beam_size": 3}) and tr.searcher.config is tr.config
    decode_yaml = tmp_path / "decode.yaml"
    decode_yaml.write_text(yaml.safe_dump(DECODE))
    by_path = Transcriber(env["models"][0], env["tokenizer"], decode_yaml, decode_overrides={"beam_size": 4})
    assert by_path.config.beam_size == 4 and by_path.config.ctc_weight == 0.3
    assert Transcriber.from_pretrained(env["exp"], decode_overrides={"beam_size": 5}).config == DecodeConfig(
        beam_size=5)  # over the model's defaults
    assert Transcriber.from_pretrained(env["exp"], max_segment_s="model").max_segment_s == DEFAULT_SEGMENT_S
    ckpt = torch.load(env["exp"] / "epoch2.pt", weights_only=False)
    ckpt["data_stats"] = {"max_frames": 60}
    save_atomic(ckpt, tmp_path / "m.pt")
    (tmp_path / "bpe.model").write_bytes((env["exp"] / "bpe.model").read_bytes())
    assert Transcriber.from_pretrained(tmp_path / "m.pt", max_segment_s="model").max_segment_s == 60 / 25
    with pytest.raises(ValueError, match="max_segment_s"):
        Transcriber.from_pretrained(tmp_path / "m.pt", max_segment_s="auto")
    with pytest.raises(ValueError, match="max_segment_s must be at least"):
        Transcriber(env["models"][0], env["tokenizer"], DECODE, max_segment_s=0.1)


def test_errors_speak_to_the_api_caller_and_the_cli_names_its_options(env):
    from avsr.bin.transcribe import cli_message

    tr = _transcriber(env)
    wav = env["utts"][0][1]
    with pytest.raises(InferenceError) as err:
        tr(video=wav)  # a wav has no video track
    assert "(try modality='audio')" in str(err.value) and "--modality" not in str(err.value)
    with pytest.raises(InferenceError) as err:
        tr(audio=wav, modality="video")
    assert "no video given" in str(err.value) and "modality='audio'" in str(err.value)
    assert cli_message(str(err.value)).endswith("(try --modality audio)")
    assert cli_message("x: no face (... with the audio modality: modality='audio')") == (
        "x: no face (... with the audio modality: --modality audio)")


def test_avsr_transcribe_builds_the_transcriber_with_its_settings(env, tmp_path, monkeypatch):
    from avsr.bin import transcribe
    from avsr.inference import Transcript

    built = {}

    class Built:
        def transcribe_batch(self, items, **kwargs):
            built.update(batch=kwargs)
            return [Transcript(key=Path(i).stem, text="X") for i in items]

    def from_pretrained(source, **kwargs):
        built.update(kwargs)
        return Built()

    monkeypatch.setattr(Transcriber, "from_pretrained", from_pretrained)
    mp4 = env["utts"][0][0]
    args = [str(mp4), "--checkpoint", str(env["exp"]), "--beam-size", "7"]
    assert transcribe.main(args) == 0
    assert built["decode_overrides"] == {"beam_size": 7} and built["max_segment_s"] == "model"
    # each input in what it has (bare paths), and the tool reports the failures itself
    assert built["batch"]["modality"] is None and built["batch"]["report"] is False
    assert transcribe.main([*args, "--max-segment-s", "0"]) == 0 and built["max_segment_s"] is None
    assert transcribe.main([str(mp4), "--checkpoint", "x", "--max-segment-s", "4"]) == 0
    assert built["max_segment_s"] == 4.0 and built["decode_overrides"] is None
    with pytest.raises(SystemExit):
        transcribe.main([*args, "--max-segment-s", "0.1"])


def test_the_decoding_stage_is_a_library_call_whose_conflicts_name_no_cli_option(env, tmp_path):
    from avsr.data.datadir import Utterance, write_datadir
    from avsr.inference.decode_dir import DecodeJob, SettingsConflict, decode_test_set

    (v, w) = env["utts"][0]
    write_datadir(tmp_path / "data", [Utterance("spk-u0", "spk", wav=str(w), video=str(v), text="BIN BLUE")])
    decode_yaml = tmp_path / "decode.yaml"
    decode_yaml.write_text(yaml.safe_dump(DECODE))
    job = DecodeJob(source=env["exp"], bpemodel=None, decode_config=str(decode_yaml), data=tmp_path / "data",
                    out=tmp_path / "dec", test_set="t", modalities=["audio"], noise_file=env["noise"],
                    snrs=[0.0], average_nbest=1)
    assert job.conditions() == [("clean", None), ("babble_0", 0.0)]
    assert decode_test_set(job) == tmp_path / "dec/t"
    hyp = (tmp_path / "dec/t/audio/clean/hyp").read_text().split(maxsplit=1)
    assert hyp[0] == "spk-u0" and hyp[1].strip() == Transcriber(env["models"][1], env["tokenizer"], DECODE)(
        audio=w).text
    job.edge_frames = (5, 4)
    with pytest.raises(SettingsConflict, match="edge_frames differ") as err:
        decode_test_set(job)
    assert "--" not in str(err.value).replace(str(tmp_path), "")


def test_the_decoding_stage_takes_audio_and_video_from_the_audio_visual_pass_as_decoded_alone(
        env, tmp_path, monkeypatch):
    from avsr.bin.decode import main as decode
    from avsr.data.datadir import Utterance, write_datadir

    exp = tmp_path / "exp"  # a model with an audio gate whose defaults search both views (confidence check)
    exp.mkdir()
    (exp / "bpe.model").write_bytes((env["exp"] / "bpe.model").read_bytes())
    ckpt = torch.load(env["exp"] / "epoch2.pt", weights_only=False)
    ckpt["model_config"] = copy.deepcopy(ckpt["model_config"])
    ckpt["model_config"]["encoder_conf"]["audio_gate"] = True
    ckpt["model_config"]["decode_defaults"] = {"video_weight": 1.0, "audio_weight": 3.0,
                                               "audio_confidence": 2.0}
    torch.manual_seed(3)
    ckpt["model"] = AVSRModel.from_config(ckpt["model_config"]).state_dict()
    save_atomic(ckpt, exp / "epoch1.pt")
    utts = [Utterance(f"spk-u{i}", "spk", wav=str(w), video=str(v), text="BIN BLUE AT F TWO NOW")
            for i, (v, w) in enumerate(env["utts"])]
    (tmp_path / "bad.mp4").write_bytes(b"not a video")  # audio-visual and video-only decoding fail on it
    utts.append(Utterance("spk-bad", "spk", wav=str(env["utts"][0][1]), video=str(tmp_path / "bad.mp4"),
                          text="LAY RED BY G NINE SOON"))
    write_datadir(tmp_path / "data", utts)
    calls = []
    transcribe_batch = Transcriber.transcribe_batch

    def counted(self, items, **kw):
        calls.append((kw["modality"], len(items), kw.get("views")))
        return transcribe_batch(self, items, **kw)

    monkeypatch.setattr(Transcriber, "transcribe_batch", counted)

    def run(out, *modalities):
        calls.clear()
        assert decode(["--exp-dir", str(exp), "--data", str(tmp_path / "data"), "--test-set", "t",
                       "--average-nbest", "1", "--decode-config", str(tmp_path / "decode.yaml"),
                       "--modalities", *modalities, "--out", str(tmp_path / out), "--noise-file",
                       str(env["noise"]), "--snrs", "0"]) == 0
        return list(calls)

    (tmp_path / "decode.yaml").write_text(yaml.safe_dump(DECODE))
    together = run("all", "audio", "video", "audiovisual")
    # one audio-visual pass per condition gives all three; only the utterance it failed on is decoded alone
    assert together == [("audiovisual", 5, True), ("audio", 1, False), ("video", 1, False)] * 2
    alone = {m: run(m, m) for m in ("audio", "video")}
    assert alone["audio"] == [("audio", 5, False)] * 2
    for modality in ("audio", "video"):
        for cond in ("clean", "babble_0"):
            got = (tmp_path / f"all/t/{modality}/{cond}/hyp").read_text()
            assert got == (tmp_path / f"{modality}/t/{modality}/{cond}/hyp").read_text(), (modality, cond)
            assert len(got.splitlines()) == (5 if modality == "audio" else 4)
    assert (tmp_path / "all/t/video/clean/failed").read_text().startswith("spk-bad ")
    # results of the audio-visual pass kept; a missing audio-only condition is decoded alone
    (tmp_path / "all/t/audio/babble_0/hyp").unlink()
    assert run("all", "audio", "video", "audiovisual") == [("audio", 5, False)]
    assert (tmp_path / "all/t/audio/babble_0/hyp").read_text() == (
        tmp_path / "audio/t/audio/babble_0/hyp").read_text()
    # without the confidence check the audio-only view is not searched: audio is decoded alone
    (tmp_path / "decode.yaml").write_text(yaml.safe_dump({**DECODE, "audio_confidence": 0.0}))
    assert run("none", "audio", "video", "audiovisual") == [
        ("audiovisual", 5, True), ("audio", 5, False), ("video", 1, False)] * 2


def test_the_views_of_a_cut_input_are_joined_like_its_transcript():
    from avsr.inference import Transcript
    from avsr.inference.segments import join

    def piece(text, view_texts, frames):
        views = {name: Transcript(key="u#x", text=t, tokens=[len(t)], score=-1.0, modality=name,
                                  num_frames=frames) for name, t in view_texts.items()}
        return Transcript(key="u#x", text=text, tokens=[1], score=-2.0, modality="audiovisual",
                          num_frames=frames, views=views)

    later = piece("SOON", {"audio": "SOON", "video": "NOW"}, 40)
    first = piece("BIN BLUE", {"audio": "BIN BLUE", "video": "BIN"}, 60)
    joined = join("u", [(60, later), (0, first)])  # pieces in any order: joined in time order
    assert joined.text == "BIN BLUE SOON" and set(joined.views) == {"audio", "video"}
    assert joined.views["audio"].text == "BIN BLUE SOON" and joined.views["video"].text == "BIN NOW"
    assert joined.views["video"].score == -2.0 and joined.views["video"].num_frames == 100
    assert all(v.key == "u" for v in joined.views.values())
    alone = join("u", [(0, piece("BIN", {"video": "BIN"}, 50))])
    assert alone.key == "u" and alone.views["video"].key == "u"
