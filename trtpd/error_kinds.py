"""Who is at fault for an error, carried inside its message.

Triton 2.51 drops the error code of a decoupled python model's response on the way out (its HTTP
generate endpoints answer 400 for every code, and gRPC stream errors carry only a message), so trtpd's
models end every error message with a tag naming its kind. A frontend that can tell the client the
truth (the gateway: 400 for the client's fault, 500/503 for ours) reads it back with `parse`.
"""

from __future__ import annotations

import re

KINDS = ("invalid_arg", "unavailable", "internal", "cancelled", "unsupported", "not_found", "already_exists",
         "unknown")
_TAG = re.compile(r"\s*\[trtpd:(\w+)\]\s*$")


def tag(message: str, kind: str) -> str:
    """`message` with its kind appended once (an already tagged message is re-tagged)."""
    return f"{_TAG.sub('', message)} [trtpd:{kind if kind in KINDS else 'internal'}]"


def parse(message: str) -> tuple[str, str | None]:
    """(the message without its tag, the kind it names or None when untagged)."""
    match = _TAG.search(message)
    if match is None:
        return message, None
    kind = match.group(1)
    return message[:match.start()], kind if kind in KINDS else None
