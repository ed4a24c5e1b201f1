"""Synthetic environments written by a generation model (``synthesis=llm``).

A model behind an OpenAI-compatible endpoint gets one capability (name,
description, failed trajectories that lack it), the target's tools and policy
and the environment protocol, and writes a Python module implementing a
training environment for that capability (the contract is in
``environments.synthetic.sandbox``). Each answer is saved as
``attempt_XX.py`` and admitted only when it passes the self-checks run in the
sandbox; otherwise its problems go back to the model, which answers with the
whole corrected module, up to ``max_attempts`` times. ``check_log.md`` records
every attempt; the admitted module is copied to ``module.py``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments import protocol, tool_environment
from environments.errors import TraceRayError
from environments.self_checks import run_self_checks
from environments.synthetic import sandbox
from environments.synthetic.sandbox import SandboxedEnvironment, SandboxError, SandboxLimits
from trace_ray.llm_client import LLMClient, one_line

Admit = Callable[[Path], list[str]]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = {"python", "py", "python3"}
# sections of the sandbox's docstring
CONTRACT_HEADING, SANDBOX_HEADING = "The generated module's contract", "\nThe sandbox\n"

SYSTEM_PROMPT = (
    "You write Python modules that implement verifiable training environments for LLM agents that use tools. "
    "Each environment trains one capability: every task needs it, and the reward says how well it was used. "
    "Reply with exactly one ```python code block holding the whole module."
)

REQUIREMENTS = """\
1. The module follows the contract: DIFFICULTIES (a non-empty tuple of ints, easy -> hard) and
   make_environment(difficulty, max_turns, max_tool_calls_per_turn, success_threshold) returning an object of the
   protocol (subclassing environments.tool_environment.ToolEnvironment is the easy way).
2. The environment's tools are the target's tools above (a subset is fine) with identical names and identical
   parameters schemas, so that what the agent learns transfers to the target.
3. Tasks come from a seeded generator (random.Random(seed); no global randomness, clock or I/O): the same seed gives
   the identical task (messages, tools, hidden state, task_fingerprint()); different seeds give different tasks.
   task_seeds("analysis") and task_seeds("eval") are fixed, disjoint lists of seeds; train_seed(index) gives seeds
   disjoint from both.
4. Every task needs the capability. When an episode ends, the reward is in [0, 1] with partial credit for partial
   progress, and info["success"] says whether it reached success_threshold. Every episode ends within max_turns.
5. oracle_message() is the next message of a policy that solves the current task: playing it reaches reward
   exactly 1.0 on every task.
6. A do-nothing agent (it replies "OK." at once), a wrong-action agent (the oracle's tool calls with every argument
   corrupted) and a random agent (random tools with random arguments) score clearly lower: below 1.0 on every
   task and at most 0.5 on average.
7. capability_turns() lists the current task's oracle turns (0-based) that exercise the capability: the oracle with
   those turns done wrong (the checks corrupt their arguments or empty the reply) scores
   below 1.0 on every task.
8. Harder DIFFICULTIES levels give harder tasks of the same capability (more steps, more distractors, longer inputs).
9. Results are plain JSON; only the standard library, environments.protocol and environments.tool_environment are
   imported; no network, no threads, no files outside the working directory."""


class SynthesisError(TraceRayError):
    """No generated module was admitted; the one-line message names the capability, the last problem and the fix."""


@dataclass
class GenerationRequest:
    capability: str
    description: str
    failed_examples: list[str]  # compacted trajectory texts
    target_tools: list[dict[str, Any]]  # OpenAI tool schemas of the target
    policy: str  # the target's system prompt
    target: str  # the target environment's name


def default_protocol_text() -> str:
    """What the model needs of this project: the module contract, the protocol and the ToolEnvironment base class."""

    def source(module: Any) -> str:
        return Path(module.__file__).read_text(encoding="utf-8")

    docstring = ast.get_docstring(ast.parse(source(sandbox))) or ""  # read from the source: survives python -OO
    section = docstring.split(SANDBOX_HEADING)[0]
    contract = section[section.find(CONTRACT_HEADING) :].strip()
    sources = [
        (path, source(module))
        for path, module in (
            ("environments/protocol.py", protocol),
            ("environments/tool_environment.py", tool_environment),
        )
    ]
    return contract + "".join(f"\n\n### {path}\n```python\n{text.strip()}\n```" for path, text in sources)


def generation_messages(request: GenerationRequest, protocol_text: str) -> list[dict[str, str]]:
    """The system and user messages that ask for the module."""
    tools = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in request.target_tools)
    examples = "\n\n".join(f"### Example {index}\n{text}" for index, text in enumerate(request.failed_examples, 1))
    user = f"""\
Write a synthetic training environment for the capability `{request.capability}` of an agent working in the target
environment `{request.target}`.

## The capability
{request.capability}: {request.description}

## Failed trajectories of the target that lack it
{examples or "(none given)"}

## The target's tools
Offer these tools (a subset is fine) with exactly these names and parameters:
```json
{tools}
```

