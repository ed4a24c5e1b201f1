"""Every device tool: its happy path and each of its error paths, and the datetime arithmetic."""

from __future__ import annotations

import pytest

from environments.device.clock import to_datetime, to_timestamp, utc
from environments.device.phone_numbers import canonical_phone, national_digits
from environments.device.state import Contact, DeviceState, Reminder, Settings, TextMessage
from environments.device.tools import NO_SERVICE_ERROR, PERMISSION_ERROR, DeviceTools
from environments.tool_environment import ToolError

NOW = to_timestamp(utc(2026, 12, 31, 22, 30))
OWNER, ALICE, BOB = "+1-415-555-0100", "+1-212-555-0111", "+1-617-555-0122"


@pytest.fixture
def device() -> DeviceState:
    return DeviceState(
        now=NOW,
        settings=Settings(wifi=False, cellular_service=True, low_battery_mode=False, location_service=False),
        contacts=[
            Contact("p1", "Pat Owner", OWNER, "self", is_self=True),
            Contact("p2", "Alice Chen", ALICE, "sister"),
            Contact("p3", "Bob Alvarez", BOB, "coworker"),
        ],
        messages=[
            TextMessage("m4", ALICE, OWNER, "Dinner at 7?", NOW - 600),
            TextMessage("m5", OWNER, ALICE, "Sure, see you there", NOW - 300),
            TextMessage("m6", BOB, OWNER, "Meeting moved to 3pm", NOW - 900),
        ],
        reminders=[Reminder("r7", "Water the plants", NOW + 3600, NOW - 86400)],
        issued_ids=7,
    )


@pytest.fixture
def tools(device: DeviceState) -> dict:
    return {tool.name: tool.fn for tool in DeviceTools(device).tools()}


def test_tool_list_and_schemas(tools):
    assert set(tools) == {
        "get_current_timestamp",
        "timestamp_to_datetime_info",
        "datetime_info_to_timestamp",
        "shift_timestamp",
        "get_wifi_status",
        "set_wifi_status",
        "get_cellular_service_status",
        "set_cellular_service_status",
        "get_low_battery_mode_status",
        "set_low_battery_mode_status",
        "get_location_service_status",
        "set_location_service_status",
        "search_contacts",
        "add_contact",
        "modify_contact",
        "send_message_with_phone_number",
        "search_messages",
        "add_reminder",
        "search_reminder",
        "remove_reminder",
    }
    for tool in DeviceTools(DeviceState(now=0)).tools():
        assert len(tool.description) <= 90
        assert tool.schema["function"]["parameters"]["type"] == "object"


# -- phone numbers ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "typed", ["+1-415-555-0123", "4155550123", "(415) 555-0123", "415 555 0123", "1 415 555 0123", "415.555.0123"]
)
def test_phone_variants_share_one_canonical_form(typed):
    assert canonical_phone(typed) == "+1-415-555-0123"


@pytest.mark.parametrize("typed", ["555-0123", "415-555-01234", "call 4155550123", "+44 20 7946 0958", ""])
def test_malformed_phone_numbers(typed):
    assert national_digits(typed) is None
    with pytest.raises(ValueError, match="invalid phone number"):
        canonical_phone(typed)


# -- clock -------------------------------------------------------------------------------------
def test_current_timestamp(tools):
    assert tools["get_current_timestamp"]() == NOW


def test_timestamp_to_datetime_info(tools):
    assert tools["timestamp_to_datetime_info"](NOW) == {
        "year": 2026,
        "month": 12,
        "day": 31,
        "hour": 22,
        "minute": 30,
        "second": 0,
        "weekday": "Thursday",
    }
    assert tools["timestamp_to_datetime_info"](0)["weekday"] == "Thursday"  # 1970-01-01


@pytest.mark.parametrize("timestamp", [10**12, -(10**12)])
def test_timestamp_out_of_range(tools, timestamp):
    with pytest.raises(ToolError, match="timestamp must be between"):
        tools["timestamp_to_datetime_info"](timestamp)


def test_datetime_info_to_timestamp(tools):
    assert tools["datetime_info_to_timestamp"](2028, 2, 29, 8, 30) == to_timestamp(utc(2028, 2, 29, 8, 30))
    assert tools["datetime_info_to_timestamp"](1970, 1, 1) == 0
    assert tools["datetime_info_to_timestamp"](2026, 3, 1, 0, 0, 59) == to_timestamp(utc(2026, 3, 1)) + 59


