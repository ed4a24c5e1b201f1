"""The real Python packages the code-repair tasks are made from: pinned source distributions, cached locally.

Each :class:`Package` is a permissively licensed, pure-Python project whose
source distribution ships its own tests. ``make install-code-repair`` runs
``python -m environments.code_repair.packages``, which downloads every
pinned sdist from the package registry into the cache
(``$TRACE_RAY_CACHE/code_repair/sdists``, default ``~/.cache/trace-ray``)
once; nothing is downloaded at run time.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from environments.errors import TraceRayError


@dataclass(frozen=True)
class Package:
    name: str  # the distribution's name on the registry
    version: str
    license: str
    sources: tuple[str, ...]  # the files bugs are injected into, relative to the unpacked root
    tests: tuple[str, ...]  # the test files or folders run, relative to the root
    pytest_args: tuple[str, ...] = ()  # beyond the shared ones (e.g. clearing an addopts that needs a plugin)

    @property
    def sdist_stem(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}"


PACKAGES = (
    Package(
        "cachetools",
        "8.0.2",
        "MIT",
        ("src/cachetools/__init__.py", "src/cachetools/keys.py"),
        ("tests",),
        ("-o", "pythonpath=src"),
    ),  # a src layout: import the sdist's copy, never an installed one
    Package("inflection", "0.5.1", "MIT", ("inflection/__init__.py",), ("test_inflection.py",)),
    Package("more-itertools", "11.2.1", "MIT", ("more_itertools/recipes.py",), ("tests/test_recipes.py",)),
    Package(
        "semver",
        "3.1.2",
        "BSD-3-Clause",
        ("src/semver/version.py", "src/semver/_deprecated.py"),
        ("tests",),
        ("-o", "addopts="),
    ),  # its addopts need pytest-cov
    Package(
        "tabulate",
        "0.10.0",
        "MIT",
        ("tabulate/__init__.py",),
        ("test/test_output.py", "test/test_api.py", "test/test_internal.py"),
    ),
    Package(
        "toolz",
        "1.2.0",
        "BSD-3-Clause",
        ("toolz/itertoolz.py", "toolz/dicttoolz.py", "toolz/functoolz.py"),
        ("toolz/tests",),
    ),
)
INSTALL_HINT = "make install-code-repair"


def cache_dir() -> Path:
    root = os.environ.get("TRACE_RAY_CACHE") or str(Path.home() / ".cache" / "trace-ray")
    return Path(root) / "code_repair"


def sdist_path(package: Package) -> Path:
    return cache_dir() / "sdists" / f"{package.sdist_stem}.tar.gz"


def sdist_digest(package: Package) -> str:
    """The sha256 of the package's sdist: the ``base_commit`` of its tasks (a source digest, as there is no git
    history)."""
    return hashlib.sha256(sdist_path(package).read_bytes()).hexdigest()


def require_sdists(packages: tuple[Package, ...] = PACKAGES) -> None:
    missing = [f"{p.name}=={p.version}" for p in packages if not sdist_path(p).is_file()]
    if missing:
        raise TraceRayError(
            f"env=code_repair needs the source distributions of {', '.join(missing)} in "
            f"{cache_dir() / 'sdists'}; "
            f"run {INSTALL_HINT}"
        )


def unpack(package: Package, into: Path) -> Path:
    """The package's sdist unpacked under ``into``; returns its root folder."""
    require_sdists((package,))
    root = into / package.sdist_stem
    if not root.is_dir():
        with tarfile.open(sdist_path(package)) as archive:
            archive.extractall(into, filter="data")
    if not root.is_dir():
        raise TraceRayError(
            f"the sdist {sdist_path(package)} does not hold a folder {package.sdist_stem}; delete it "
            f"and run {INSTALL_HINT}"
        )
    return root


def download(packages: tuple[Package, ...] = PACKAGES) -> None:
    """Every pinned sdist not yet cached, from the configured package index (pip download)."""
    folder = cache_dir() / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    for package in packages:
        if sdist_path(package).is_file():
            continue
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(folder),
            f"{package.name}=={package.version}",
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not sdist_path(package).is_file():
            last = (result.stderr.strip().splitlines() or ["no sdist"])[-1]
            raise TraceRayError(
                f"could not download the sdist of {package.name}=={package.version} ({last}); check the package index"
            )
        print(f"cached {sdist_path(package)}")


if __name__ == "__main__":
    try:
        download()
    except TraceRayError as exc:
        sys.exit(f"error: {exc}")
