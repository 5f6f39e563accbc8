"""`avsr transcribe`: raw face video -> the words of the recipe's decoding of its ROI; word timings; errors.

SynthGRID utterances are written as full-frame face videos (the astronaut speaking the rendered mouth,
:func:`avsr.data.face_video.write_face_utterance`). A tiny random-initialised hybrid CTC/attention model
decodes them twice: through the CLI (raw video in) and through the recipe's path (ROI stage output -> data
dir -> :meth:`avsr.inference.Transcriber.transcribe_batch`, as the decoding stage); the words must be equal.
The property is the equality of the two paths, not accuracy, so no training is needed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from avsr.cli import SUBCOMMANDS
from avsr.cli import main as avsr_main
from avsr.decode.align import AlignmentError, TokenSpan, ctc_align, group_words, word_timings
from tests.test_inference import CONFIG as TINY_MODEL
from tests.test_inference import DECODE, env  # noqa: F401 (a tiny model and ROI mp4 + wav utterances)

needs_media = pytest.mark.skipif(
    importlib.util.find_spec("mediapipe") is None
    or importlib.util.find_spec("skimage") is None
    or shutil.which("festival") is None,
    reason="needs mediapipe, scikit-image and festival",
)


def transcribe(setup: dict, *inputs: str, modality: str | None = None) -> int:
    """``avsr transcribe INPUTS`` with the test model and decoding config; returns the exit status."""
    args = ["transcribe", *inputs, "--checkpoint", str(setup["exp"]), "--decode-config", str(setup["decode"])]
    return avsr_main(args + (["--modality", modality] if modality else []))


# --- CTC forced alignment and word grouping ------------------------------------------------------------


def _peaked(path: list[int], vocab: int) -> torch.Tensor:
    """(T, V) log-probs whose best frame-wise path is ``path``."""
    lp = torch.full((len(path), vocab), -8.0)
    lp[torch.arange(len(path)), torch.tensor(path)] = -0.01
    return lp.log_softmax(-1)


def test_ctc_align_finds_the_frames_of_each_token():
    #        frames: 0 1 2 3 4 5 6 7 8 9
    lp = _peaked([1, 1, 1, 0, 0, 2, 2, 2, 0, 3], vocab=5)
    spans = ctc_align(lp, [1, 2, 3])
    assert [(s.token, s.start, s.end) for s in spans] == [(1, 0, 3), (2, 5, 8), (3, 9, 10)]
    assert all(0.9 < s.score <= 1.0 for s in spans)
    assert ctc_align(lp, []) == []


def test_ctc_align_refuses_impossible_alignments():
    lp = _peaked([1, 0, 2], vocab=4)
    with pytest.raises(AlignmentError, match="need at least 4 frames"):
        ctc_align(lp, [1, 1, 2])  # a repeat needs a blank between: 4 frames
    with pytest.raises(AlignmentError, match="blank"):
        ctc_align(lp, [0, 2])
    with pytest.raises(AlignmentError, match=r"\(T, V\)"):
        ctc_align(lp[None], [1])


def test_group_words_joins_pieces_at_word_boundaries():
    tokens = ["<blank>", "\u2581BIN", "\u2581B", "LUE", "\u2581", "AT", "<sos/eos>"]
    spans = [
        TokenSpan(1, 0, 5, 0.9),
        TokenSpan(2, 6, 8, 0.8),
        TokenSpan(3, 8, 12, 0.6),
        TokenSpan(4, 14, 15, 0.5),
        TokenSpan(5, 15, 20, 0.5),
    ]
    words = group_words(spans, tokens, frame_rate=25.0)
    assert [w.word for w in words] == ["BIN", "BLUE", "AT"]
    assert [(w.start, w.end) for w in words] == [(0.0, 0.2), (0.24, 0.48), (0.56, 0.8)]
    assert words[1].score == pytest.approx((0.8 * 2 + 0.6 * 4) / 6)
    assert word_timings(_peaked([1, 0, 2, 3], 7), [1, 2, 3], tokens)[1].word == "BLUE"


def test_cli_lists_subcommands_and_refuses_unknown_ones(capsys):
    assert avsr_main(["--help"]) == 0
    assert "transcribe" in capsys.readouterr().out
    assert avsr_main(["transcribbe"]) == 2
    assert "unknown subcommand 'transcribbe'" in capsys.readouterr().err
    assert SUBCOMMANDS["transcribe"][0] == "avsr.bin.transcribe"


# --- the command line: help, what each input is decoded in, one line per failure ----------------------


def test_help_is_plain_text_with_defaults_and_needs_no_torch():
    """``avsr transcribe --help`` and ``avsr --help`` answer without importing torch (the library is imported
    after the arguments are parsed), show each option's default and no reST markup."""
    import subprocess
    import sys

    code = ("import sys\nfrom avsr.cli import main\nfor argv in (['transcribe', '--help'], ['--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('torch loaded' if 'torch' in sys.modules else 'no torch')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr
    out = " ".join(run.stdout.split())  # the words, however argparse wrapped them
    assert out.endswith("no torch"), out
    for shown in ("(default: synthgrid)", "(default: cpu)", "(default: auto)", "(default: 5)", "--audio WAV",
                  "default: what each input has"):
        assert shown in out, shown
    for markup in ("``", ":meth:", ":mod:", ":func:", ":class:"):
        assert markup not in out, markup
    # written out for the help, held to the library's values
    from avsr.bin import transcribe
    from avsr.inference.segments import DEFAULT_SEGMENT_S
    from avsr.nn.precision import PRECISIONS

    assert transcribe.PRECISIONS == PRECISIONS and transcribe.DEFAULT_SEGMENT_S == DEFAULT_SEGMENT_S


def _cli(env, tmp_path, *argv: str) -> tuple[int, list[dict]]:  # noqa: F811
    """``avsr transcribe ARGV`` with the tiny model of tests/test_inference.py: exit status, JSON rows."""
    decode = tmp_path / "decode.yaml"
    decode.write_text(yaml.safe_dump(DECODE))
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    status = avsr_main(["transcribe", *argv, "--checkpoint", str(env["exp"]), "--decode-config", str(decode),
                        "--json", str(out)])
    return status, (json.loads(out.read_text()) if out.exists() else [])


@pytest.mark.usefixtures("one_thread")
def test_each_input_is_decoded_in_what_it_has_and_audio_gives_a_silent_video_its_sound(env, tmp_path,  # noqa: F811
                                                                                        capsys):
    from avsr.data.media import read_video, read_wav, write_av_video
    from avsr.inference import TranscribeItem, Transcriber

    (roi0, wav0), (roi1, wav1) = env["utts"][:2]  # ROI mp4s without sound, as the corpus has them
    both = tmp_path / "both.mp4"
    write_av_video(both, read_video(roi1).numpy(), read_wav(wav1))
    tr = Transcriber.from_pretrained(env["exp"], decode_config=DECODE)
    status, rows = _cli(env, tmp_path, str(both), str(wav0), str(roi0))
    assert status == 0, capsys.readouterr().err
    assert [r["modality"] for r in rows] == ["audiovisual", "audio", "video"]
    assert [r["text"] for r in rows] == [r.text for r in tr.transcribe_batch([both, wav0, roi0])]
    capsys.readouterr()
    # --audio: the n-th WAV with the n-th FILE, decoded audio-visually
    status, rows = _cli(env, tmp_path, str(roi0), str(roi1), "--audio", str(wav0), "--audio", str(wav1))
    assert status == 0, capsys.readouterr().err
    expected = tr.transcribe_batch([TranscribeItem(video=roi0, audio=wav0),
                                    TranscribeItem(video=roi1, audio=wav1)])
    assert [(r["file"], r["audio"], r["modality"], r["text"]) for r in rows] == [
        (str(roi0), str(wav0), "audiovisual", expected[0].text),
        (str(roi1), str(wav1), "audiovisual", expected[1].text)]
    assert capsys.readouterr().out == f"{roi0}\t{expected[0].text}\n{roi1}\t{expected[1].text}\n"
    # --modality still decides for every input
    status, rows = _cli(env, tmp_path, str(both), str(roi0), "--audio", str(wav1), "--audio", str(wav0),
                        "--modality", "video")
    assert status == 0 and [r["modality"] for r in rows] == ["video", "video"]
    capsys.readouterr()
    # a silent video alone cannot get the model's edges: one warning line that says how to give it its audio
    assert _cli(env, tmp_path, str(roi0), "--edge-frames", "3,3")[0] == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        "avsr-transcribe: warning: a silent video keeps its silent edges (no audio to find the speech in): "
        f"give its audio with --audio WAV to decode it as the recipe does ({roi0})"]
    assert _cli(env, tmp_path, str(roi0), "--edge-frames", "3,3", "--audio", str(wav0))[0] == 0
    assert capsys.readouterr().err == ""
    for wrong in ([str(roi0), str(roi1), "--audio", str(wav0)], [str(tmp_path), "--audio", str(wav0)]):
        with pytest.raises(SystemExit) as exit_:
            _cli(env, tmp_path, *wrong)
        assert exit_.value.code == 2
    assert "--audio goes with" in capsys.readouterr().err


