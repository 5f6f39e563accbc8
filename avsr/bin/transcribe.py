"""Transcribe raw face videos: mouth ROI + audio track -> features -> beam search -> words with timings.

Each input file (a video with a face and/or an audio track; a folder means every video in it, recursively)
goes through exactly the recipe's path: :func:`avsr.data.roi.preprocess_video` writes its 96x96 gray 25 fps
mouth ROI and its 16 kHz audio (640 samples per video frame) to a work directory, :class:`AVDataset` reads
them as the recipe's decoding does (centre crop, normalisation, AV-HuBERT filterbanks; optional noise at an
SNR), and the model decodes them with the decoding configuration. The transcript is printed as
``<file>\\t<TRANSCRIPT>``. With ``--json`` the results are also written as a list of ``{"file", "text",
"modality", "duration_s", "noise", "snr_db", "words", ...}``; ``words`` holds ``{"word", "start", "end",
"score"}`` (seconds) from CTC forced alignment of the hypothesis (:mod:`avsr.decode.align`) when the model has
a CTC head, else null.

The model: ``--checkpoint`` is an experiment directory (its best ``--average-nbest`` epoch checkpoints are
averaged, as ``python -m avsr.bin.decode --exp-dir``; the tokenizer is its ``bpe.model``), an avsr checkpoint
file (tokenizer: ``--bpemodel`` or the ``bpe.model`` beside it) or an official fine-tuned AV-HuBERT
checkpoint with its sentencepiece model as ``--bpemodel`` (see :mod:`avsr.compat`).

Errors name the file: a video without a face when the video modality is needed, a file without an audio
track when the audio is needed. Every file is tried; the exit status is 1 when any failed.

Usage: ``avsr transcribe talk.mp4 clips/ --checkpoint exp/avsr_x [--modality audiovisual] [--json out.json]
[--snr-db 0 --noise babble.wav] [--beam-size 10] [--decode-config conf/decode/default.yaml] [--device cuda]``
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from avsr.data.datadir import Utterance
from avsr.data.dataset import AVDataset, NoiseConfig, collate
from avsr.data.media import MediaError, read_audio_track, read_video_rgb, write_wav
from avsr.features import SAMPLES_PER_FRAME
from avsr.fileio import write_text_atomic

logger = logging.getLogger("avsr.transcribe")

#: file name endings taken from a folder.
VIDEO_SUFFIXES = (".mp4", ".mkv", ".avi", ".mov", ".webm", ".mpg", ".mpeg")
#: model inputs of each modality (as :data:`avsr.bin.decode.MODALITY_INPUTS`).
MODALITY_INPUTS = {"audio": ("audio",), "video": ("video",), "audiovisual": ("audio", "video")}


class TranscribeError(ValueError):
    """An input cannot be transcribed; the message names the file and the reason."""


def collect_inputs(paths: list[Path]) -> list[Path]:
    """The files to transcribe: each path given, or for a folder every video in it (sorted, recursive).

    Raises:
        TranscribeError: a path does not exist, or a folder holds no video.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES and p.is_file())
            if not found:
                raise TranscribeError(f"{path}: no video ({', '.join(VIDEO_SUFFIXES)}) in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise TranscribeError(f"{path}: no such file or folder")
    return files


def _streams(path: Path) -> tuple[bool, bool]:
    """Whether ``path`` has (an audio stream, a video stream). Raises TranscribeError if unreadable."""
    import av

    try:
        with av.open(str(path)) as container:
            return bool(container.streams.audio), bool(container.streams.video)
    except Exception as exc:  # av.error.FFmpegError and friends
        raise TranscribeError(f"{path}: cannot read this file as audio/video ({exc})") from exc


def prepare_input(src: Path, modality: str, work: Path) -> tuple[Utterance, dict[str, Any]]:
    """Preprocess one file as the recipe does; returns its utterance (paths in ``work``) and stats.

    Video needed: :func:`avsr.data.roi.preprocess_video` (ROI mp4, and the wav aligned to the video frames
    when audio is needed too). Audio only: the audio track, cut or zero-padded to the video's 25 fps frame
    count x 640 samples when the file has a video stream (as ``preprocess_video`` aligns it), else whole.

    Raises:
        TranscribeError: no audio track but audio needed, no face but video needed, unreadable file.
    """
    need_audio = "audio" in MODALITY_INPUTS[modality]
    need_video = "video" in MODALITY_INPUTS[modality]
    has_audio, has_video = _streams(src)
    if need_audio and not has_audio:
        raise TranscribeError(
            f"{src}: no audio track, but --modality {modality} needs one (try --modality video)"
        )
    if need_video and not has_video:
        raise TranscribeError(
            f"{src}: no video track, but --modality {modality} needs one (try --modality audio)"
        )
    work.mkdir(parents=True, exist_ok=True)
    wav = work / "audio.wav" if need_audio else None
    mp4 = work / "roi.mp4" if need_video else None
    stats: dict[str, Any] = {}
    try:
        if need_video:
            from avsr.data.roi import RoiError, preprocess_video

            try:
                stats = preprocess_video(src, mp4, wav)
            except RoiError as exc:
                hint = " (try --modality audio)" if "no face" in str(exc) and has_audio else ""
                raise TranscribeError(
                    f"{exc}{hint}" if str(src) in str(exc) else f"{src}: {exc}{hint}"
                ) from exc
            num_frames = int(stats["frames"])
        else:
            audio = read_audio_track(src, 16000)
            num_frames = -(-audio.numel() // SAMPLES_PER_FRAME)
            if has_video:
                num_frames = int(read_video_rgb(src, 25.0)[0].shape[0])
                aligned = torch.zeros(num_frames * SAMPLES_PER_FRAME)
                n = min(aligned.numel(), audio.numel())
                aligned[:n] = audio[:n]
                audio = aligned
            write_wav(wav, audio)
            stats = {"frames": num_frames, "seconds": audio.numel() / 16000}
    except MediaError as exc:
        raise TranscribeError(f"{src}: {exc}") from exc
    utt = Utterance(
        utt_id=src.stem,
        speaker=src.stem,
        wav=str(wav) if wav else None,
        video=str(mp4) if mp4 else None,
        num_frames=num_frames,
    )
    return utt, stats


def load_transcriber(checkpoint: Path, bpemodel: Path | None, average_nbest: int, device: torch.device):
    """Model (eval mode) and tokenizer from an experiment dir or a checkpoint file (see the module docstring).

    Raises:
        FileNotFoundError: no checkpoint, or no tokenizer found; avsr.compat.CheckpointError for a bad file.
    """
    from avsr.bin.decode import load_checkpoint_model, load_model
    from avsr.data.tokenizer import Tokenizer

    if checkpoint.is_dir():
        model = load_model(checkpoint, None, average_nbest, device)
        return model, Tokenizer(bpemodel or checkpoint / "bpe.model")
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint not found: {checkpoint}")
    if bpemodel is None and (checkpoint.parent / "bpe.model").is_file():
        bpemodel = checkpoint.parent / "bpe.model"
    return load_checkpoint_model(checkpoint, bpemodel, device)


@torch.no_grad()
def transcribe_utterance(
    model,
    tokenizer,
    utt: Utterance,
    modality: str,
    decode_cfg,
    device: torch.device,
    noise: NoiseConfig | None = None,
) -> dict[str, Any]:
    """Decode one preprocessed utterance: ``{"text", "tokens", "words"}`` (``words`` None without CTC).

    The batch is built by :class:`AVDataset` + :func:`collate` and decoded by ``model.decode`` with
    ``decode_cfg``, as :func:`avsr.bin.decode.decode_dataset` does; word timings come from the CTC
    log-probabilities of the same input (:func:`avsr.decode.align.word_timings`).
    """
    from avsr.compat import FairseqTokenizer
    from avsr.decode.align import AlignmentError, word_timings

    inputs = list(MODALITY_INPUTS[modality])
    dataset = AVDataset(
        [utt], None, modalities=inputs, noise=noise if "audio" in inputs else None, cache=False
    )
    batch = collate([dataset[0]])
    audio = batch["audio"].to(device) if batch["audio"] is not None else None
    video = batch["video"].to(device) if batch["video"] is not None else None
    lengths = batch["lengths"].to(device)
    tokens = list(model.decode(audio, video, lengths, decode_cfg)[0])
    upper = isinstance(tokenizer, FairseqTokenizer)
    text = tokenizer.decode(tokens)
    out: dict[str, Any] = {"text": text.upper() if upper else text, "tokens": tokens, "words": None}
    if model.ctc_lo is None:
        out["words_note"] = "the model has no CTC head: no word timings"
        return out
    enc, enc_lens = model.encode(audio, video, lengths)
    log_probs = torch.log_softmax(model.ctc_lo(enc[0, : int(enc_lens[0])]).float(), dim=-1)
    token_list = list(model.token_list) if model.token_list is not None else list(tokenizer.token_list)
    try:
        words = word_timings(
            log_probs,
            tokens,
            token_list,
            blank=model.blank,
            decode=lambda ids: tokenizer.decode(ids).upper() if upper else tokenizer.decode(ids),
        )
        out["words"] = [w.to_dict() for w in words]
    except AlignmentError as exc:
        out["words_note"] = f"no word timings: {exc}"
    return out


def _write_json(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(rows, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring). Returns the exit status."""
    from avsr.data.noise import NoiseSource
    from avsr.decode.beam_search import DecodeConfig

    p = argparse.ArgumentParser(
        prog="avsr transcribe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("inputs", nargs="+", type=Path, help="video files or folders of videos")
    p.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="experiment dir (checkpoint averaging), avsr checkpoint or official AV-HuBERT checkpoint",
    )
    p.add_argument(
        "--bpemodel", type=Path, default=None, help="sentencepiece model (default: beside the model)"
    )
    p.add_argument("--modality", default="audiovisual", choices=list(MODALITY_INPUTS))
    p.add_argument(
        "--decode-config",
        type=Path,
        default=None,
        help="conf/decode/*.yaml (default: the model's own defaults)",
    )
    p.add_argument("--beam-size", type=int, default=None, help="override the beam size")
    p.add_argument("--average-nbest", type=int, default=5, help="checkpoints averaged from an experiment dir")
    p.add_argument("--noise", type=Path, default=None, help="noise wav mixed into the audio (with --snr-db)")
    p.add_argument("--snr-db", type=float, default=None, help="SNR of the added noise in dB")
    p.add_argument("--json", type=Path, default=None, help="write transcripts and word timings here")
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="keep the ROI mp4 and wav of every input here (default: a temporary folder)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--num-threads", type=int, default=1, help="CPU threads")
    args = p.parse_args(argv)
    if (args.noise is None) != (args.snr_db is None):
        p.error("--noise and --snr-db go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    if device.type == "cpu":
        torch.set_num_threads(args.num_threads)
    try:
        files = collect_inputs(args.inputs)
        noise = None
        if args.noise is not None:
            noise = NoiseConfig(NoiseSource(args.noise), prob=1.0, snr_db=[args.snr_db], fixed=True)
        model, tokenizer = load_transcriber(args.checkpoint, args.bpemodel, args.average_nbest, device)
        overrides = {"beam_size": args.beam_size} if args.beam_size is not None else {}
        if args.decode_config is not None:
            decode_cfg = DecodeConfig.from_yaml(args.decode_config, **overrides)
        else:
            from avsr.config import from_dict

            decode_cfg = from_dict(
                DecodeConfig, {**model.default_decode_options(), **overrides}, "decode options"
            )
    except (TranscribeError, FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"avsr transcribe: error: {exc}", file=sys.stderr)
        return 1
    rows, failed = [], 0
    with tempfile.TemporaryDirectory(prefix="avsr_transcribe_") as tmp:
        work_root = args.work_dir or Path(tmp)
        for index, src in enumerate(files):
            work = work_root / f"{index:05d}_{src.stem}"
            try:
                utt, stats = prepare_input(src, args.modality, work)
                result = transcribe_utterance(model, tokenizer, utt, args.modality, decode_cfg, device, noise)
            except (TranscribeError, ValueError) as exc:
                failed += 1
                print(f"avsr transcribe: error: {exc}", file=sys.stderr)
                rows.append({"file": str(src), "error": str(exc)})
                continue
            print(f"{src}\t{result['text']}", flush=True)
            row = {
                "file": str(src),
                "text": result["text"],
                "modality": args.modality,
                "duration_s": round(utt.num_frames / 25.0, 3),
                "noise": str(args.noise) if args.noise else None,
                "snr_db": args.snr_db,
                "words": result["words"],
                "frames_without_face": stats.get("frames_without_face"),
            }
            if "words_note" in result:
                row["words_note"] = result["words_note"]
            rows.append(row)
    if args.json is not None:
        _write_json(args.json, rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
