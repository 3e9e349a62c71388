"""The gateway's admission: trtpd/admission.py's one design, its asyncio face (`admit()` on the event loop, before
the handler awaits anything; `await ticket.enter()`; HTTP 429 with Retry-After beyond the bounds)."""

from trtpd.admission import Admission, Overloaded, Ticket   # noqa: F401 - the gateway's names for them
