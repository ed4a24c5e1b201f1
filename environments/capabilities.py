"""The capability catalogue: the names and descriptions of the capabilities environments give evidence for.

An environment's ``capability_detectors()`` and ``capability_evidence(seed)["needs"]`` name capabilities
of this catalogue; the rule-based labeler (``trace_ray.capabilities.rules``) has one detector per name, and
the synthetic environment templates train them under these descriptions.
"""

from __future__ import annotations

TOOL_USE_CAPABILITIES: dict[str, str] = {
    "permission_error_recovery": (
        "After a tool call is refused by the environment's state (a permission or no-service error), "
        "fix the blocking setting and retry the call."
    ),
    "datetime_reasoning": (
        "Turn relative or absolute dates and times into the right timestamp, and timestamps into the right date, "
        "time or weekday."
    ),
    "tool_calling_precision": (
        "Call the right tool with the argument values the user asked for (settings, names, numbers, message words)."
    ),
    "multi_step_task_completion": (
        "Carry out every action of a request that asks for several, instead of stopping after the first."
    ),
    "precondition_verification": (
        "Make the required checks (look up the contact or reminder, read the clock, ask which one) before changing "
        "state."
    ),
    "structured_data_reasoning": (
        "Pick the right record from tool results (the intended contact, reminder or newest message) and use its fields."
    ),
    "information_reporting": (
        "Tell the user the facts the task asks for and what had to be changed, correctly and in the final reply."
    ),
}

CODE_REPAIR_CAPABILITIES: dict[str, str] = {
    "code_localisation": "Find the code that causes the reported failure and read it before editing.",
    "failure_reproduction": "Run the tests that show the reported failure before changing the code.",
    "fix_verification": "Run the failing tests again after the last edit, before submitting.",
    "edit_precision": "Make edits that apply (a snippet that occurs once) and leave the file valid Python.",
    "minimal_change": "Fix the bug where it is: change only the faulty function.",
}

CAPABILITIES: dict[str, str] = {**TOOL_USE_CAPABILITIES, **CODE_REPAIR_CAPABILITIES}  # name -> description
