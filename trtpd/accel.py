"""Compiled copies of the simulator's hot modules (Cython), used only while they match their source.

The simulator and the planner spend their time in a few pure-Python modules (the event loop, the
instances, the schedulers, the router, the roofline, the planner's searches and estimates). `build()`
compiles those modules, unchanged, with Cython: no type declarations, Python semantics throughout (every
float operation is the one CPython does), so a run gives the same floats, bit for bit, compiled or not
(tests/unit/sim/test_accel.py checks it), and 1.2-1.6x faster. Nothing needs them: without a build, or with TRTPD_NO_ACCEL=1, every module is the
Python source.

A compiled module is imported only when the sha256 of its source, recorded at build time, is the source's
now: an edited module is its Python source until the next build (a stale copy is never used). The build
lives in a directory of its own per interpreter ABI (`<repo>/.accel/<cache tag>-<platform>/` in a
checkout; TRTPD_ACCEL_DIR overrides the root), which must belong to this user and be writable by no one
else: a shared object is code, and nobody else's gets loaded.

    trtpd accel build     # needs Cython and a C compiler (scripts/setup.sh runs it)
    trtpd accel status
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import stat
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple

# (every `import trtpd` runs install(): what only build() needs is imported there)

# the modules the simulator and the planner spend their time in (each a pure-Python module, compiled as it is)
MODULES = (
    "trtpd.sim.events", "trtpd.sim.stepping", "trtpd.sim.colocated_instance", "trtpd.sim.decode_instance",
    "trtpd.sim.prefill_instance", "trtpd.sim.shared_cores", "trtpd.sim.simulator", "trtpd.sim.kv_blocks",
    "trtpd.sim.fleet", "trtpd.sim.attainment", "trtpd.sim.records", "trtpd.sim.sequence", "trtpd.perf.roofline",
    "trtpd.perf.step_runs", "trtpd.sched.continuous", "trtpd.sched.prefill", "trtpd.sched.block_allocator",
    "trtpd.routing.core", "trtpd.perf.kv_link", "trtpd.sim.goodput", "trtpd.planner.colocated",
    "trtpd.planner.role_models", "trtpd.planner.estimate", "trtpd.planner.compare", "trtpd.planner.verify",
    "trtpd.planner.search", "trtpd.planner.candidates",
)
MANIFEST = "manifest.json"
# whatever CFLAGS says: IEEE double arithmetic, no fused multiply-add (the floats CPython computes)
IEEE_FLAGS = ["-fno-fast-math", "-ffp-contract=off"]
DISABLE_ENV = "TRTPD_NO_ACCEL"
DIR_ENV = "TRTPD_ACCEL_DIR"
PACKAGE_DIR = Path(__file__).resolve().parent


def abi_tag() -> str:
    """One build per interpreter ABI and platform: another Python never loads this one's objects."""
    return f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"


def default_root() -> Path:
    env = os.environ.get(DIR_ENV)
    if env:
        return Path(env)
    checkout = PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".accel"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtpd" / "accel"


def build_dir(root: Path | None = None) -> Path:
    return (root or default_root()) / abi_tag()


def source_path(module: str) -> Path:
    parts = module.split(".")
    if parts[0] != "trtpd":
        raise ValueError(f"{module}: not a trtpd module")
    return PACKAGE_DIR.joinpath(*parts[1:]).with_suffix(".py")


def sha256_hex(data: bytes) -> str:
    import hashlib
    return hashlib.sha256(data).hexdigest()


def source_sha256(path: Path) -> str:
    return sha256_hex(path.read_bytes())


def enabled() -> bool:
    """Not switched off by TRTPD_NO_ACCEL."""
    return os.environ.get(DISABLE_ENV, "") in ("", "0")