@pytest.mark.usefixtures("one_thread")
def test_each_failure_is_one_line_naming_the_file(env, tmp_path, capsys, caplog):  # noqa: F811
    missing, garbage = tmp_path / "missing.mp4", tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video at all" * 100)
    roi, wav = env["utts"][0]
    with caplog.at_level(logging.WARNING):
        status, rows = _cli(env, tmp_path, str(missing), str(garbage), str(wav))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 3, err
    assert err[0] == f"avsr-transcribe: error: {missing}: no such file or folder"
    assert err[1].startswith(f"avsr-transcribe: error: {garbage}: cannot read this file as audio or video")
    assert err[2] == "avsr-transcribe: 2 of 3 inputs could not be transcribed"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # the library logs none of them
    assert [("error" in r) for r in rows] == [True, True, False]
    for argv, named in (([str(garbage)], "cannot read this file"),
                        ([str(roi), "--modality", "audiovisual"],
                         "no audio track, but the modality needs one (try --modality video)")):
        status, _ = _cli(env, tmp_path, *argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 1 and len(err) == 1, err
        assert err[0].startswith(f"avsr-transcribe: error: {argv[0]}: ")
        assert named in err[0]


# --- the whole tool on face videos -------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Face videos of 3 SynthGRID utterances, their ROI-stage output, and a tiny random model."""
    if importlib.util.find_spec("mediapipe") is None or importlib.util.find_spec("skimage") is None:
        pytest.skip("needs mediapipe and scikit-image")
    if shutil.which("festival") is None:
        pytest.skip("needs festival")
    from avsr.checkpoint import save_atomic
    from avsr.corpora.synthgrid import grammar
    from avsr.corpora.synthgrid.generate import SynthGridConfig, generate
    from avsr.data.face_video import write_face_utterance
    from avsr.data.roi import preprocess_video
    from avsr.data.tokenizer import Tokenizer, train_sentencepiece
    from avsr.models.asr import AVSRModel

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("transcribe")
    generate(
        root / "sg",
        SynthGridConfig(num_train=0, num_valid=0, num_test=3, test_speakers=1, babble_seconds=0),
        nj=1,
        progress=False,
    )
    faces, corpus = root / "faces", root / "corpus" / "test"
    faces.mkdir()
    for i, roi in enumerate(sorted((root / "sg" / "test").glob("*/*.mp4"))):
        face = faces / f"{roi.stem}.mp4"
        write_face_utterance(roi, roi.with_suffix(".wav"), face, seed=i)
        dst = corpus / roi.parent.name / roi.name  # the ROI stage's output, in the corpus layout
        dst.parent.mkdir(parents=True, exist_ok=True)
        preprocess_video(face, dst, dst.with_suffix(".wav"))
        shutil.copy(roi.with_suffix(".txt"), dst.with_suffix(".txt"))

    rng = np.random.default_rng(0)
    texts = [" ".join(grammar.sample_sentence(rng)) for _ in range(300)]
    exp = root / "exp"
    tokenizer = Tokenizer(train_sentencepiece(texts, exp / "bpe", vocab_size=40))  # exp/bpe.model
    config = {"vocab_size": tokenizer.vocab_size, **TINY_MODEL}  # the tiny model of test_inference
    torch.manual_seed(0)
    model = AVSRModel.from_config(config)
    save_atomic(
        {"model": model.state_dict(), "model_config": config, "epoch": 1, "step": 0, "valid": {"acc": 0.0}},
        exp / "epoch1.pt",
    )
    (root / "decode.yaml").write_text(yaml.safe_dump(DECODE))
    return {
        "root": root,
        "faces": sorted(faces.glob("*.mp4")),
        "corpus": corpus,
        "exp": exp,
        "model": model.eval(),
        "tokenizer": tokenizer,
        "decode": root / "decode.yaml",
    }


def _recipe_hyps(setup, modality: str) -> dict[str, str]:
    """The recipe's decoding of the ROI-stage output (data dir utterances -> Transcriber.transcribe_batch)."""
    from avsr.data.corpus_check import scan_split
    from avsr.inference import Transcriber

    transcriber = Transcriber(setup["model"], setup["tokenizer"], DECODE)
    utts, _ = scan_split(setup["corpus"])
    results = transcriber.transcribe_batch(utts, modality=modality, word_timings=False)
    return {r.key: r.text for r in results}  # SynthGRID utterance ids are the file stems


@needs_media
@pytest.mark.parametrize("modality", ["audiovisual", "video", "audio"])
def test_transcribe_gives_the_recipe_decoding_of_the_roi(setup, modality, tmp_path, capsys):
    out = tmp_path / "out.json"
    status = avsr_main(
        [
            "transcribe",
            str(setup["faces"][0].parent),
            "--checkpoint",
            str(setup["exp"]),
            "--modality",
            modality,
            "--decode-config",
            str(setup["decode"]),
            "--json",
            str(out),
        ]
    )
    assert status == 0, capsys.readouterr().err
    rows = json.loads(out.read_text())
    assert [r["file"] for r in rows] == [str(f) for f in setup["faces"]]
    expected = _recipe_hyps(setup, modality)
    assert {Path(r["file"]).stem: r["text"] for r in rows} == expected
    assert any(r["text"] for r in rows)
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"{r['file']}\t{r['text']}" for r in rows]


