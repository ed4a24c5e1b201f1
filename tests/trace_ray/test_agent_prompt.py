import copy

import pytest

from environments.errors import TraceRayError
from trace_ray.agent_prompt import AgentPrompt, render_tool_line, template_supports_tools

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_wifi_status",
            "description": "Turn wifi on or off.",
            "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_contacts",
            "description": "Find contacts.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "kind": {"enum": ["a", "b"]}},
                "required": [],
            },
        },
    },
]
EXAMPLE = [
    {"role": "user", "content": "Is wifi on?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "e0", "type": "function", "function": {"name": "get_wifi_status", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "e0", "name": "get_wifi_status", "content": "true"},
    {"role": "assistant", "content": "Yes, wifi is on."},
]
MESSAGES = [{"role": "system", "content": "You run a phone."}, {"role": "user", "content": "Turn wifi on."}]


def test_tool_lines_are_compact():
    assert render_tool_line(TOOLS[0]) == "- set_wifi_status(on: boolean): Turn wifi on or off."
    assert render_tool_line(TOOLS[1]) == '- search_contacts(name?: string, kind?: "a"|"b"): Find contacts.'


def test_text_rendering_puts_tools_in_system_then_example_then_task(tiny_model):
    _, tokenizer = tiny_model
    assert not template_supports_tools(tokenizer)
    chat = AgentPrompt(tokenizer).chat(MESSAGES, TOOLS, EXAMPLE)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert chat[0]["content"].startswith("You run a phone.\n\n# Tools\n- set_wifi_status(on: boolean)")
    assert '<tool_call>{"name": "tool_name"' in chat[0]["content"]
    assert chat[2]["content"] == '<tool_call>{"name": "get_wifi_status", "arguments": {}}</tool_call>'
    assert chat[-1] == MESSAGES[-1]
    without = AgentPrompt(tokenizer, show_example=False).chat(MESSAGES, TOOLS, EXAMPLE)
    assert [m["role"] for m in without] == ["system", "user"]


def test_a_chat_without_tools_has_no_tool_section(tiny_model):
    _, tokenizer = tiny_model
    chat = AgentPrompt(tokenizer, show_example=False).chat(MESSAGES, [], [])
    assert chat == MESSAGES  # the policy alone: no "# Tools" block, no tool-call format
    # and no empty system turn
    assert AgentPrompt(tokenizer, show_example=False).chat(MESSAGES[1:], [], []) == MESSAGES[1:]


def test_prompt_ends_with_generation_header_and_reply_round_trips(tiny_model):
    _, tokenizer = tiny_model
    prompt = AgentPrompt(tokenizer)
    ids = prompt.prompt_ids(MESSAGES, TOOLS, EXAMPLE)
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    reply = tokenizer.encode('<tool_call>{"name": "set_wifi_status", "arguments": {"on": true}}</tool_call><|im_end|>')
    message = prompt.parse(reply, turn=2)
    assert message["tool_calls"][0]["function"] == {"name": "set_wifi_status", "arguments": '{"on": true}'}
    assert message["tool_calls"][0]["id"] == "call_2_0"


def test_native_rendering_hands_tools_to_a_tool_aware_template(tiny_model):
    _, tokenizer = tiny_model
    template = (
        "{% for t in tools %}TOOL {{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor "
        "%}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tokenizer = with_template(tokenizer, template)
    prompt = AgentPrompt(tokenizer)
    assert prompt.native
    text = tokenizer.decode(prompt.prompt_ids(MESSAGES, TOOLS, EXAMPLE))
    assert text.startswith("TOOL set_wifi_status\nTOOL search_contacts\n<system>You run a phone.")
    assert "CALL get_wifi_status {}" in text  # arguments handed over as an object, not a JSON string
    assert text.endswith("<user>Turn wifi on.<assistant>")


# A chat template written for these tests that rewrites earlier turns the way Qwen3's does: an assistant turn
# before the last user message loses its <think> block, the last assistant turn always shows one, and
# consecutive tool results share one user turn.
THINKING_TEMPLATE = """
{%- if tools or messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif -%}
{%- for tool in tools or [] %}{{ '\nTOOL ' + tool.function.name }}{% endfor -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- set last = namespace(user=-1) -%}
{%- for m in messages %}{% if m.role == 'user' %}{% set last.user = loop.index0 %}{% endif %}{% endfor -%}
{%- for m in messages -%}
{%- set content = m.content or '' -%}
{%- if m.role == 'assistant' -%}
{%- set thought = '' -%}
{%- if '</think>' in content -%}
{%- set thought = content.split('</think>')[0].split('<think>')[-1].strip('\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\n') -%}
{%- endif -%}
{{- '<|im_start|>assistant\n' -}}
{%- if loop.index0 > last.user and (loop.last or thought) %}{{ '<think>\n' + thought + '\n</think>\n\n' }}{% endif -%}
{{- content -}}
{%- for call in m.tool_calls or [] %}{{ '<tool_call>' + call.function.name + ' ' + call.function.arguments | tojson \
+ '</tool_call>' }}{% endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif -%}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif -%}
{%- elif not (m.role == 'system' and loop.first) -%}
{{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif -%}
"""


def with_template(tokenizer, template):
    """A copy of ``tokenizer`` with another chat template (the session's tokenizer stays as it is)."""
    copied = copy.deepcopy(tokenizer)
    copied.chat_template = template
    return copied


def test_the_test_template_rewrites_earlier_turns(tiny_model):
    tokenizer = with_template(tiny_model[1], THINKING_TEMPLATE)
    reply = {"role": "assistant", "content": "<think>\nWhich wifi?\n</think>\n\nWhich network?"}
    through_reply = tokenizer.apply_chat_template(MESSAGES + [reply], tokenize=False)
    extended = tokenizer.apply_chat_template(MESSAGES + [reply, {"role": "user", "content": "Home."}], tokenize=False)
    assert through_reply.endswith("<|im_start|>assistant\n<think>\nWhich wifi?\n</think>\n\nWhich network?<|im_end|>\n")
    assert extended.endswith("<|im_start|>assistant\nWhich network?<|im_end|>\n<|im_start|>user\nHome.<|im_end|>\n")
    assert not extended.startswith(through_reply)  # not append-only: the reasoning of the earlier turn is gone


@pytest.mark.parametrize("tool_format", ["native", "text"])
def test_continuation_renders_the_new_messages_under_a_template_that_rewrites_earlier_turns(tiny_model, tool_format):
    tokenizer = with_template(tiny_model[1], THINKING_TEMPLATE)
    prompt = AgentPrompt(tokenizer, tool_format=tool_format)
    sampled = tokenizer.encode("<think>\nWhich wifi?\n</think>\n\nWhich network?") + [tokenizer.eos_token_id]
    user_reply = [{"role": "user", "content": "Home."}]
    assert tokenizer.decode(prompt.continuation_ids(user_reply, TOOLS, sampled)) == (
        # the model wrote <|im_end|>; "\n" closes its turn
        "\n<|im_start|>user\nHome.<|im_end|>\n<|im_start|>assistant\n"
    )
    results = [
        {"role": "tool", "tool_call_id": "c0", "content": "true"},
        {"role": "tool", "tool_call_id": "c1", "content": "[]"},
    ]
    # cut off before its end of turn
    assert tokenizer.decode(prompt.continuation_ids(results, TOOLS, sampled[:-1])) == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\ntrue\n</tool_response>\n<tool_response>\n[]\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_template_that_rewrites_the_conversation_head_still_extends(tiny_model):
    tokenizer = with_template(
        tiny_model[1], "TURNS {{ messages|length }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    prompt = AgentPrompt(tokenizer, show_example=False)
    continuation = prompt.continuation_ids([{"role": "user", "content": "Thanks"}], TOOLS, tokenizer.encode("Sure."))
    # the head's count changes every turn; the record never re-renders it
    assert tokenizer.decode(continuation) == "<user>Thanks"


def test_a_template_that_ends_assistant_turns_differently_when_messages_follow_is_refused(tiny_model):
    template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if loop.last %}<end>{% else %}<next>{% endif "
        "%}{% endfor %}"
    )
    prompt = AgentPrompt(with_template(tiny_model[1], template), show_example=False)
    with pytest.raises(
        TraceRayError, match="does not keep an assistant turn's text followed by '<end>' when messages follow it"
    ):
        prompt.continuation_ids([{"role": "user", "content": "Thanks"}], TOOLS, [1, 2])
