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
    {"role": "assistant", "content": None, "tool_calls": [{"id": "e0", "type": "function", "function": {"name": "get_wifi_status", "arguments": "{}"}}]},
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
    assert "<tool_call>{\"name\": \"tool_name\"" in chat[0]["content"]
    assert chat[2]["content"] == '<tool_call>{"name": "get_wifi_status", "arguments": {}}</tool_call>'
    assert chat[-1] == MESSAGES[-1]
    without = AgentPrompt(tokenizer, show_example=False).chat(MESSAGES, TOOLS, EXAMPLE)
    assert [m["role"] for m in without] == ["system", "user"]


def test_a_chat_without_tools_has_no_tool_section(tiny_model):
    _, tokenizer = tiny_model
    chat = AgentPrompt(tokenizer, show_example=False).chat(MESSAGES, [], [])
    assert chat == MESSAGES  # the policy alone: no "# Tools" block, no tool-call format
    assert AgentPrompt(tokenizer, show_example=False).chat(MESSAGES[1:], [], []) == MESSAGES[1:]  # and no empty system turn


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
        "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    original = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        prompt = AgentPrompt(tokenizer)
        assert prompt.native
        text = tokenizer.decode(prompt.prompt_ids(MESSAGES, TOOLS, EXAMPLE))
    finally:
        tokenizer.chat_template = original
    assert text.startswith("TOOL set_wifi_status\nTOOL search_contacts\n<system>You run a phone.")
    assert 'CALL get_wifi_status {}' in text  # arguments handed over as an object, not a JSON string
    assert text.endswith("<user>Turn wifi on.<assistant>")


def test_a_template_that_rewrites_earlier_turns_is_refused(tiny_model):
    import pytest

    from trace_ray.errors import TraceRayError

    _, tokenizer = tiny_model
    original = tokenizer.chat_template
    tokenizer.chat_template = "TURNS {{ messages|length }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    try:
        prompt = AgentPrompt(tokenizer, show_example=False)
        messages = MESSAGES + [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Thanks"}]
        with pytest.raises(TraceRayError, match="not append-only.*use model.prompt.tool_format=text"):
            prompt.continuation_ids(messages, 1, TOOLS, [], tokenizer.encode("Sure."))
    finally:
        tokenizer.chat_template = original
