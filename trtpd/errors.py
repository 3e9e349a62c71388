"""Errors a user can act on: each names what is at fault and what to do."""


class TrtpdError(Exception):
    """Base class for errors trtpd reports to users (CLI prints the message, no traceback)."""


class ConfigError(TrtpdError):
    """A config file, field or flag is invalid."""


class UnknownModelError(ConfigError):
    """A model name is not in the catalog."""
