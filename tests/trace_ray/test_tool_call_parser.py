import json

from hypothesis import given, settings
from hypothesis import strategies as st

from trace_ray.agent_prompt import render_tool_call
from trace_ray.tool_call_parser import parse_assistant_text


def calls(message):
    return [(call["function"]["name"], call["function"]["arguments"]) for call in message.get("tool_calls", [])]


def test_native_tagged_call():
    message = parse_assistant_text('<tool_call>{"name": "set_wifi_status", "arguments": {"on": true}}</tool_call>')
    assert calls(message) == [("set_wifi_status", '{"on": true}')]
    assert message["content"] is None
    assert message["role"] == "assistant"


def test_several_calls_text_around_and_unclosed_last():
    text = (
        'Let me check.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"x": 1}}'
    )
    message = parse_assistant_text(text, turn=3)
    assert calls(message) == [("a", "{}"), ("b", '{"x": 1}')]
    assert message["content"] == "Let me check."
    assert [call["id"] for call in message["tool_calls"]] == ["call_3_0", "call_3_1"]


def test_lenient_fallbacks():
    fenced = parse_assistant_text('Sure:\n```json\n{"name": "get_wifi_status", "arguments": {}}\n```')
    assert calls(fenced) == [("get_wifi_status", "{}")]
    assert fenced["content"] == "Sure:"
    bare = parse_assistant_text(' {"name": "search_contacts", "parameters": {"name": "Ann"}}')
    assert calls(bare) == [("search_contacts", '{"name": "Ann"}')]
    listed = parse_assistant_text('[{"name": "a", "arguments": {}}, {"function": {"name": "b", "arguments": "{}"}}]')
    assert calls(listed) == [("a", "{}"), ("b", "{}")]


def test_arguments_given_as_json_string_are_kept_verbatim():
    message = parse_assistant_text('<tool_call>{"name": "f", "arguments": "{\\"on\\": false}"}</tool_call>')
    assert calls(message) == [("f", '{"on": false}')]


def test_malformed_call_becomes_nameless_call_not_exception():
    message = parse_assistant_text("<tool_call>{name: set_wifi_status, on}</tool_call>")
    assert calls(message) == [("", "{name: set_wifi_status, on}")]


def test_plain_text_and_json_without_name_stay_text():
    assert parse_assistant_text("Wifi is now on.") == {"role": "assistant", "content": "Wifi is now on."}
    assert "tool_calls" not in parse_assistant_text('{"answer": 42}')
    assert parse_assistant_text("") == {"role": "assistant", "content": ""}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(names, st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=4))
def test_rendered_call_parses_back(name, arguments):
    message = parse_assistant_text(render_tool_call(name, arguments))
    assert [
        (call["function"]["name"], json.loads(call["function"]["arguments"])) for call in message["tool_calls"]
    ] == [(name, arguments)]


adversarial = st.lists(
    st.sampled_from(
        [
            "<tool_call>",
            "</tool_call>",
            "{",
            "}",
            "[",
            "]",
            '"name"',
            ":",
            '"arguments"',
            ",",
            "```",
            "```json",
            '"x"',
            "null",
            "1e999",
            "\\",
            "\n",
            " ",
            "tool",
            "\u2028",
            "\x00",
        ]
    )
    | st.text(max_size=4),
    max_size=30,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(adversarial)
def test_fuzz_never_raises_and_output_is_well_formed(text):
    message = parse_assistant_text(text)
    assert message["role"] == "assistant"
    assert message["content"] is None or isinstance(message["content"], str)
    for call in message.get("tool_calls", []):
        assert isinstance(call["function"]["name"], str)
        assert isinstance(call["function"]["arguments"], str)
        assert call["type"] == "function"
    if message["content"] is None:
        assert message["tool_calls"]