def compiled_file(directory: Path, module: str, entry: dict | None) -> tuple[str, Path | None]:
    """What the manifest entry of `module` gives this interpreter: ("fresh", its shared object), or
    ("missing" | "stale", None): not built, built for another ABI, or built from another version of its
    source (which is then the module)."""
    if entry is None:
        return "missing", None
    so = directory / entry["file"]
    if not entry["file"].endswith(importlib.machinery.EXTENSION_SUFFIXES[0]) or not so.is_file():
        return "missing", None
    try:
        if entry["sha256"] != source_sha256(source_path(module)):
            return "stale", None
    except OSError:
        return "stale", None
    return "fresh", so


def private_dir_problem(path: Path) -> str | None:
    """Why `path` must not be loaded from (None: it and the directory holding it are this user's, and no
    one else can write to either: nobody else can put a shared object there or swap the directory)."""
    return _dir_problem(path) or _dir_problem(path.parent)


def _dir_problem(path: Path) -> str | None:
    try:
        st = path.lstat()
    except OSError as e:
        return f"{path}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path}: not a directory"
    if st.st_uid != os.getuid():
        return f"{path}: owned by uid {st.st_uid}, not this user ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path}: writable by its group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class Status(NamedTuple):
    directory: Path
    enabled: bool                  # not switched off by TRTPD_NO_ACCEL
    problem: str | None            # why nothing is loaded from the directory, if so
    fresh: tuple[str, ...]         # built and matching their source: imported compiled
    stale: tuple[str, ...]         # built from another version of their source: imported as Python
    missing: tuple[str, ...]       # not built
    loaded: tuple[str, ...]        # imported compiled in this process

    @property
    def built(self) -> bool:
        """Every module in MODULES is built, fresh, in a directory it may be loaded from."""
        return self.problem is None and len(self.fresh) == len(MODULES)

    @property
    def complete(self) -> bool:
        """Every module in MODULES would be imported compiled."""
        return self.enabled and self.built

    def describe(self) -> str:
        if not self.enabled:
            return f"compiled modules: off ({DISABLE_ENV}=1); every module is Python"
        if self.problem is not None:
            return f"compiled modules: none ({self.problem}); every module is Python"
        parts = [f"{len(self.fresh)} of {len(MODULES)} compiled, matching their source"]
        if self.stale:
            parts.append(f"{len(self.stale)} stale (Python until rebuilt: {', '.join(self.stale)})")
        if self.missing:
            parts.append(f"{len(self.missing)} not built")
        return f"compiled modules ({self.directory}): " + "; ".join(parts)


def _read_manifest(directory: Path) -> dict:
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data.get("modules", {}) if isinstance(data, dict) and data.get("abi") == abi_tag() else {}


def status(directory: Path | None = None) -> Status:
    directory = directory or build_dir()
    problem = private_dir_problem(directory)
    manifest = {} if problem else _read_manifest(directory)
    found: dict[str, list[str]] = {"fresh": [], "stale": [], "missing": []}
    for module in MODULES:
        found[compiled_file(directory, module, manifest.get(module))[0]].append(module)
    loaded = tuple(m for m in MODULES if getattr(sys.modules.get(m), "__file__", "").endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES)))
    if problem and "No such file" in problem:
        problem = f"not built ({directory} does not exist; run `trtpd accel build`)"
    return Status(directory, enabled(), problem, tuple(found["fresh"]), tuple(found["stale"]),
                  tuple(found["missing"]), loaded)


class _Finder:        # a sys.meta_path finder (importlib.abc.MetaPathFinder's protocol; that import is slow)
    """Finds the compiled copy of a module in MODULES when it was built from the source there is now."""

    def __init__(self, directory: Path, manifest: dict) -> None:
        self.directory, self.manifest = directory, manifest

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's protocol)
        entry = self.manifest.get(fullname)
        if entry is None:
            return None                           # not one of MODULES: the usual finders
        _, so = compiled_file(self.directory, fullname, entry)
        if so is None:
            return None                           # the Python source is the module
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


