"""Decode a test set under every modality and noise condition with joint CTC/attention beam search.

For each modality (``audio``, ``video``, ``audiovisual``) and condition (``clean``, then ``<noise>_<snr>`` for
each SNR when a noise file is given) the tool writes ``<out>/<test_set>/<modality>/<condition>/hyp`` and
``ref`` (Kaldi text: ``<utt-id> WORDS``), each atomically; a condition whose ``hyp`` exists is skipped, so an
interrupted decoding resumes. The noise segment and the SNR of an utterance are a function of its id, so
every run decodes the same noisy audio. Video-only input does not depend on the audio noise: it is decoded
once and its hypotheses are written for every condition. Audio-visual decoding likewise runs the video
front-end once per utterance (:class:`VideoFrontEndMemo`) and reuses its output in every noise condition.

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
import time
from pathlib import Path

import torch
from tqdm import tqdm

from avsr.data.datadir import read_datadir, write_kaldi_map
from avsr.data.dataset import AVDataset, BucketBatchSampler, NoiseConfig, collate
from avsr.data.noise import NoiseSource
from avsr.data.tokenizer import Tokenizer
from avsr.train.checkpoint import average_state_dicts, epoch_checkpoints, load_checkpoint

logger = logging.getLogger("avsr.decode")

#: model inputs used by each decoding modality.
MODALITY_INPUTS = {"audio": ("audio",), "video": ("video",), "audiovisual": ("audio", "video")}


def select_checkpoints(exp_dir: Path, nbest: int) -> list[Path]:
    """The ``nbest`` epoch checkpoints of ``exp_dir`` with the highest validation accuracy.

    Raises:
        FileNotFoundError: ``exp_dir`` holds no ``epoch<N>.pt``.
    """
    found = epoch_checkpoints(exp_dir)
    if not found:
        raise FileNotFoundError(f"no epoch<N>.pt checkpoint in {exp_dir}: run the training stage first")
    scored = []
    for n, p in found:
        valid = load_checkpoint(p).get("valid") or {}
        scored.append((float(valid.get("acc", n)), n, p))
    scored.sort(reverse=True)
    return sorted(p for _, _, p in scored[:nbest])


def load_model(exp_dir: Path, checkpoint: Path | None, nbest: int, device: torch.device):
    """Build the model from its checkpoint's ``model_config`` and load (averaged) weights, in eval mode."""
    from avsr.models.asr import AVSRModel

    paths = [checkpoint] if checkpoint else select_checkpoints(exp_dir, nbest)
    logger.info("model from %s", ", ".join(p.name for p in paths))
    first = load_checkpoint(paths[0])
    model = AVSRModel.from_config(first["model_config"])
    model.load_state_dict(average_state_dicts(paths) if len(paths) > 1 else first["model"])
    return model.to(device).eval()


def load_checkpoint_model(checkpoint: Path, bpemodel: Path | None, device: torch.device):
    """Model and tokenizer of one checkpoint (avsr's or an official AV-HuBERT one), the model in eval mode.

    Raises:
        FileNotFoundError, avsr.compat.CheckpointError: see :func:`avsr.compat.read_checkpoint`,
            :func:`avsr.compat.tokenizer_for`.
    """
    from avsr.compat import build_asr_model, read_checkpoint, tokenizer_for

    loaded = read_checkpoint(checkpoint)
    logger.info("model from %s (%s)", checkpoint, loaded.kind)
    model = build_asr_model(loaded, bpemodel=bpemodel)
    return model.to(device).eval(), tokenizer_for(model, loaded, bpemodel)


class VideoFrontEndMemo(torch.nn.Module):
    """Stands in for an encoder's video front-end while one test set is decoded audio-visually under several
    audio noise conditions: the video of an utterance is the same in every condition, so its front-end
    output (ResNet + projection, ``(B, D, T)`` float) is computed in the first condition and reused in the
    others, which then cost only the audio front-end, the transformer and the beam search.

    Outputs are remembered per batch, keyed by the batch's utterance ids (set :attr:`key` before each
    forward; batching is deterministic, so every condition forms the same batches), and kept on the CPU.
    Decoding only: it runs the wrapped module under no_grad semantics of the caller and never in training.

    Raises:
        RuntimeError: a remembered output does not fit the batch (another batch under the same key).
    """

    def __init__(self, front_end: torch.nn.Module) -> None:
        super().__init__()
        self.front_end = front_end
        self.key: tuple[str, ...] | None = None
        self._outputs: dict[tuple[str, ...], torch.Tensor] = {}

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        """``(B, 1, T, H, W) -> (B, D, T)``, from the memo when this batch was seen."""
        out = self._outputs.get(self.key) if self.key is not None else None
        if out is None:
            out = self.front_end(video)
            if self.key is not None:
                self._outputs[self.key] = out.cpu()
            return out
        if out.shape[0] != video.shape[0] or out.shape[-1] != video.shape[2]:
            raise RuntimeError(f"video front-end memo: batch {self.key[:2]}... has another shape "
                               f"({tuple(video.shape)} vs output {tuple(out.shape)})")
        return out.to(video.device)