@pytest.mark.parametrize(
    "fields",
    [
        (2026, 2, 30),
        (2027, 2, 29),
        (2026, 13, 1),
        (2026, 0, 10),
        (2026, 4, 31),
        (2026, 1, 1, 24),
        (2026, 1, 1, 10, 60),
        (0, 1, 1),
    ],
)
def test_invalid_dates_are_rejected(tools, fields):
    with pytest.raises(ToolError, match="invalid date or time"):
        tools["datetime_info_to_timestamp"](*fields)


@pytest.mark.parametrize(
    "start, shift, expected",
    [
        (utc(2028, 2, 28, 23, 30), {"hours": 1}, utc(2028, 2, 29, 0, 30)),  # leap day
        (utc(2027, 2, 28, 23, 30), {"hours": 1}, utc(2027, 3, 1, 0, 30)),  # no leap day
        (utc(2026, 12, 31, 18, 0), {"days": 1}, utc(2027, 1, 1, 18, 0)),  # year boundary
        (utc(2026, 1, 31, 9, 0), {"weeks": 1, "minutes": 15}, utc(2026, 2, 7, 9, 15)),  # month boundary
        (utc(2027, 1, 1, 0, 0), {"seconds": -1}, utc(2026, 12, 31, 23, 59, 59)),  # backwards over a year
        (utc(2028, 3, 1, 12, 0), {"days": -1}, utc(2028, 2, 29, 12, 0)),
    ],
)
def test_shift_timestamp_across_boundaries(tools, start, shift, expected):
    assert tools["shift_timestamp"](to_timestamp(start), **shift) == to_timestamp(expected)


def test_shift_timestamp_defaults_to_no_shift(tools):
    assert tools["shift_timestamp"](NOW) == NOW


def test_shift_timestamp_out_of_range(tools):
    with pytest.raises(ToolError, match="timestamp must be between"):
        tools["shift_timestamp"](NOW, weeks=10**9)


def test_to_datetime_round_trip():
    moment = utc(2028, 2, 29, 23, 59, 59)
    assert to_datetime(to_timestamp(moment)) == moment


# -- settings ------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting", ["wifi", "cellular_service", "low_battery_mode", "location_service"])
def test_settings_toggle(tools, device, setting):
    tools[f"set_{setting}_status"](True)
    assert tools[f"get_{setting}_status"]() is True
    assert getattr(device.settings, setting) is True
    assert "off" in tools[f"set_{setting}_status"](False)
    assert tools[f"get_{setting}_status"]() is False


@pytest.mark.parametrize("setting", ["wifi", "cellular_service"])
def test_low_battery_mode_blocks_turning_on_radios(tools, device, setting):
    device.settings.low_battery_mode = True
    device.settings.cellular_service = False
    with pytest.raises(ToolError) as error:
        tools[f"set_{setting}_status"](True)
    assert str(error.value) == PERMISSION_ERROR
    assert getattr(device.settings, setting) is False
    tools[f"set_{setting}_status"](False)  # turning off stays allowed
    tools["set_low_battery_mode_status"](False)
    tools[f"set_{setting}_status"](True)
    assert getattr(device.settings, setting) is True


def test_low_battery_mode_does_not_block_location(tools, device):
    device.settings.low_battery_mode = True
    tools["set_location_service_status"](True)
    assert device.settings.location_service is True


# -- contacts ---------------------------------------------------------------------------------
def test_search_contacts(tools):
    assert [c["person_id"] for c in tools["search_contacts"](name="alice")] == ["p2"]
    assert [c["person_id"] for c in tools["search_contacts"](name="AL")] == ["p2", "p3"]
    assert [c["person_id"] for c in tools["search_contacts"](phone_number="(212) 555-0111")] == ["p2"]
    assert [c["person_id"] for c in tools["search_contacts"](relationship="Sister")] == ["p2"]
    assert tools["search_contacts"](relationship="self")[0]["is_self"] is True
    assert tools["search_contacts"](name="alice", relationship="coworker") == []
    assert len(tools["search_contacts"]()) == 3


def test_search_contacts_malformed_number(tools):
    with pytest.raises(ToolError, match="invalid phone number"):
        tools["search_contacts"](phone_number="12345")


def test_add_contact(tools, device):
    added = tools["add_contact"]("Dana Scott", "303 555 0144", "friend")
    assert added == {
        "person_id": "p8",
        "name": "Dana Scott",
        "phone_number": "+1-303-555-0144",
        "relationship": "friend",
        "is_self": False,
    }
    assert device.contacts[-1].phone_number == "+1-303-555-0144"


@pytest.mark.parametrize(
    "arguments, error",
    [
        (("Dana Scott", "555-0144"), "invalid phone number"),
        (("Dana Scott", "2125550111"), "already exists"),
        (("  ", "303-555-0144"), "name must not be empty"),
    ],
)
def test_add_contact_errors(tools, device, arguments, error):
    with pytest.raises(ToolError, match=error):
        tools["add_contact"](*arguments)
    assert len(device.contacts) == 3


