"""Exception hierarchy.

Two families matter to callers:

* ``DocumentError`` subclasses describe something wrong with one document. They carry a stable
  ``error_class`` string that is recorded in the manifest; the run goes on with other documents and
  Airflow must not retry the task for them.
* ``InfrastructureError`` subclasses (``ServerUnavailable``, ``StorageError``) mean the environment is
  broken. Work is aborted without publishing partial results, and the task is retried later.
"""

from __future__ import annotations

from typing import Literal


class OlmocrTasksError(Exception):
    """Base class of every error raised by olmocr_tasks."""


class ConfigurationError(OlmocrTasksError):
    """Settings or arguments are invalid (a usage error)."""


class DocumentError(OlmocrTasksError):
    """A document cannot be converted because of its content."""

    error_class = "document_error"


class UnsupportedFormatError(DocumentError):
    """The content is no format we convert, not the format its name says, or one the run excludes.

    ``detected`` names what the content was found to be (``png``, ``gif``, ``unknown``...).
    """

    error_class = "unsupported_format"

    def __init__(self, message: str = "", detected: str = "unknown") -> None:
        super().__init__(message)
        self.detected = detected


class NotPdfError(UnsupportedFormatError):
    """A file named ``.pdf`` whose content is not a PDF: the older, narrower class, kept for such files
    so that manifests, ledgers and dashboards that count ``not_pdf`` keep their meaning."""

    error_class = "not_pdf"


class EmptyDocumentError(DocumentError):
    error_class = "empty"


class EncryptedPdfError(DocumentError):
    error_class = "encrypted"


class CorruptPdfError(DocumentError):
    error_class = "corrupt"


class TooLargeError(DocumentError):
    """Over a byte limit, or a page whose render needs more memory than a render worker may use."""

    error_class = "too_large"


class TooManyPagesError(TooLargeError):
    """More pages than the per-document page cap: refused before any page is rendered."""

    error_class = "too_many_pages"


class ErrorRateExceededError(DocumentError):
    error_class = "error_rate_exceeded"


class UnreadableSourceError(DocumentError):
    """The object exists in the listing but cannot be read (deleted, access denied)."""

    error_class = "unreadable"


class OutsideAllowedError(DocumentError):
    """The document lies outside the inputs the deployment allows, though it was listed or named under
    them (a symbolic link leading out, a tampered batch file): it is not opened."""

    error_class = "outside_allowed"


class AttemptFailed(OlmocrTasksError):
    """One failed page attempt: the page logic moves on to its next attempt (or the fallback page).

    Raised by the client, handled by the page retry ladder.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


RenderErrorReason = Literal["timeout", "crashed", "failed", "protocol"]


class RenderError(OlmocrTasksError):
    """A page could not be rendered or read: the worker timed out, crashed or reported a failure.

    ``reason`` is "timeout", "crashed", "failed" or "protocol" (the worker answered something that is not
    a well-formed reply, so it is no longer trusted). The pool has already replaced a killed worker; the
    caller decides whether the page is retried or falls back. Raised by rendering, handled by the page
    retry ladder and the conversion.
    """

    def __init__(self, reason: RenderErrorReason, message: str) -> None:
        super().__init__(message)
        self.reason: RenderErrorReason = reason


class InfrastructureError(OlmocrTasksError):
    """The environment failed; the work should be retried later as a whole."""


class ServerUnavailable(InfrastructureError):
    """The inference server was unreachable or failing for longer than the outage window."""


class ServerNotReady(InfrastructureError):
    """The readiness check failed: the server is down or does not serve the configured model."""


class ServerMisconfigured(ServerNotReady):
    """The server answered, but wrongly for us (API key, base URL, model): waiting will not fix it."""


class StorageError(InfrastructureError):
    """Reading or writing storage failed after retries."""


DOCUMENT_ERROR_CLASSES: tuple[type[DocumentError], ...] = (
    UnsupportedFormatError,
    NotPdfError,
    EmptyDocumentError,
    EncryptedPdfError,
    CorruptPdfError,
    TooLargeError,
    TooManyPagesError,
    ErrorRateExceededError,
    UnreadableSourceError,
)
