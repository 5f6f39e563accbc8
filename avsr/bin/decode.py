"""Decode a test set under every modality and noise condition (the recipe's decoding stage).

For each modality (``audio``, ``video``, ``audiovisual``) and condition (``clean``, then ``<noise>_<snr>`` for
each SNR when a noise file is given) the tool writes ``<out>/<test_set>/<modality>/<condition>/hyp`` and
``ref`` (Kaldi text: ``<utt-id> WORDS``), each atomically, and ``failed`` (``<utt-id> <reason>``) when some
utterances could not be decoded (they are reported and skipped, the others decoded). A condition whose ``hyp``
exists is skipped, so an interrupted decoding resumes -- when the settings match: each modality directory
records them in ``decode_settings.yaml`` (model, checkpoints chosen with their sizes and times, tokenizer,
decoding configuration, data dir, precision; each noisy condition its noise file), and a directory holding
results made with other settings is refused with the differing keys named, or cleared and decoded anew with
``--overwrite``. The stage is :func:`avsr.inference.decode_dir.decode_test_set`; this tool parses its
arguments. All decoding goes through :class:`avsr.inference.Transcriber` (the same path as ``avsr
transcribe`` and Python users): the noise segment and the SNR of an utterance are a function of its id, so
every run decodes the same noisy audio. Each utterance gets the silent edges of the model's training audio
where its audio, as mixed for the condition, shows them (``--edge-frames``, the Transcriber's
``edge_frames``; recorded in ``decode_settings.yaml`` when inputs are changed). Without that change,
video-only input does not depend on the audio noise: it is decoded once and its hypotheses are written for
every condition; with it, video-only input is decoded in every condition (a noisy recording hides the
edges). Audio-visual and video-only decoding run the video front-end once per utterance and change of its
edges and reuse its output in the other noise conditions (the Transcriber's ``video_cache``). Audio-visual
hypotheses are ranked with the model's single-stream views too where the decoding configuration's
``video_weight`` or ``audio_weight`` (or, when null, the model's default) is above 0; the audio-visual
directory's ``decode_settings.yaml`` then records both (``view_weights``), and the other modalities' do not.

Before anything is decoded, every media file the chosen modalities read (``wav.scp`` for audio and
audio-visual decoding and, with the training edges, for video-only decoding too; ``video.scp`` for video and
audio-visual decoding) must exist: a data dir with a missing file or entry is refused in one line naming the
utterance and the file (exit status 1), rather than scored with the utterance as a failure. Utterances whose
files exist but cannot be decoded (unreadable media, too short) are listed in ``failed`` and scored as all
errors (``avsr.bin.score`` says how many).

The model is the element-wise average of the ``--average-nbest`` epoch checkpoints with the best validation
accuracy (ESPnet's ``valid.acc.ave``), or ``--checkpoint``: an avsr checkpoint or an official fine-tuned
AV-HuBERT one (fairseq ``av_hubert_seq2seq``/``av_hubert_ctc``, read by :mod:`avsr.compat`) with its
sentencepiece model as ``--bpemodel`` (default: the one pickled in the checkpoint). Decode such a model with
``conf/decode/avhubert_s2s.yaml`` (fairseq's beam search, as AV-HuBERT's ``infer_s2s.py``); its lower-case
hypotheses are upper-cased, as avsr's references.

Usage: ``python -m avsr.bin.decode --exp-dir exp/x --data data/test --test-set test --decode-config
conf/decode/default.yaml [--noise-file babble.wav --snrs 10 5 0 -5] --out exp/x/decode``, or
``python -m avsr.bin.decode --checkpoint large_vox_433h.pt --bpemodel spm_unigram1000.model --data data/test
--decode-config conf/decode/avhubert_s2s.yaml --out decode``
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import torch

from avsr.bin.runner import UsageError, tool
from avsr.inference import parse_edge_frames
from avsr.inference.decode_dir import DecodeJob, SettingsConflict, decode_test_set
from avsr.modalities import MODALITY_INPUTS
from avsr.nn.precision import PRECISIONS

logger = logging.getLogger("avsr.decode")


def _parser() -> argparse.ArgumentParser:
    """The command line of the tool (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exp-dir", type=Path, default=None, help="training dir (needed without --checkpoint)")
    p.add_argument("--data", required=True, type=Path, help="test data dir")
    p.add_argument("--test-set", default=None, help="name in the results (default: data dir name)")
    p.add_argument("--decode-config", required=True, help="decoding YAML (a path or a shipped name)")
    p.add_argument("--bpemodel", type=Path, default=None, help="default: <exp-dir>/bpe.model")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="decode this checkpoint (avsr's or an official AV-HuBERT one), no averaging")
    p.add_argument("--average-nbest", type=int, default=5)
    p.add_argument("--modalities", nargs="+", default=list(MODALITY_INPUTS), choices=list(MODALITY_INPUTS))
    p.add_argument("--noise-file", type=Path, default=None)
    p.add_argument("--noise-name", default="babble")
    p.add_argument("--snrs", nargs="*", type=float, default=[10.0, 5.0, 0.0, -5.0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--batch-frames", type=int, default=3000)
    p.add_argument("--overwrite", action="store_true",
                   help="decode anew into a directory holding results made with other settings")
    p.add_argument("--precision", default="fp32", choices=list(PRECISIONS),
                   help="encoder precision (default fp32: the same WER on every machine; auto: bf16 "
                        "where the device computes it natively)")
    p.add_argument("--edge-frames", default="model",
                   help="silent 40 ms frames before and after each utterance's speech (the Transcriber's "
                   "edge_frames): 'model' (the middle half of the training audio's, when the checkpoint "
                   "records them), 'off', or START,END, each a count or a range LO-HI")
    p.add_argument("--ngpu", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=1,
                   help="CPU threads (the beam search's small tensor ops run fastest on 1; run modalities in "
                   "parallel processes instead)")
    return p


@tool("avsr-decode")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.exp_dir is None and args.checkpoint is None:
        p.error("give --exp-dir (checkpoint averaging) or --checkpoint")
    try:
        edge_frames = parse_edge_frames(args.edge_frames)
    except ValueError as exc:
        p.error(f"--edge-frames: {exc}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    device = torch.device("cuda" if args.ngpu > 0 else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--ngpu > 0 but CUDA is not available")
    if device.type == "cpu":
        torch.set_num_threads(args.num_threads)
    bpemodel = args.bpemodel
    if bpemodel is None and args.exp_dir is not None:
        bpemodel = args.exp_dir / "bpe.model"
    job = DecodeJob(
        source=args.checkpoint if args.checkpoint is not None else args.exp_dir, bpemodel=bpemodel,
        decode_config=args.decode_config, data=args.data, out=args.out,
        test_set=args.test_set or args.data.name,
        modalities=args.modalities, noise_file=args.noise_file, noise_name=args.noise_name, snrs=args.snrs,
        average_nbest=args.average_nbest, batch_frames=args.batch_frames, precision=args.precision,
        edge_frames=edge_frames, device=device, overwrite=args.overwrite)
    try:
        root = decode_test_set(job)
    except SettingsConflict as exc:
        raise UsageError(f"{exc}: decode into another --out, or pass --overwrite") from exc
    logger.info("decoding written under %s", os.fspath(root))


if __name__ == "__main__":
    sys.exit(main())
