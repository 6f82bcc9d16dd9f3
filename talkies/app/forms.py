"""multipart/form-data bodies, parsed as they arrive with ``python-multipart``'s push parser.

File parts stream to a temporary file beside the data directory (never held in memory);
other fields are small strings. Every bound is checked on the bytes as they come: the body
cap (:class:`~talkies.app.http.Body`), the number of parts, each field's size, each part's
header size and count (the parser's own limits), and the file name. A form that fails any of
them, or a client that leaves midway, leaves no temporary file behind.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

import anyio
import anyio.to_thread
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header

from .http import HttpError, Request

__all__ = ["Form", "FormLimits", "UploadedFile", "read_form"]


@dataclass(frozen=True, kw_only=True, slots=True)
class FormLimits:
    max_parts: int = 64
    max_field_bytes: int = 65536
    max_header_bytes: int = 4096  # one part header line (the parser's limit)
    max_headers: int = 8  # headers per part


@dataclass(eq=False, kw_only=True)
class UploadedFile:
    path: Path
    filename: str | None
    content_type: str | None
    size: int = 0


@dataclass(eq=False)
class Form:
    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, UploadedFile] = field(default_factory=dict)

    def value(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[-1] if values else None

    def values(self, *names: str) -> list[str]:
        return [v for name in names for v in self.fields.get(name, [])]

    def close(self) -> None:
        for upload in self.files.values():
            upload.path.unlink(missing_ok=True)
        self.files.clear()


_URLENCODED = b"application/x-www-form-urlencoded"


def _content_type(request: Request) -> tuple[bytes, dict[bytes, bytes]]:
    content_type = request.header("content-type")
    kind, params = parse_options_header(content_type) if content_type else (b"", {})
    if kind not in (b"multipart/form-data", _URLENCODED):
        shown = f", not {kind.decode('latin-1')!r}" if kind else ""
        raise HttpError(
            415,
            f"the body must be multipart/form-data (or a URL-encoded form without a file){shown}",
            code="unsupported_media_type",
        )
    return kind, params


def _boundary(params: dict[bytes, bytes]) -> bytes:
    boundary = params.get(b"boundary")
    if not boundary or len(boundary) > 70:
        raise HttpError(400, "multipart/form-data needs a boundary of 1-70 characters")
    return boundary


def _filename(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, "the file name is not UTF-8", param="file") from None
    # Browsers send a base name; a path in it (or a NUL) is never meant for us.
    parts = name.replace("\\", "/").split("/")
    if "\0" in name or ".." in parts or any(ord(c) < 32 for c in name) or len(name) > 255:
        raise HttpError(400, "invalid file name", param="file")
    return parts[-1] or None


class _Collector:
    """The parser's callbacks: turns parts into fields and temporary files."""

    def __init__(self, tmp_dir: Path, file_fields: frozenset[str], limits: FormLimits) -> None:
        self.form = Form()
        self._tmp_dir = tmp_dir
        self._file_fields = file_fields
        self._limits = limits
        self._parts = 0
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._value = bytearray()
        self._file: UploadedFile | None = None
        self._handle: int | None = None
        self.pending: list[bytes] = []  # file data parsed but not yet written
        self.error: HttpError | None = None

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value_cb,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _fail(self, error: HttpError) -> None:
        if self.error is None:
            self.error = error

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > self._limits.max_parts:
            self._fail(HttpError(400, f"more than {self._limits.max_parts} form fields"))
        self._headers = {}
        self._name = None
        self._value = bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_cb(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[bytes(self._header_name).strip().lower()] = bytes(self._header_value).strip()
        self._header_name = bytearray()
        self._header_value = bytearray()

    def _headers_finished(self) -> None:
        if self.error is not None:
            return
        disposition = self._headers.get(b"content-disposition")
        kind, params = parse_options_header(disposition)
        name = params.get(b"name")
        if kind != b"form-data" or not name:
            self._fail(HttpError(400, "a form part has no Content-Disposition name"))
            return
        try:
            self._name = name.decode("utf-8")
        except UnicodeDecodeError:
            self._fail(HttpError(400, "a form field name is not UTF-8"))
            return
        if self._name in self._file_fields:
            if self._name in self.form.files:
                self._fail(HttpError(400, f"more than one {self._name!r} part", param=self._name))
                return
            try:
                filename = _filename(params.get(b"filename"))
            except HttpError as exc:
                self._fail(exc)
                return
            content_type = self._headers.get(b"content-type")
            handle, path = tempfile.mkstemp(dir=self._tmp_dir, prefix="upload-")
            self._handle = handle
            self._file = UploadedFile(
                path=Path(path),
                filename=filename,
                content_type=content_type.decode("latin-1") if content_type else None,
            )
            self.form.files[self._name] = self._file

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self.error is not None or self._name is None:
            return
        if self._file is not None:
            self.pending.append(data[start:end])
            self._file.size += end - start
            return
        self._value += data[start:end]
        if len(self._value) > self._limits.max_field_bytes:
            limit = self._limits.max_field_bytes
            self._fail(HttpError(400, f"form field {self._name!r} exceeds {limit} bytes"))

    def _part_end(self) -> None:
        if self.error is not None or self._name is None:
            return
        if self._file is None:
            try:
                text = self._value.decode("utf-8")
            except UnicodeDecodeError:
                self._fail(HttpError(400, f"form field {self._name!r} is not UTF-8"))
                return
            self.form.fields.setdefault(self._name, []).append(text)
        self._file = None

    async def flush(self) -> None:
        """Write the file data parsed so far (in a worker thread: disks can stall)."""
        if not self.pending:
            return
        data, self.pending = b"".join(self.pending), []
        handle = self._handle
        if handle is not None:
            await anyio.to_thread.run_sync(_write_all, handle, data)

    def close_handle(self) -> None:
        if self._handle is not None:
            os.close(self._handle)
            self._handle = None


def _write_all(handle: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(handle, view) :]


async def read_form(
    request: Request,
    *,
    tmp_dir: Path,
    file_fields: frozenset[str] = frozenset({"file"}),
    limits: FormLimits | None = None,
) -> Form:
    """Parse the request's multipart body; the caller must ``close()`` the form."""
    limits = limits or FormLimits()
    kind, params = _content_type(request)
    if kind == _URLENCODED:
        return await _urlencoded(request, limits)
    boundary = _boundary(params)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    collector = _Collector(tmp_dir, file_fields, limits)
    parser = MultipartParser(
        boundary,
        collector.callbacks(),  # type: ignore[arg-type]
        max_header_count=limits.max_headers,
        max_header_size=limits.max_header_bytes,
    )
    try:
        async for chunk in request.body.chunks():
            try:
                parser.write(chunk)
            except FormParserError as exc:
                raise HttpError(400, f"malformed multipart body: {exc}") from None
            if collector.error is not None:
                raise collector.error
            await collector.flush()
        try:
            parser.finalize()
        except FormParserError as exc:
            raise HttpError(400, f"malformed multipart body: {exc}") from None
        if parser.state != MultipartState.END:  # the closing boundary was never seen
            raise HttpError(400, "the multipart body ends before its closing boundary")
        if collector.error is not None:
            raise collector.error
        await collector.flush()
        return collector.form
    except BaseException:
        collector.close_handle()
        collector.form.close()
        raise
    finally:
        collector.close_handle()


async def _urlencoded(request: Request, limits: FormLimits) -> Form:
    """A form without files (``file_path`` names a staged one), as curl ``-d`` sends it."""
    raw = await request.body.read(limit=limits.max_parts * limits.max_field_bytes)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise HttpError(400, "a URL-encoded form must be ASCII") from None
    try:
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            strict_parsing=False,
            errors="strict",
            max_num_fields=limits.max_parts,
        )
    except UnicodeDecodeError:
        raise HttpError(400, "a form field is not UTF-8") from None
    except ValueError:
        raise HttpError(400, f"more than {limits.max_parts} form fields") from None
    form = Form()
    for name, value in pairs:
        if len(value.encode("utf-8")) > limits.max_field_bytes:
            raise HttpError(400, f"form field {name!r} exceeds {limits.max_field_bytes} bytes")
        form.fields.setdefault(name, []).append(value)
    return form
