"""The demo's web application (FastAPI): the page, and a JSON endpoint that the page and scripts share.

Routes:

* ``GET /``: the page (``avsr/demo/static/``: plain HTML, CSS and JavaScript, no build step): upload a face
  video or an audio file, or record from the webcam and microphone, and see the transcripts with word timings,
  the mouth-ROI track and what the fusion did;
* ``GET /api/info``: ``{"model", "max_upload_mb", "modalities", "fusion"}``;
* ``POST /api/transcribe``: ``multipart/form-data`` with the files ``video`` and/or ``audio`` and the optional
  text fields ``modality`` (``audio``, ``video``, ``audiovisual``; default: the richest the files allow) and
  ``compare`` (``1``: also every other modality the files allow); the answer is ``{"text", "words",
  "modality", "info"}`` (:func:`avsr.demo.service.transcribe_upload`).

Errors are JSON ``{"error": "<one line>"}``: 413 for a body over the upload limit, 400 for a bad form or an
input the Transcriber cannot use (naming the uploaded file), 500 for a bug (logged with its traceback).

Every upload is written into a temporary directory of its own, inside the application's temporary directory,
and removed when its request ends; the application's directory is removed when the server shuts down (and at
interpreter exit). One request is transcribed at a time.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from avsr.demo.service import ORDER, DemoError, transcribe_upload
from avsr.demo.uploads import Form, UploadError, UploadTooLarge, read_form, safe_filename
from avsr.inference import Transcriber

__all__ = ["create_app", "STATIC_DIR", "FIELDS"]

logger = logging.getLogger("avsr.demo")

#: the page's files
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: the form fields of ``POST /api/transcribe``: name -> whether it is a file
FIELDS = {"video": True, "audio": True, "modality": False, "compare": False}

_TRUE = ("1", "true", "yes", "on")

_OPENAPI_FORM = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object",
    "properties": {
        "video": {"type": "string", "format": "binary",
                  "description": "a face video or a 96x96 mouth-ROI video, with or without sound"},
        "audio": {"type": "string", "format": "binary",
                  "description": "an audio file (any format FFmpeg reads)"},
        "modality": {"type": "string", "enum": list(ORDER),
                     "description": "default: the richest the files allow"},
        "compare": {"type": "string", "description": "1: also every other modality the files allow"},
    },
}}}}}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(message.split())}, status_code=status)


def _options(form: Form) -> tuple[str | None, bool]:
    """``(modality or None, compare)`` of a parsed form.

    Raises:
        UploadError: an unknown field, a file where text is expected or the other way round.
    """
    for name in [*form.files, *form.fields]:
        if name not in FIELDS:
            raise UploadError(f"unknown field {name!r} (fields: {', '.join(FIELDS)})")
    for name, value in form.fields.items():
        if FIELDS[name] and value:  # an empty one: a file input left empty, as some clients send it
            raise UploadError(f"the field {name!r} must be a file (curl: -F {name}=@FILE)")
    for name in form.files:
        if not FIELDS[name]:
            raise UploadError(f"the field {name!r} must be text, not a file")
    modality = form.fields.get("modality", "").lower() or None
    return (None if modality == "auto" else modality), form.fields.get("compare", "").lower() in _TRUE


def create_app(transcriber: Transcriber, *, model_name: str = "", max_upload_mb: float = 50.0,
               tmp_dir: str | Path | None = None) -> FastAPI:
    """The demo application for ``transcriber``.

    Args:
        transcriber: the one inference object (:class:`avsr.Transcriber`) every request uses.
        model_name: what the page shows as the model (e.g. the checkpoint's path).
        max_upload_mb: the largest request body in MiB; larger ones get HTTP 413.
        tmp_dir: where the application's temporary directory is made (default: the system's).

    Returns:
        the FastAPI application (serve it with uvicorn; ``app.state.tmp_root`` is its temporary directory).

    Raises:
        ValueError: ``max_upload_mb`` not positive.
    """
    if not max_upload_mb > 0:
        raise ValueError(f"max_upload_mb must be positive, got {max_upload_mb}")
    max_bytes = int(max_upload_mb * 2**20)
    root = Path(tempfile.mkdtemp(prefix="avsr_demo_", dir=tmp_dir))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        shutil.rmtree(root, ignore_errors=True)

    app = FastAPI(title="avsr demo", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json",
                  description="Audio-visual speech recognition: upload audio and/or video, get the words.")
    app.state.tmp_root = root
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        """The model's name, the upload limit, the modalities and the search's view weights."""
        video_weight, audio_weight, audio_confidence = transcriber.searcher.view_weights
        return {"model": model_name, "max_upload_mb": max_upload_mb, "modalities": list(ORDER),
                "fusion": {"video_weight": video_weight, "audio_weight": audio_weight,
                           "audio_confidence": audio_confidence}}

    def work(form: Form, request_dir: Path, modality: str | None, compare: bool) -> dict[str, Any]:
        video, audio = form.files.get("video"), form.files.get("audio")
        first = video or audio
        key = Path(safe_filename(first.filename)).stem if first is not None else "upload"
        with lock:
            result = transcribe_upload(transcriber, video.path if video else None,
                                       audio.path if audio else None, request_dir / "work", modality=modality,
                                       compare=compare, key=key)
        return _named_all(result, form, request_dir)

    @app.post("/api/transcribe", openapi_extra=_OPENAPI_FORM)
    async def transcribe(request: Request) -> JSONResponse:
        """Transcribe the uploaded ``video`` and/or ``audio`` (see the module docstring)."""
        root.mkdir(parents=True, exist_ok=True)
        request_dir = Path(tempfile.mkdtemp(prefix="request_", dir=root))
        form = Form()
        try:
            form = await read_form(request.headers.get("content-type"), request.headers.get("content-length"),
                                   request.stream(), request_dir / "upload", max_bytes)
            modality, compare = _options(form)
            result = await run_in_threadpool(work, form, request_dir, modality, compare)
            return JSONResponse(result)
        except UploadTooLarge as exc:
            return _error(413, str(exc))
        except (UploadError, DemoError) as exc:
            return _error(400, _named(str(exc), form, request_dir))
        except Exception as exc:  # a bug: its traceback in the log, one line to the client
            logger.exception("transcription failed")
            return _error(500, f"internal error: {type(exc).__name__}: {_named(str(exc), form, request_dir)}")
        finally:
            shutil.rmtree(request_dir, ignore_errors=True)

    return app


def _named_all(value: Any, form: Form, request_dir: Path) -> Any:
    """:func:`_named` applied to every string of a JSON-like value (the facts and errors of an answer)."""
    if isinstance(value, str):
        return value if value.startswith("data:") else _named(value, form, request_dir)
    if isinstance(value, dict):
        return {k: _named_all(v, form, request_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_named_all(v, form, request_dir) for v in value]
    return value


def _named(message: str, form: Form, request_dir: Path) -> str:
    """``message`` with the paths of the request's temporary directory replaced by the uploaded file names."""
    for upload in form.files.values():
        message = message.replace(str(upload.path), upload.filename or upload.path.name)
    return message.replace(f"{request_dir}/", "")