def test_modify_contact(tools, device):
    changed = tools["modify_contact"]("p3", phone_number="6175550199", relationship="boss")
    assert changed["phone_number"] == "+1-617-555-0199" and changed["relationship"] == "boss"
    assert tools["modify_contact"]("p3", name="Robert Alvarez")["name"] == "Robert Alvarez"
    # its own number
    assert tools["modify_contact"]("p3", phone_number="617-555-0199")["phone_number"] == "+1-617-555-0199"


@pytest.mark.parametrize(
    "arguments, error",
    [
        ({"person_id": "p99", "name": "X"}, "no contact with person_id 'p99'"),
        ({"person_id": "p3"}, "at least one of"),
        ({"person_id": "p3", "phone_number": "12"}, "invalid phone number"),
        ({"person_id": "p3", "phone_number": ALICE}, "already exists"),
        ({"person_id": "p3", "name": ""}, "name must not be empty"),
    ],
)
def test_modify_contact_errors(tools, device, arguments, error):
    with pytest.raises(ToolError, match=error):
        tools["modify_contact"](**arguments)
    assert device.contacts[2] == Contact("p3", "Bob Alvarez", BOB, "coworker")


# -- messages ----------------------------------------------------------------------------------
def test_send_message(tools, device):
    assert tools["send_message_with_phone_number"]("(617) 555-0122", "Running late") == {"message_id": "m8"}
    sent = device.messages[-1]
    assert (sent.sender_phone_number, sent.recipient_phone_number, sent.content, sent.creation_timestamp) == (
        OWNER,
        BOB,
        "Running late",
        NOW,
    )


def test_send_message_without_cellular_service(tools, device):
    device.settings.cellular_service = False
    with pytest.raises(ToolError) as error:
        tools["send_message_with_phone_number"](BOB, "hi")
    assert str(error.value) == NO_SERVICE_ERROR
    assert len(device.messages) == 3


@pytest.mark.parametrize(
    "arguments, error", [((BOB, "   "), "content must not be empty"), (("0122", "hi"), "invalid phone number")]
)
def test_send_message_errors(tools, arguments, error):
    with pytest.raises(ToolError, match=error):
        tools["send_message_with_phone_number"](*arguments)


def test_search_messages(tools):
    assert [m["message_id"] for m in tools["search_messages"]()] == ["m6", "m4", "m5"]  # oldest first
    assert [m["message_id"] for m in tools["search_messages"](sender_phone_number="2125550111")] == ["m4"]
    assert [m["message_id"] for m in tools["search_messages"](recipient_phone_number=OWNER)] == ["m6", "m4"]
    assert [m["message_id"] for m in tools["search_messages"](content="MEETING")] == ["m6"]
    assert tools["search_messages"](sender_phone_number=BOB, content="dinner") == []


@pytest.mark.parametrize("field", ["sender_phone_number", "recipient_phone_number"])
def test_search_messages_malformed_number(tools, field):
    with pytest.raises(ToolError, match="invalid phone number"):
        tools["search_messages"](**{field: "abc"})


# -- reminders ------------------------------------------------------------------------------
def test_add_and_search_reminders(tools, device):
    assert tools["add_reminder"]("Call the dentist", NOW + 60) == {"reminder_id": "r8"}
    assert device.reminders[-1] == Reminder("r8", "Call the dentist", NOW + 60, NOW)
    assert [r["reminder_id"] for r in tools["search_reminder"]()] == ["r8", "r7"]  # soonest first
    assert [r["reminder_id"] for r in tools["search_reminder"](content="PLANTS")] == ["r7"]
    assert tools["search_reminder"](content="gym") == []


@pytest.mark.parametrize(
    "arguments, error",
    [
        (("Call", NOW), "in the past"),
        (("Call", NOW - 3600), "in the past"),
        (("", NOW + 60), "content must not be empty"),
        (("Call", 10**13), "timestamp must be between"),
    ],
)
def test_add_reminder_errors(tools, device, arguments, error):
    with pytest.raises(ToolError, match=error):
        tools["add_reminder"](*arguments)
    assert len(device.reminders) == 1


def test_remove_reminder(tools, device):
    assert "r7" in tools["remove_reminder"]("r7")
    assert device.reminders == []
    with pytest.raises(ToolError, match="no reminder with reminder_id 'r7'"):
        tools["remove_reminder"]("r7")


def test_state_copy_is_independent(device):
    copied = device.copy()
    copied.contacts[1].name = "Changed"
    copied.settings.wifi = True
    assert device.contacts[1].name == "Alice Chen" and device.settings.wifi is False
