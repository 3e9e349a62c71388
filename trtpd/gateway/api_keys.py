"""The gateway's API keys: one per line in a file only its owner can read (mode 0600, like kv.key).

`trtpd up` generates one (`sk-trtpd-...`, 0600, printed once) unless the user brings a key file or asks for
`--no-auth`, which is allowed on a loopback address only.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

from trtpd.errors import ConfigError

KEY_PREFIX = "sk-trtpd-"


def read_api_keys(path: "str | os.PathLike") -> frozenset[str]:
    """The keys in `path`; refuses a file that others can read or write, or one with no key."""
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o777
    except OSError as exc:
        raise ConfigError(f"API key file {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ConfigError(f"API key file {path} is readable by others (mode {mode:04o}); run: chmod 600 {path}")
    keys = frozenset(line.strip() for line in path.read_text().splitlines() if line.strip())
    if not keys:
        raise ConfigError(f"API key file {path}: no API key in it (one per line)")
    return keys


def create_api_key_file(path: "str | os.PathLike") -> str | None:
    """Writes a fresh key to `path` (0600) unless the file exists; returns the new key, or None if it existed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def derived_api_key(deployment_key: bytes) -> str:
    """An API key derived from the deployment's KV key (HMAC-SHA256, domain-separated): what the Kubernetes
    manifests put in the gateway's Secret, the same at every render (a new key would be a new KV key too)."""
    import base64
    import hashlib
    import hmac

    digest = hmac.new(deployment_key, b"trtpd gateway API key", hashlib.sha256).digest()
    return KEY_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def first_key(path: "str | os.PathLike") -> str:
    """The first key of a key file (what trtpd's own clients send: bench, demo, tests)."""
    return next(line.strip() for line in Path(path).read_text().splitlines() if line.strip())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_no_auth(host: str) -> None:
    if not is_loopback(host):
        raise ConfigError(f"--no-auth is allowed on a loopback address only (got --host {host}): anyone who can "
                          f"reach {host} could use the API; give an --api-key-file instead")
