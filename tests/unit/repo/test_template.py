import pytest

from trtpd.errors import ConfigError
from trtpd.repo.template import placeholders, render


def test_fills_every_placeholder():
    assert render("a: ${x} b: ${y} $$z", {"x": 1, "y": True}, "t") == "a: 1 b: true $z"


def test_unfilled_placeholder_is_an_error_naming_the_file():
    with pytest.raises(ConfigError, match=r"model.pbtxt: no value for placeholder\(s\) \$\{engine_dir\}"):
        render("gpt_model_path: ${engine_dir}", {}, "model.pbtxt")


def test_unknown_value_is_an_error():
    with pytest.raises(ConfigError, match="enigne_dir"):
        render("x: ${engine_dir}", {"engine_dir": "/e", "enigne_dir": "/e"}, "t")


def test_malformed_placeholder_is_an_error():
    with pytest.raises(ConfigError, match="malformed"):
        placeholders("x: $engine_dir")
