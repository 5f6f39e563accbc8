"""Multipart uploads streamed into a folder, with a size limit.

Starlette's own form parser spools uploads larger than 1 MB to the system's temporary directory; the demo
reads the request body itself with python-multipart's push parser instead, so that every byte of an upload
lands in the folder it is given (a request's temporary directory, removed after the request) and a body
over the limit is refused while it arrives, before it is all read.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

__all__ = ["UploadError", "UploadTooLarge", "Upload", "Form", "read_form", "safe_filename"]

#: the most text fields and files one request may hold (the API has three fields)
MAX_PARTS = 8
#: the most bytes of one text field
MAX_FIELD_BYTES = 1024


class UploadError(ValueError):
    """The request body is not a form the demo can read; the message is one line for the HTTP 400 answer."""


class UploadTooLarge(UploadError):
    """The request body is larger than the limit (HTTP 413)."""


@dataclass
class Upload:
    """One uploaded file: its ``field`` name, the ``filename`` the client gave, where it was written and its
    size in bytes."""

    field: str
    filename: str
    path: Path
    size: int = 0


@dataclass
class Form:
    """A parsed form: ``files`` by field name and text ``fields`` by name."""

    files: dict[str, Upload] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)


def safe_filename(name: str, default: str = "upload") -> str:
    """A client's file name reduced to a safe base name: the last path component, letters, digits, ``.``,
    ``-`` and ``_`` only (others become ``_``), at most 80 characters, never hidden; ``default`` when
    nothing is left."""
    base = re.split(r"[/\\]", name)[-1]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")[-80:]
    return base if base.strip("_") else default


class _Parts:
    """The callbacks of :class:`MultipartParser`: each part's headers, its data into a file of ``dest`` (a
    file part) or memory (a text field)."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.form = Form()
        self.count = 0
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""
        self._name = ""
        self._text: bytearray | None = None
        self._upload: Upload | None = None
        self._file: BinaryIO | None = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def on_part_begin(self) -> None:
        self._disposition, self._text, self._upload = b"", None, None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        if self._header_name.strip().lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name = self._header_value = b""

    def on_headers_finished(self) -> None:
        self.count += 1
        if self.count > MAX_PARTS:
            raise UploadError(f"too many form fields (at most {MAX_PARTS})")
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise UploadError("a form part without a name (Content-Disposition: form-data; name=...)")
        self._name = options[b"name"].decode("utf-8", "replace")
        if self._name in self.form.files or self._name in self.form.fields:
            raise UploadError(f"the field {self._name!r} is given twice")
        if b"filename" not in options:
            self._text = bytearray()
            return
        filename = options[b"filename"].decode("utf-8", "replace")
        folder = self.dest / safe_filename(self._name, "field")
        folder.mkdir(parents=True, exist_ok=True)
        self._upload = Upload(self._name, filename, folder / safe_filename(filename))
        self._file = open(self._upload.path, "wb")  # noqa: SIM115 (closed in on_part_end or close)

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._upload is not None and self._file is not None:
            self._file.write(data[start:end])
            self._upload.size += end - start
        elif self._text is not None:
            self._text += data[start:end]
            if len(self._text) > MAX_FIELD_BYTES:
                raise UploadError(f"the text field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes")

    def on_part_end(self) -> None:
        if self._upload is not None:
            self.close()
            self.form.files[self._name] = self._upload
        elif self._text is not None:
            self.form.fields[self._name] = self._text.decode("utf-8", "replace").strip()


async def read_form(content_type: str | None, content_length: str | None, body: AsyncIterator[bytes],
                    dest: Path, max_bytes: int) -> Form:
    """Read a ``multipart/form-data`` request body: files into ``dest/<field>/<safe file name>``, text
    fields into memory.

    Args:
        content_type: the request's ``Content-Type`` header (must be ``multipart/form-data`` with a boundary).
        content_length: its ``Content-Length`` header, or None (a chunked body): a declared length over the
            limit is refused before anything is read.
        body: the body's chunks (Starlette's ``request.stream()``).
        dest: an existing folder for the files.
        max_bytes: the most bytes the whole body may have.

    Returns:
        the :class:`Form`; a file part with neither a file name nor a byte is left out (what a browser
        sends for a file input left empty).

    Raises:
        UploadTooLarge: the body is (or is declared) larger than ``max_bytes``.
        UploadError: not multipart form data, a malformed body, too many or repeated fields.
    """
    if content_length is not None and content_length.strip().isdigit() and int(content_length) > max_bytes:
        raise UploadTooLarge(_too_large(max_bytes))
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        raise UploadError("expected multipart/form-data (fields 'audio' and/or 'video' with files, and "
                          f"optionally 'modality'), got Content-Type {content_type or 'none'!r}")
    parts = _Parts(dest)
    callbacks = {name: getattr(parts, name) for name in (
        "on_part_begin", "on_header_field", "on_header_value", "on_header_end", "on_headers_finished",
        "on_part_data", "on_part_end")}
    parser = MultipartParser(options[b"boundary"], callbacks)  # type: ignore[arg-type]
    received = 0
    try:
        async for chunk in body:
            received += len(chunk)
            if received > max_bytes:
                raise UploadTooLarge(_too_large(max_bytes))
            parser.write(chunk)
        parser.finalize()
    except FormParserError as exc:
        raise UploadError(f"malformed multipart body: {exc}") from exc
    finally:
        parts.close()
    form = parts.form
    for name, upload in list(form.files.items()):
        if upload.size == 0 and not upload.filename:
            upload.path.unlink(missing_ok=True)
            del form.files[name]
    return form


def _too_large(max_bytes: int) -> str:
    limit = f"{max_bytes / 2**20:.2f}".rstrip("0").rstrip(".")
    return f"upload too large: the limit is {limit} MB (avsr demo --max-upload-mb)"
