"""The prompt-injection baseline: the capability note reaches the system prompt and nothing else changes."""

from environments.device.environment import DeviceEnvironment
from trace_ray.evaluation.prompt_injection import NOTE_HEADER, capability_note, with_system_note

CAPABILITIES = [
    {"name": "datetime_reasoning", "description": "Works out dates and times relative to now."},
    {"name": "tool_calling_precision", "description": "Calls tools with exact arguments."},
]


def test_the_note_ends_the_system_message_and_the_episode_is_otherwise_the_same():
    note = capability_note(CAPABILITIES)
    assert note.splitlines() == [
        NOTE_HEADER,
        "- datetime reasoning: Works out dates and times relative to now.",
        "- tool calling precision: Calls tools with exact arguments.",
    ]
    plain, noted = DeviceEnvironment(), with_system_note(DeviceEnvironment, note)()
    seed = plain.task_seeds("eval")[0]
    before, after = plain.reset(seed), noted.reset(seed)
    assert after.messages[0]["content"] == before.messages[0]["content"].rstrip() + "\n\n" + note
    assert after.messages[1:] == before.messages[1:] and after.tools == before.tools
    assert noted.task_seeds("eval") == plain.task_seeds("eval")
    reply = {"role": "assistant", "content": "Done."}  # stepping and scoring go to the wrapped environment
    assert noted.step(reply) == plain.step(reply)
    assert plain.reset(seed).messages[0]["content"] == before.messages[0]["content"]  # the original is untouched