@torch.no_grad()
def decode_dataset(
    model,
    dataset: AVDataset,
    modality: str,
    tokenizer,
    decode_cfg,
    batch_frames: int,
    device: torch.device,
    desc: str,
    video_memo: VideoFrontEndMemo | None = None,
) -> dict[str, str]:
    """Hypotheses (utt-id -> words) for every utterance of ``dataset``, fed through ``modality``'s inputs.

    Batches are length-bucketed (at most ``batch_frames`` padded frames); the beam search runs batched over
    the utterances of a batch. ``tokenizer`` is a :class:`Tokenizer` or an
    :class:`avsr.compat.FairseqTokenizer` (whose lower-case text, as AV-HuBERT writes it, is upper-cased like
    avsr's references). ``video_memo``, when given, is the model's video front-end wrapped in a
    :class:`VideoFrontEndMemo` and gets each batch's key.
    """
    from avsr.compat import FairseqTokenizer

    upper = isinstance(tokenizer, FairseqTokenizer)
    lengths = [dataset.num_frames(i) for i in range(len(dataset))]
    sampler = BucketBatchSampler(lengths, batch_frames, shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    use = MODALITY_INPUTS[modality]
    hyps: dict[str, str] = {}
    for batch in tqdm(loader, desc=desc, dynamic_ncols=True, mininterval=2.0):
        audio = batch["audio"].to(device) if "audio" in use else None
        video = batch["video"].to(device) if "video" in use else None
        if video_memo is not None:
            video_memo.key = tuple(batch["utt_ids"])
        token_ids = model.decode(audio, video, batch["lengths"].to(device), decode_cfg)
        for utt_id, ids in zip(batch["utt_ids"], token_ids):
            text = tokenizer.decode(list(ids))
            hyps[utt_id] = text.upper() if upper else text
    return hyps


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (see the module docstring)."""
    from avsr.decode.beam_search import DecodeConfig

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exp-dir", type=Path, default=None, help="training dir (needed without --checkpoint)")
    p.add_argument("--data", required=True, type=Path, help="test data dir")
    p.add_argument("--test-set", default=None, help="name in the results (default: data dir name)")
    p.add_argument("--decode-config", required=True, type=Path)
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
    p.add_argument("--ngpu", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=1,
                   help="CPU threads (the beam search's small tensor ops run fastest on 1; run modalities in "
                   "parallel processes instead)")
    args = p.parse_args(argv)
    if args.exp_dir is None and args.checkpoint is None:
        p.error("give --exp-dir (checkpoint averaging) or --checkpoint")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    device = torch.device("cuda" if args.ngpu > 0 else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--ngpu > 0 but CUDA is not available")
    if device.type == "cpu":
        torch.set_num_threads(args.num_threads)
    decode_cfg = DecodeConfig.from_yaml(args.decode_config)
    model = None
    if args.checkpoint is not None:
        bpemodel = args.bpemodel or (args.exp_dir / "bpe.model" if args.exp_dir is not None else None)
        model, tokenizer = load_checkpoint_model(args.checkpoint, bpemodel, device)
    else:
        tokenizer = Tokenizer(args.bpemodel or args.exp_dir / "bpe.model")
    test_set = args.test_set or args.data.name
    utts = read_datadir(args.data)
    refs = {u.utt_id: u.text for u in utts}

    conditions: list[tuple[str, NoiseConfig | None]] = [("clean", None)]
    if args.noise_file is not None:
        source = NoiseSource(args.noise_file)
        for snr in args.snrs:
            name = f"{args.noise_name}_{snr:g}"
            conditions.append((name, NoiseConfig(source, prob=1.0, snr_db=[snr], fixed=True)))

    for modality in args.modalities:
        video_hyps: dict[str, str] | None = None
        memo: VideoFrontEndMemo | None = None
        for cond, noise in conditions:
            out_dir = args.out / test_set / modality / cond
            if (out_dir / "hyp").is_file():
                logger.info("%s exists, skipping", out_dir / "hyp")
                continue
            if modality == "video" and video_hyps is not None:
                hyps = video_hyps
            else:
                if model is None:
                    model = load_model(args.exp_dir, args.checkpoint, args.average_nbest, device)
                if modality == "audiovisual" and len(conditions) > 1 and memo is None:
                    memo = VideoFrontEndMemo(model.encoder.feature_extractor_video)
                    model.encoder.feature_extractor_video = memo
                inputs = [m for m in ("audio", "video") if m in MODALITY_INPUTS[modality]]
                dataset = AVDataset(
                    utts, None, modalities=inputs, noise=noise if "audio" in inputs else None, cache=False
                )
                t0 = time.time()
                hyps = decode_dataset(
                    model,
                    dataset,
                    modality,
                    tokenizer,
                    decode_cfg,
                    args.batch_frames,
                    device,
                    desc=f"{test_set}/{modality}/{cond}",
                    video_memo=memo,
                )
                logger.info(
                    "%s/%s/%s: %d utterances in %.1f s", test_set, modality, cond, len(hyps), time.time() - t0
                )
                if modality == "video":
                    video_hyps = hyps
            out_dir.mkdir(parents=True, exist_ok=True)
            write_kaldi_map(out_dir / "ref", refs)  # atomic, sorted by key
            write_kaldi_map(out_dir / "hyp", hyps)
        if memo is not None:  # the plain front-end again, and the memo's outputs freed
            model.encoder.feature_extractor_video = memo.front_end
    logger.info("decoding written under %s", os.fspath(args.out / test_set))


if __name__ == "__main__":
    main()
