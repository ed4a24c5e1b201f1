"""The configuration reference, rendered from ``conf/`` and the typed dataclasses: ``docs/configuration.md``.

Every key of every YAML file under ``conf/`` with its default, its type (from
``trace_ray/config.py``) and the comments written beside it or just above it.
``python -m trace_ray.config_reference`` (``make docs``) rewrites the page;
a test fails when the page is out of date.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

from trace_ray.config import TraceConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")
COMMENT_LINE = re.compile(r"^(?P<indent> *)#\s?(?P<comment>.*)$")


@dataclass
class Entry:
    key: str  # dotted path from the file's root (a group file's keys are under the group's name)
    value: str  # as written ("" for a mapping)
    comment: list[str] = field(default_factory=list)


@dataclass
class ConfigFile:
    path: Path
    description: list[str]  # the comment lines before its first key
    entries: list[Entry]


def read_config_file(path: Path, prefix: str) -> ConfigFile:
    """Keys, values and comments of one YAML file; ``prefix`` is the dotted path its keys live under."""
    description: list[str] = []
    pending: list[str] = []  # full-line comments waiting for the next key
    entries: list[Entry] = []
    parents: list[tuple[int, str]] = []  # (indentation, key) of the open mappings
    last_indent = -1
    in_list = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            pending = [] if entries else pending
            continue
        comment = COMMENT_LINE.match(line)
        if comment:
            text = comment.group("comment").strip()
            if text.startswith("@package"):
                continue
            if entries and len(comment.group("indent")) > last_indent and entries[-1].comment and not pending:
                entries[-1].comment.append(text)  # continues the comment beside the last key
            elif entries:
                pending.append(text)
            else:
                description.append(text)
            continue
        if line.lstrip().startswith("- "):
            if in_list and entries:
                entries[-1].value += (", " if entries[-1].value else "") + line.strip()[2:].split("#")[0].strip()
            continue
        match = KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match.group("indent"))
        while parents and parents[-1][0] >= indent:
            parents.pop()
        key = match.group("key")
        path_parts = (
            [prefix] if prefix and key != "defaults" else []
        )  # a file's defaults list is Hydra's, never prefixed
        dotted = ".".join([*path_parts, *(name for _, name in parents), key])
        value = match.group("value").strip()
        entry = Entry(dotted, value, [*pending, *([match.group("comment").strip()] if match.group("comment") else [])])
        pending, last_indent = [], indent
        in_list = value == ""
        entries.append(entry)
        if value == "":
            parents.append((indent, key))
    return ConfigFile(path, description, entries)


def dataclass_comments() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the comment beside the field in ``trace_ray/config.py``."""
    comments, current = {}, None
    for line in Path(sys.modules[TraceConfig.__module__].__file__).read_text(encoding="utf-8").splitlines():
        if line.startswith("class "):
            current = line[len("class ") :].split("(")[0].split(":")[0].strip()
        elif current and (match := re.match(r"^    (\w+): [^#]*#\s?(.*)$", line)):
            comments[(current, match.group(1))] = match.group(2).strip()
    return comments


def field_types() -> tuple[dict[str, str], dict[str, str]]:
    """Dotted key -> its type as the dataclasses declare it, and dotted key -> the comment beside its field."""
    types: dict[str, str] = {}
    comments: dict[str, str] = {}
    written = dataclass_comments()

    def walk(cls, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for item in dataclasses.fields(cls):
            hint = hints[item.name]
            dotted = f"{prefix}{item.name}"
            if (cls.__name__, item.name) in written:
                comments[dotted] = written[(cls.__name__, item.name)]
            inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
            target = inner[0] if typing.get_origin(hint) is typing.Union and len(inner) == 1 else hint
            if dataclasses.is_dataclass(target):
                types[dotted] = target.__name__ + (" or null" if target is not hint else "")
                walk(target, dotted + ".")
            else:
                types[dotted] = _type_name(hint)

    walk(TraceConfig, "")
    return types, comments


def _type_name(hint) -> str:
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_type_name(arg) for arg in args) + " or null"
    if typing.get_origin(hint) in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if typing.get_origin(hint) is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def _table(config_file: ConfigFile, types: dict[str, str], comments: dict[str, str], root: bool = False) -> list[str]:
    """One row per key: its default as written, its type, its comment in the YAML (else the dataclass's)."""
    rows = ["| key | default | type | meaning |", "|---|---|---|---|"]
    for entry in config_file.entries:
        if root and entry.key == "defaults":
            continue  # the groups table shows them
        value = f"`{entry.value}`" if entry.value else ""
        meaning = " ".join(entry.comment) or comments.get(entry.key, "")
        meaning = meaning.replace("<", "&lt;").replace(
            ">", "&gt;"
        )  # outside code spans, <key> would read as an HTML tag
        rows.append(f"| `{entry.key}` | {_cell(value)} | {_cell(types.get(entry.key, ''))} | {_cell(meaning)} |")
    return rows


def groups() -> dict[str, list[str]]:
    return {
        folder.name: sorted(path.stem for path in folder.glob("*.yaml"))
        for folder in sorted(CONF_DIR.iterdir())
        if folder.is_dir()
    }


def render() -> str:
    types, comments = field_types()
    root = read_config_file(CONF_DIR / "config.yaml", "")
    defaults = next(entry for entry in root.entries if entry.key == "defaults")
    chosen = dict(item.split(":", 1) for item in defaults.value.split(", ") if ":" in item)
    lines = [
        "# Configuration reference",
        "",
        "Generated from `conf/` and `trace_ray/config.py` by `python -m trace_ray.config_reference` (`make docs`); "
        "a test fails when this page is out of date. Override any key on the command line (`key=value`), pick a group "
        "option (`model=qwen3_8b`), or sweep with `-m` (`trace-ray train -m lora.rank=8,16`). Every config is checked "
        "in one place (`validate` in `trace_ray/config.py`): a bad value is a one-line error naming the key.",
        "",
        "## Groups",
        "",
        "| group | options | default |",
        "|---|---|---|",
    ]
    for group, options in groups().items():
        lines.append(
            f"| `{group}` | {', '.join(f'`{option}`' for option in options)} | "
            f"`{chosen.get(group, '').strip() or 'none'}` |"
        )
    lines += [
        "",
        "## Root keys (`conf/config.yaml`)",
        "",
        *(f"{text}" for text in root.description),
        "",
        *_table(root, types, comments, root=True),
    ]
    for group, options in groups().items():
        lines += ["", f"## `{group}`", ""]
        for option in options:
            path = CONF_DIR / group / f"{option}.yaml"
            is_global = path.read_text(encoding="utf-8").startswith("# @package _global_")
            config_file = read_config_file(path, "" if is_global else group)
            lines += [f"### `{group}={option}` (`conf/{group}/{option}.yaml`)", ""]
            if config_file.description:
                lines += [" ".join(config_file.description), ""]
            lines += [*_table(config_file, types, comments), ""]
    return "\n".join(line.rstrip() for line in lines).rstrip() + "\n"


def main() -> None:
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(Path.cwd()) if PAGE.is_relative_to(Path.cwd()) else PAGE}", file=sys.stderr)


if __name__ == "__main__":
    main()