def install(directory: Path | None = None) -> bool:
    """Puts the finder first on sys.meta_path (once); False when nothing would be loaded from there."""
    if not enabled():
        return False
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    directory = directory or build_dir()
    if private_dir_problem(directory) is not None:
        return False
    manifest = _read_manifest(directory)
    if not manifest:
        return False
    sys.meta_path.insert(0, _Finder(directory, manifest))
    return True


class _output_to:
    """Sends this process's stdout and stderr (file descriptors 1 and 2: the compiler's too) to path (None:
    leaves them)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def __enter__(self) -> None:
        if self.path is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = os.dup(1), os.dup(2)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def __exit__(self, *exc) -> None:
        if self.path is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in zip((1, 2), self.saved):
            os.dup2(fd, target)
            os.close(fd)


def build(directory: Path | None = None, modules: tuple[str, ...] = MODULES, jobs: int | None = None,
          quiet: bool = True) -> Status:
    """Compiles `modules` (Cython, then the C compiler) into `directory`, replacing what was there; raises
    RuntimeError naming what failed (Cython not installed, no C compiler, a module that does not compile)."""
    import fcntl
    import shutil
    import tempfile
    import time
    try:
        from Cython.Build import cythonize
        from setuptools import Extension, setup
    except ImportError as e:
        raise RuntimeError(f"compiling needs Cython and setuptools ({e}); pip install cython") from e
    import Cython
    directory = directory or build_dir()
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    jobs = jobs or min(len(modules), os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="trtpd-accel-") as tmp:
        work = Path(tmp)
        shas, extensions = {}, []
        for module in modules:                  # a copy, so that what is compiled is what is hashed
            src = source_path(module)
            data = src.read_bytes()
            shas[module] = sha256_hex(data)
            dst = work / "src" / Path(*module.split(".")).with_suffix(".py")
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)
            extensions.append(Extension(module, [str(dst)], extra_compile_args=IEEE_FLAGS))
        directives = {"language_level": 3, "annotation_typing": False, "binding": True,
                      "embedsignature": False}
        out = work / "out"
        argv = ["build_ext", "--build-lib", str(out), "--build-temp", str(work / "tmp"), f"--parallel={jobs}"]
        cwd = os.getcwd()
        log = work / "build.log"
        with _output_to(log if quiet else None):
            os.chdir(work)                      # setuptools reads the project files of the directory it runs in
            try:
                ext = cythonize(extensions, compiler_directives=directives, quiet=quiet, nthreads=jobs,
                                build_dir=str(work / "c"))
                setup(name="trtpd-accel", ext_modules=ext, script_args=argv, packages=[], py_modules=[])
                failure = None
            except (Exception, SystemExit) as e:     # distutils exits on a compiler error
                failure = e
            finally:
                os.chdir(cwd)
        if failure is not None:
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            raise RuntimeError(f"compiling the simulator's modules failed: {failure}" +
                               "".join(f"\n  {line}" for line in tail)) from failure
        staged = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))   # mode 0700
        try:
            manifest = {}
            for module in modules:
                rel = Path(*module.split("."))
                found = [p for p in (out / rel.parent).glob(rel.name + ".*") if p.suffix in (".so", ".pyd")]
                if len(found) != 1:
                    raise RuntimeError(f"{module}: the build left {len(found)} compiled files")
                name = module + "".join(found[0].suffixes)
                shutil.copy2(found[0], staged / name)
                manifest[module] = {"file": name, "sha256": shas[module]}
            (staged / MANIFEST).write_text(json.dumps(
                {"abi": abi_tag(), "cython": Cython.__version__, "built_at": time.time(), "modules": manifest},
                indent=1, sort_keys=True))
            with open(directory.parent / ".build.lock", "w") as lock:   # one swap at a time
                fcntl.flock(lock, fcntl.LOCK_EX)
                old = None
                if directory.exists():
                    old = directory.with_name(f".{directory.name}.old.{os.getpid()}")
                    directory.rename(old)
                staged.rename(directory)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
    return status(directory)
