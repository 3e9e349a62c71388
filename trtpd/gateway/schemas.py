"""The OpenAI API's request bodies (the fields trtpd serves) and the error body.

Unknown fields are refused by name (extra="forbid"), as OpenAI does; `n` > 1, `logprobs`, `echo`,
`best_of` other than 1 and the penalties are refused with a message saying what is supported, never
ignored. Every refusal names its field (pydantic's location of the failing validator). Text must be
encodable as UTF-8 (JSON's "\\ud800" escape gives a lone surrogate, which no tokenizer can take), and
sampling values must survive the conversion to the engine's float32 (`top_p: 1e-50` is 0 there).
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MAX_STOP_STRINGS = 4
U64_MAX = 2 ** 64 - 1
I32_MAX = 2 ** 31 - 1


def _utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"is not valid Unicode text: a lone surrogate at character {exc.start} "
                         f"({text[exc.start]!r})") from None
    return text


Text = Annotated[str, AfterValidator(_utf8)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Text
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=0, le=U64_MAX)
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: Text | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False      # vLLM's and trtllm-serve's extension: generate max_tokens, past any EOS

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("top_p")
    @classmethod
    def _top_p_in_float32(cls, value: float) -> float:
        if not np.float32(value) > 0:   # the engine samples in float32: a positive double may round to 0
            raise ValueError(f"{value!r} rounds to 0 in float32 (the engine's dtype); use at least 1e-38")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"n={value} is not supported: this server returns one choice per request (n=1)")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value:
            raise ValueError("penalties are not supported (leave them 0)")
        return value

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream=true")
        return value

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: Text | list[Text]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError(f"one prompt per request, got a list of {len(value)}")
            return value[0]
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported (leave it false)")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        if value is not None:
            raise ValueError("logprobs is not supported (leave it out)")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_one(cls, value):
        if value not in (None, 1):
            raise ValueError(f"best_of={value} is not supported: only 1 (the default)")
        return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: Text
    name: Text | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class TokenGenerateRequest(BaseModel):
    """POST /admin/generate: a request already in token ids, from the fleet's Triton entry (its BLS stub sends
    each of its clients' requests here, so they pass the gateway's admission, cohort, metrics and samples)."""

    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    prompt_ids: list[Annotated[int, Field(ge=0, le=I32_MAX)]] = Field(min_length=1)
    max_new_tokens: int = Field(ge=1)
    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0)
    seed: int = Field(default=0, ge=0, le=U64_MAX)
    end_id: int = Field(default=-1, ge=-1, le=I32_MAX)      # -1: no end id


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The reference model's plain chat template: one 'role: content' line per message, then 'assistant:'."""
    return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant:"


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
