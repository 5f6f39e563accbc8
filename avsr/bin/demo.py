"""Serve the demo page on this machine: upload or record audio and video, see what the model hears and sees.

``avsr demo --checkpoint exp/avsr_x`` starts a web server (uvicorn) on http://127.0.0.1:8000 with the page
of :mod:`avsr.demo.app`: upload a face video, a mouth-ROI video or an audio file, or record from the webcam
and microphone, and see the audio-only, video-only and audio-visual transcripts with word timings, the
mouth-ROI track as the ROI stage cropped it, and what the fusion did (gates, view weights). Scripts use the
same JSON endpoint: ``curl -F video=@talk.mp4 -F compare=1 http://127.0.0.1:8000/api/transcribe``.

The model: ``--checkpoint`` as ``avsr transcribe`` takes it (the name of a model shipped with the package --
the default, ``synthgrid`` --, an experiment directory, an avsr checkpoint or an official AV-HuBERT
checkpoint with ``--bpemodel``). The server binds to 127.0.0.1 (this machine only) unless
``--host`` says otherwise: it has no authentication. Uploads larger than ``--max-upload-mb`` are refused
(HTTP 413); uploads are written to a temporary directory that is removed after each request and at exit.
Needs the ``[demo]`` extra (``pip install 'avsr[demo]'``: FastAPI, uvicorn, python-multipart).

Usage: ``avsr demo [--checkpoint exp/avsr_x] [--port 8000] [--host 127.0.0.1] [--max-upload-mb 50]
[--decode-config default] [--device cuda]``
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import UsageError, tool
from avsr.pretrained import DEFAULT_MODEL

#: the model served when --checkpoint is not given: the model shipped with the package, by name
#: (Transcriber.from_pretrained resolves it, :func:`avsr.pretrained.resolve_model`), as for avsr transcribe.
DEFAULT_CHECKPOINT: str | None = DEFAULT_MODEL


def _parser() -> argparse.ArgumentParser:
    """The command line of the tool (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="avsr demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", required=DEFAULT_CHECKPOINT is None, default=DEFAULT_CHECKPOINT,
                   help="the name of a model shipped with avsr, experiment dir, avsr checkpoint or official "
                   "AV-HuBERT checkpoint"
                   + (f" (default: {DEFAULT_CHECKPOINT})" if DEFAULT_CHECKPOINT else ""))
    p.add_argument("--bpemodel", type=Path, default=None,
                   help="sentencepiece model (default: beside the model)")
    p.add_argument("--decode-config", default=None,
                   help="decoding YAML, a path or a shipped name (default: the model's own defaults)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; the demo has no login)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    p.add_argument("--max-upload-mb", type=float, default=50.0, help="largest upload in MiB (default 50)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--num-threads", type=int, default=1, help="CPU threads")
    return p


@tool("avsr-demo")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring): serves until interrupted; returns the exit status.

    Raises:
        UsageError: the ``[demo]`` extra is not installed; CUDA asked for where there is none.
    """
    args = _parser().parse_args(argv)
    if args.max_upload_mb <= 0:
        raise UsageError(f"--max-upload-mb must be positive, got {args.max_upload_mb}")
    try:
        import uvicorn

        from avsr.demo.app import create_app
    except ModuleNotFoundError as exc:
        raise UsageError(f"the demo needs {exc.name}: pip install 'avsr[demo]'") from exc
    from avsr.inference import Transcriber, inference_device

    setup_logging()
    logger = logging.getLogger("avsr.demo")
    device = inference_device(args.device, args.num_threads)
    transcriber = Transcriber.from_pretrained(args.checkpoint, bpemodel=args.bpemodel, device=device,
                                              decode_config=args.decode_config, max_segment_s="model")
    app = create_app(transcriber, model_name=str(args.checkpoint), max_upload_mb=args.max_upload_mb)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("listening on %s: anyone who can reach this address can use the demo (no login)",
                       args.host)
    if args.port:
        shown = f"[{args.host}]" if ":" in args.host else args.host
        logger.info("the demo: http://%s:%d/ (Ctrl-C stops it)", shown, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
