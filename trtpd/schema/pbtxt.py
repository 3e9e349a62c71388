"""Parse and check config.pbtxt files as Triton's ModelConfig protobuf."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from trtpd.errors import ConfigError


def parse_model_config(text: str, source: str) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"{source}: not a valid Triton ModelConfig: {exc}") from None
    return config


def load_model_config(path: Path) -> model_config_pb2.ModelConfig:
    return parse_model_config(path.read_text(), str(path))


def check_name_matches_folder(config: model_config_pb2.ModelConfig, folder: Path) -> None:
    if config.name and config.name != folder.name:
        raise ConfigError(f"{folder / 'config.pbtxt'}: name {config.name!r} differs from its folder "
                          f"{folder.name!r}; Triton requires them to be equal")


def parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}
