"""OpenAI response bodies: completions and chat completions, whole and as SSE chunks."""

from __future__ import annotations

import json
import time


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ResponseShape:
    """The body shapes of one endpoint ("completions" or "chat")."""

    def __init__(self, endpoint: str, request_id: str, model: str) -> None:
        self.endpoint = endpoint
        self.id = ("chatcmpl-" if endpoint == "chat" else "cmpl-") + request_id
        self.model = model
        self.created = int(time.time())

    def _base(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        if self.endpoint == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            body = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._base("text_completion")
        return {**body, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, text: str, finish_reason: str | None = None, first: bool = False) -> str:
        if self.endpoint == "chat":
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._base("text_completion")
        return sse({**body, "choices": [choice]})

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        obj = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return sse({**self._base(obj), "choices": [], "usage": usage(prompt_tokens, completion_tokens)})


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
