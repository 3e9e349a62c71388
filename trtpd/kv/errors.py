"""Errors of the KV transfer. Each names the request, the endpoint or the field at fault and says what to do.

    KvTransferError
    ├── KvHandleError               context_phase_params that cannot be trusted
    │   ├── KvHandleMalformedError  not a trtpd handle, truncated, or an unknown version
    │   ├── KvHandleForgedError     the HMAC signature does not verify (altered, or another key)
    │   └── KvHandleExpiredError    past expires_at_s (stale)
    ├── KvLayoutMismatchError       prefill and decode KV layouts differ; lists every difference
    ├── KvExportNotFoundError       the prefill side has no such export (pulled, failed, timed out, never made)
    ├── KvPrefillFailedError        prefill failed or was cancelled while (or before) decode was pulling
    ├── KvConnectError              the exporter cannot be reached, or the connection broke
    ├── KvTransferTimeoutError      a deadline passed (on the decode side, or the exporter timed the export out)
    └── KvProtocolError             the peer sent bytes that are not this protocol
"""

from __future__ import annotations

from trtpd.errors import TrtpdError


class KvTransferError(TrtpdError):
    """A KV-cache transfer between a prefill and a decode instance failed."""


class KvHandleError(KvTransferError):
    """A context_phase_params handle was refused."""


class KvHandleMalformedError(KvHandleError):
    pass


class KvHandleForgedError(KvHandleError):
    pass


class KvHandleExpiredError(KvHandleError):
    pass


class KvLayoutMismatchError(KvTransferError):
    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class KvExportNotFoundError(KvTransferError):
    pass


class KvPrefillFailedError(KvTransferError):
    pass


class KvConnectError(KvTransferError):
    pass


class KvTransferTimeoutError(KvTransferError):
    pass


class KvProtocolError(KvTransferError):
    pass
