import json

import pytest

from environments.tool_environment import Tool, ToolEnvironment, ToolError, check_arguments


class CounterEnvironment(ToolEnvironment):
    """A minimal tool environment: add to a counter, then report it."""

    def task_seeds(self, split):
        return [0, 1]

    def train_seed(self, index):
        return 100 + index

    def oracle_message(self):
        return {"role": "assistant", "content": f"The counter is {self.target}."}

    def task_fingerprint(self):
        return str(self.target)

    def start_episode(self, seed):
        self.counter, self.target = 0, seed + 2

        def add(amount, note=""):
            if amount < 0:
                raise ToolError("amount must be positive")
            self.counter += amount
            return {"counter": self.counter}

        tool = Tool(
            "add",
            "Add to the counter.",
            {
                "type": "object",
                "properties": {"amount": {"type": "integer"}, "note": {"type": "string", "enum": ["", "x"]}},
                "required": ["amount"],
            },
            add,
        )
        return (
            [{"role": "system", "content": "Count."}, {"role": "user", "content": f"Reach {self.target}."}],
            [tool],
            {},
        )

    def on_agent_reply(self, text):
        return [], True

    def score(self):
        reward = float(self.counter == self.target) * 0.5 + 0.5 * (str(self.target) in " ".join(self.log.replies))
        return reward, {"success": reward == 1.0}


def call(name, arguments):
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def turn(*calls):
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def test_happy_path_and_final_reward():
    env = CounterEnvironment()
    reset = env.reset(1)
    assert reset.tools[0]["function"]["name"] == "add"
    result = env.step(turn(call("add", {"amount": 3})))
    assert result.messages == [{"role": "tool", "tool_call_id": "call_1_0", "name": "add", "content": '{"counter": 3}'}]
    assert (result.reward, result.done, result.info["tool_errors"]) == (0.0, False, [])
    final = env.step({"role": "assistant", "content": "The counter is 3."})
    assert final.done and final.reward == 1.0 and final.info["termination"] == "agent_reply"


@pytest.mark.parametrize(
    "bad_call, error",
    [
        (call("nope", {}), "unknown tool 'nope'; available tools: add"),
        (call("", "garbage"), "malformed tool call"),
        (call("add", "{amount: 1"), "arguments are not valid JSON"),
        (call("add", "[1]"), "arguments must be a JSON object"),
        (call("add", {}), "missing required argument(s) amount"),
        (call("add", {"amount": 1, "extra": 2}), "unknown argument(s) extra"),
        (call("add", {"amount": "1"}), "argument amount must be of type integer"),
        (call("add", {"amount": True}), "argument amount must be of type integer"),
        (call("add", {"amount": 1, "note": "y"}), "argument note must be one of"),
        (call("add", {"amount": -1}), "amount must be positive"),
    ],
)
def test_every_bad_call_is_an_error_observation(bad_call, error):
    env = CounterEnvironment()
    env.reset(0)
    result = env.step(turn(bad_call))
    assert not result.done
    assert result.messages[0]["content"].startswith("Error: ") and error in result.messages[0]["content"]
    assert result.info["tool_errors"][0]["error"] == result.messages[0]["content"]
    assert env.log.tool_errors and env.counter == 0


def test_integral_float_counts_as_integer():
    assert check_arguments({"amount": 2.0}, {"properties": {"amount": {"type": "integer"}}}) is None
    assert check_arguments({"amount": 2.5}, {"properties": {"amount": {"type": "integer"}}}) is not None


def test_tool_calls_per_turn_are_limited():
    env = CounterEnvironment(max_tool_calls_per_turn=2)
    env.reset(0)
    result = env.step(turn(*[call("add", {"amount": 1})] * 3))
    assert [m["content"].startswith("Error: too many tool calls") for m in result.messages] == [False, False, True]
    assert env.counter == 2


def test_max_turns_ends_the_episode_with_its_score():
    env = CounterEnvironment(max_turns=2)
    env.reset(0)
    assert not env.step(turn(call("add", {"amount": 2}))).done
    result = env.step(turn(call("add", {"amount": 0})))
    assert result.done and result.info["termination"] == "max_turns" and result.reward == 0.5
    with pytest.raises(RuntimeError, match="call reset"):
        env.step({"role": "assistant", "content": "hi"})


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        CounterEnvironment(max_turns=0)
