"""What keeps other local users out of a tritonserver that trtpd starts: a preloaded guard library, and
the restricted-API secret.

1. Flags nobody else can read. Every user on a host can read any process's /proc/<pid>/cmdline, and
   tritonserver takes the restricted-API header value only as a flag (--http-restricted-api=<apis>:<key>=
   <value>). So trtpd passes such flags in an environment variable instead (/proc/<pid>/environ is readable
   by the process's owner only) and the guard wraps __libc_start_main: it appends those flags to the argv
   that main() sees (a heap copy; /proc/<pid>/cmdline keeps showing the original arguments), then wipes and
   unsets the variable, so the python-backend stubs that tritonserver starts do not inherit it.
2. Private shared memory. The python backend creates its regions (/dev/shm/<prefix><uuid>: every request's
   inputs and outputs, prompts and KV handles included) through boost.interprocess, which fchmod()s them to
   0644 whatever the umask. The guard wraps fchmod and clears the group and other bits of any file under
   /dev/shm, so a region is 0600 from the moment it exists (shm_open honours umask 077, which the server
   is started with) and no other user can open it, not even for an instant.

The library is compiled with the system C compiler (cc) into the deployment's state folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from trtpd.errors import TrtpdError

ENV_VAR = "TRTPD_HIDDEN_ARGS"     # newline-separated flags

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int (*fchmod_fn)(int, mode_t);

int fchmod(int fd, mode_t mode) {
    static fchmod_fn real = NULL;
    if (real == NULL) real = (fchmod_fn)dlsym(RTLD_NEXT, "fchmod");
    char link[64], path[512];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n > 9 && strncmp(path, "/dev/shm/", 9) == 0) mode &= ~(mode_t)077;   /* owner only */
    return real(fd, mode);
}

typedef int (*main_fn)(int, char **, char **);
typedef int (*start_fn)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void), void *);

int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void), void (*fini)(void),
                      void (*rtld_fini)(void), void *stack_end) {
    start_fn real = (start_fn)dlsym(RTLD_NEXT, "__libc_start_main");
    char *hidden = getenv("TRTPD_HIDDEN_ARGS");   /* LD_PRELOAD stays: the stubs get the fchmod guard too */
    if (hidden == NULL || real == NULL) {
        if (real == NULL) return 127;
        return real(main, argc, argv, init, fini, rtld_fini, stack_end);
    }
    char *copy = strdup(hidden);
    memset(hidden, 0, strlen(hidden));
    unsetenv("TRTPD_HIDDEN_ARGS");
    int extra = 1;
    for (char *p = copy; *p; p++) if (*p == '\n') extra++;
    char **args = calloc((size_t)argc + (size_t)extra + 1, sizeof(char *));
    if (copy == NULL || args == NULL) return 127;
    int n = 0;
    for (int i = 0; i < argc; i++) args[n++] = argv[i];
    for (char *tok = strtok(copy, "\n"); tok != NULL; tok = strtok(NULL, "\n")) args[n++] = tok;
    args[n] = NULL;
    return real(main, n, args, init, fini, rtld_fini, stack_end);
}
"""


def preload_library(folder: Path) -> Path:
    """Builds (once per source version) the preload library in `folder`; returns its path."""
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    target = Path(folder) / f"trtpd_server_guard_{digest}.so"
    if target.is_file():
        return target
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise TrtpdError("tritonserver needs a C compiler (cc) to build trtpd's server guard (admin secret off "
                         "the command line, python-backend shared memory 0600); install gcc (apt-get install gcc)")
    src = target.with_suffix(".c")
    src.write_text(SOURCE)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    result = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src), "-ldl"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise TrtpdError(f"compiling {src} failed:\n{result.stderr.strip()}")
    os.replace(tmp, target)
    return target


def hide(env: dict[str, str], args: list[str], folder: Path) -> dict[str, str]:
    """`env` with `args` passed out of sight of other users (see the module docstring)."""
    if any("\n" in a for a in args):
        raise ValueError("hidden tritonserver arguments cannot contain newlines")
    env = dict(env)
    env[ENV_VAR] = "\n".join(args)
    env["LD_PRELOAD"] = str(preload_library(folder))
    return env


# Triton's admin APIs: registering system shared memory (which the server, not the caller, opens: it could
# map the 0600 KV pool for anyone), model load/unload and the repository index, and the logging and trace
# settings (which choose files the server writes) need this header. Health, metadata, model config,
# statistics and inference stay open: clients of the ensemble use them, and they reveal no secret.
ADMIN_HEADER = "trtpd-admin-key"
RESTRICTED_APIS = ("shared-memory", "model-repository", "logging", "trace")
ADMIN_KEY_FILE = "triton-admin.key"


def admin_flags(admin_key: bytes) -> list[str]:
    value = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={admin_key.hex()}"
    return [f"--http-restricted-api={value}", f"--grpc-restricted-protocol={value}"]


GRPC_HEADER_PREFIX = "triton-grpc-protocol-"    # Triton 2.51 expects the gRPC metadata key with this prefix


def admin_headers(admin_key_file: str | os.PathLike, protocol: str = "http") -> dict[str, str]:
    """The HTTP header (protocol "http") or gRPC metadata ("grpc") that opens the restricted APIs of the
    server using this key file."""
    from trtpd.kv.handle import load_or_create_key_file
    if protocol not in ("http", "grpc"):
        raise ValueError(f"protocol {protocol!r}: use http or grpc")
    prefix = GRPC_HEADER_PREFIX if protocol == "grpc" else ""
    return {prefix + ADMIN_HEADER: load_or_create_key_file(admin_key_file).hex()}