@needs_media
def test_word_timings_are_monotone_and_inside_the_audio(setup, tmp_path):
    from avsr.data.media import read_audio_track

    out = tmp_path / "out.json"
    face = setup["faces"][1]
    assert (
        avsr_main(
            [
                "transcribe",
                str(face),
                "--checkpoint",
                str(setup["exp"] / "epoch1.pt"),
                "--decode-config",
                str(setup["decode"]),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    (row,) = json.loads(out.read_text())
    duration = read_audio_track(face).numel() / 16000
    assert row["duration_s"] == pytest.approx(duration, abs=0.08)
    words = row["words"]
    assert words and " ".join(w["word"] for w in words) == row["text"]
    bounds = [t for w in words for t in (w["start"], w["end"])]
    assert bounds == sorted(bounds) and bounds[0] >= 0 and bounds[-1] <= row["duration_s"] + 1e-6
    assert all(w["end"] > w["start"] and 0 <= w["score"] <= 1 for w in words)


@needs_media
def test_a_video_without_a_face_is_an_error_naming_the_file(setup, tmp_path, capsys):
    from avsr.data.media import read_wav, write_av_video

    wav = read_wav(next(setup["corpus"].glob("*/*.wav")))
    frames = np.random.default_rng(0).integers(100, 140, size=(wav.numel() // 640, 224, 224), dtype=np.uint8)
    blank = tmp_path / "no_face.mp4"
    write_av_video(blank, frames, wav)
    assert transcribe(setup, str(blank), modality="video") == 1
    err = capsys.readouterr().err
    assert str(blank) in err and "no face" in err and "frames" in err and "--modality audio" in err
    # audio alone does not need the face; a good file next to the bad one is still transcribed
    assert transcribe(setup, str(blank), modality="audio") == 0
    assert capsys.readouterr().out.startswith(f"{blank}\t")
    assert transcribe(setup, str(blank), str(setup["faces"][0]), modality="video") == 1
    assert capsys.readouterr().out.startswith(f"{setup['faces'][0]}\t")


@needs_media
def test_a_video_without_audio_is_an_error_naming_the_file(setup, tmp_path, capsys):
    from avsr.data.face_video import composite_mouth_video
    from avsr.data.media import read_video, write_av_video

    roi = read_video(next(setup["corpus"].glob("*/*.mp4"))).numpy()
    silent = tmp_path / "silent.mp4"
    write_av_video(silent, composite_mouth_video(roi).frames, None)
    assert transcribe(setup, str(silent), modality="audiovisual") == 1
    err = capsys.readouterr().err
    assert str(silent) in err and "no audio track" in err and "--modality video" in err
    assert transcribe(setup, str(silent)) == 0  # by default: what it has, the lips
    assert capsys.readouterr().out.startswith(f"{silent}\t")
    assert transcribe(setup, str(silent), modality="video") == 0


@needs_media
@pytest.mark.parametrize("kind", ["av_hubert_ctc", "av_hubert_seq2seq"])
def test_official_checkpoints_with_their_sentencepiece_model(setup, kind, tmp_path, capsys):
    from tests.test_compat import finetune_ckpt, train_sentencepiece

    train_sentencepiece(tmp_path)
    ckpt, *_ = finetune_ckpt(tmp_path, kind)
    out = tmp_path / "out.json"
    extra = (
        ["--beam-size", "2"] if kind == "av_hubert_ctc" else ["--decode-config", str(tmp_path / "dec.yaml")]
    )
    (tmp_path / "dec.yaml").write_text(
        "search: fairseq\nctc_weight: 0.0\nbeam_size: 2\nmax_len_a: 0.0\nmax_len_b: 3\n"
    )
    assert (
        avsr_main(
            [
                "transcribe",
                str(setup["faces"][2]),
                "--checkpoint",
                str(ckpt),
                "--bpemodel",
                str(tmp_path / "sp.model"),
                "--json",
                str(out),
                *extra,
            ]
        )
        == 0
    ), capsys.readouterr().err
    (row,) = json.loads(out.read_text())
    assert row["text"] == row["text"].upper()
    if kind == "av_hubert_ctc":  # CTC head: timings, one per word of the (upper-cased) transcript
        assert row["words"] and [w["word"] for w in row["words"]] == row["text"].split()
    else:  # attention only: no timings, and the JSON says why
        assert row["words"] is None and "no CTC head" in row["words_note"]


@needs_media
def test_noise_at_an_snr_is_mixed_into_the_audio(setup, tmp_path):
    from avsr.data.media import write_wav

    noise = tmp_path / "noise.wav"
    write_wav(noise, torch.from_numpy(np.random.default_rng(0).normal(0, 0.1, 32000)).float())
    face = str(setup["faces"][0])
    rows = {}
    for snr in ("-5", None):
        out = tmp_path / f"{snr}.json"
        extra = ["--noise", str(noise), "--snr-db", snr] if snr else []
        args = [
            "transcribe",
            face,
            "--checkpoint",
            str(setup["exp"]),
            "--modality",
            "audio",
            "--json",
            str(out),
        ]
        assert avsr_main([*args, "--decode-config", str(setup["decode"]), *extra]) == 0
        (rows[snr],) = json.loads(out.read_text())
    assert rows["-5"]["snr_db"] == -5.0 and rows["-5"]["noise"] == str(noise) and rows[None]["snr_db"] is None
    with pytest.raises(SystemExit):  # --noise without --snr-db
        avsr_main(["transcribe", face, "--checkpoint", str(setup["exp"]), "--noise", str(noise)])