## The target's policy (its system prompt)
{request.policy}

## The protocol and the module contract
{protocol_text}

## Requirements
{REQUIREMENTS}

Reply with ONE ```python code block holding the whole module."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def extract_module(answer: str) -> str:
    """The module's code: the first ```python block (else the first untagged block), or the whole answer if it has no
    fence and parses."""
    blocks = [(tag.lower(), code) for tag, code in _FENCE.findall(answer)]
    code = next((code for tag, code in blocks if tag in _PYTHON_TAGS), None)
    if code is None:
        code = next((code for tag, code in blocks if not tag), None)
    if code is None:
        if "```" in answer:
            opened = re.search(r"```[ \t]*(python|py|python3)?[ \t]*\n", answer, re.IGNORECASE)
            if opened and not blocks:
                raise ValueError(
                    "the answer's code block is not closed (cut off at the token limit? raise synthesis.max_tokens)"
                )
            raise ValueError("the answer has no ```python code block")
        if not answer.strip():
            raise ValueError("the answer is empty")
        if not _parses(answer):
            raise ValueError("the answer has no ```python code block and is not Python itself")
        code = answer
    if not code.strip():
        raise ValueError("the answer's ```python code block is empty")
    return code.strip("\n") + "\n"


def _write_log(path: Path, capability: str, sections: list[str]) -> None:
    text = f"# Synthesis of `{capability}`\n\n" + "\n".join(sections)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def synthesize_module(
    client: LLMClient,
    request: GenerationRequest,
    folder: Path,
    admit: Admit,
    max_attempts: int,
    seed: int,
    temperature: float,
    protocol_text: str,
) -> Path:
    """Ask for the module until ``admit`` finds no problem; the admitted ``folder/module.py``.

    The conversation keeps every answer and the feedback on it. A ``module.py``
    left from an earlier run is removed first, so it exists only when admitted.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / "module.py"
    final.unlink(missing_ok=True)
    log_path = folder / "check_log.md"
    messages = generation_messages(request, protocol_text)
    sections: list[str] = []
    problems: list[str] = []
    try:
        for attempt in range(1, max_attempts + 1):
            answer = client.chat(messages, seed=seed + attempt - 1, temperature=temperature)
            messages.append({"role": "assistant", "content": answer})
            path = folder / f"attempt_{attempt:02d}.py"
            try:
                code = extract_module(answer)
            except ValueError as exc:
                path = path.with_suffix(".txt")  # the raw answer, for reading
                path.write_text(answer, encoding="utf-8")
                problems = [f"no module in the answer: {exc}"]
            else:
                path.write_text(code, encoding="utf-8")
                problems = [one_line(problem, 400) for problem in admit(path)]
            if not problems:
                sections.append(f"## Attempt {attempt} (`{path.name}`)\n\nadmitted\n")
                temporary = folder / "module.py.tmp"
                shutil.copyfile(path, temporary)
                os.replace(temporary, final)
                return final
            listed = "\n".join(f"- {problem}" for problem in problems)
            sections.append(f"## Attempt {attempt} (`{path.name}`)\n\nrejected:\n{listed}\n")
            messages.append(
                {
                    "role": "user",
                    "content": (
                        f"Your module was rejected:\n{listed}\nFix it and reply with the whole corrected module."
                    ),
                }
            )
    finally:
        _write_log(log_path, request.capability, sections)
    raise SynthesisError(
        f"synthesis of capability {request.capability!r} failed: none of {max_attempts} generated module(s) passed the "
        "checks "
        f"(last problem: {one_line(problems[0], 200) if problems else 'none recorded'}; see {log_path}); "
        "use a stronger synthesis.model, raise synthesis.max_attempts, or write a template for it "
        "(synthesis=templates)"
    )


def sandbox_admission(
    target_tools: list[dict[str, Any]],
    seeds: list[int],
    limits: SandboxLimits,
    difficulty: int | None = None,
    env_options: dict[str, Any] | None = None,
) -> Admit:
    """``admit(path)``: the self-checks' failures of the module, run in sandboxes, as one-line problems (none:
    admitted).

    The checks run at ``difficulty`` (default: the middle of the module's
    ``DIFFICULTIES``, which the sandbox also checks is a non-empty tuple of ints).
    """

    def admit(path: Path) -> list[str]:
        sandboxes: list[SandboxedEnvironment] = []

        def make_env() -> SandboxedEnvironment:
            env = SandboxedEnvironment(path, difficulty, limits=limits, **(env_options or {}))
            sandboxes.append(env)
            return env

        try:
            results = run_self_checks(make_env, seeds, target_tools=target_tools)
        except SandboxError as exc:
            return [str(exc)]
        except Exception as exc:  # the checks tripped over the module's answers
            return [f"the self-checks failed on the module: {type(exc).__name__}: {one_line(str(exc))}"]
        finally:
            for env in sandboxes:
                env.close()
        return [f"{result.name}: {result.detail}" for result in results if not result.passed]

    return admit
