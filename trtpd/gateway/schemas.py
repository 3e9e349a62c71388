"""The OpenAI API's request bodies (the fields trtpd serves) and the error body.

Unknown fields are refused by name (extra="forbid"), as OpenAI does; `n` > 1, `logprobs`, `echo`,
`best_of` > 1 and the penalties are refused with a message saying what is supported, never ignored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP_STRINGS = 4
U64_MAX = 2 ** 64 - 1


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=0, le=U64_MAX)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None
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

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError(f"n={self.n} is not supported: this server returns one choice per request (n=1)")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty and frequency_penalty are not supported (leave them 0)")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _one_prompt(self):
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise ValueError(f"prompt: one prompt per request, got a list of {len(self.prompt)}")
            self.prompt = self.prompt[0]
        if self.echo or self.logprobs is not None or (self.best_of or 1) != 1:
            raise ValueError("echo, logprobs and best_of are not supported")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer"]
    content: str
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The reference model's plain chat template: one 'role: content' line per message, then 'assistant:'."""
    return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant:"


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
