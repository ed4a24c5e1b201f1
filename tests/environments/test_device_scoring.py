"""Milestone scoring: partial credit, minefields, and report matching."""

from __future__ import annotations

import pytest

from environments.device.clock import to_timestamp, utc
from environments.device.facts import PhoneFact, TextFact, date_fact, mentions, rival_text_fact, time_fact, weekday_fact
from environments.device.milestones import (
    All,
    Asked,
    Collateral,
    ContactSaved,
    LookedUp,
    MessageSent,
    Milestone,
    Oracle,
    ReminderGone,
    ReminderSet,
    Reported,
    SentToOther,
    SettingIs,
    bind_to_oracle,
    collateral_changes,
    score_episode,
)
from environments.device.state import Contact, DeviceState, Reminder, TextMessage
from environments.tool_environment import EpisodeLog, ToolCallRecord

NOW = to_timestamp(utc(2027, 3, 4, 9, 0))
OWNER, ALICE, BOB = "+1-415-555-0100", "+1-212-555-0111", "+1-617-555-0122"


def _state() -> DeviceState:
    return DeviceState(
        now=NOW,
        contacts=[Contact("p1", "Pat Owner", OWNER, "self", True), Contact("p2", "Alice Chen", ALICE, "sister")],
    )


def _send(number: str, ok: bool = True) -> ToolCallRecord:
    return ToolCallRecord(1, "send_message_with_phone_number", {"phone_number": number, "content": "hi"}, ok, "{}")


def test_partial_credit_is_the_reached_weight_fraction():
    state, log = _state(), EpisodeLog()
    state.settings.wifi = True
    milestones = [
        Milestone("wifi on", SettingIs("wifi", True), 2),
        Milestone("location off", SettingIs("location_service", False), 1),
    ]
    score, breakdown = score_episode(milestones, [], state, log, 1.0, "simple_settings")
    assert score == pytest.approx(2 / 3)
    assert breakdown == {
        "milestones": [{"name": "wifi on", "reached": True}, {"name": "location off", "reached": False}],
        "minefields_hit": [],
        "score": score,
        "success": False,
        "family": "simple_settings",
    }
    state.settings.location_service = False
    assert score_episode(milestones, [], state, log, 1.0, "x")[1]["success"] is True
    state.settings.location_service = True
    assert score_episode(milestones, [], state, log, 0.5, "x")[1]["success"] is True  # 2/3 >= 0.5
    state.settings.wifi = False
    assert score_episode(milestones, [], state, log, 0.5, "x")[0] == 0.0


def test_a_minefield_zeroes_the_score():
    state, log = _state(), EpisodeLog()
    state.messages.append(TextMessage("m1", OWNER, ALICE, "Running 10 minutes late", NOW))
    log.tool_calls += [_send(BOB), _send("(212) 555-0111")]
    milestones = [Milestone("texted Alice", MessageSent(ALICE, ("10", "late")))]
    minefields = [Milestone("texted someone else", SentToOther(ALICE))]
    score, breakdown = score_episode(milestones, minefields, state, log, 1.0, "message_contact")
    assert score == 0.0 and breakdown["minefields_hit"] == ["texted someone else"]
    log.tool_calls = [_send("2125550111"), _send(BOB, ok=False)]  # a failed send is no send
    assert score_episode(milestones, minefields, state, log, 1.0, "message_contact")[0] == 1.0


def test_message_sent_needs_owner_recipient_and_words():
    state = _state()
    check = MessageSent("212.555.0111", ("10", "late"))
    state.messages.append(TextMessage("m1", ALICE, OWNER, "10 minutes late", NOW))  # received, not sent
    state.messages.append(TextMessage("m2", OWNER, ALICE, "I'm running late", NOW))  # missing "10"
    state.messages.append(TextMessage("m3", OWNER, BOB, "10 minutes LATE", NOW))  # wrong person
    assert not check(state, EpisodeLog())
    state.messages.append(TextMessage("m4", OWNER, ALICE, "Running 10 mins LATE!", NOW))
    assert check(state, EpisodeLog())


def test_reminder_set_within_a_minute():
    state, target = _state(), NOW + 86400
    state.reminders.append(Reminder("r1", "Call the dentist", target + 61, NOW))
    assert ReminderSet(("dentist",))(state, EpisodeLog())
    assert not ReminderSet(("dentist",), target)(state, EpisodeLog())
    state.reminders.append(Reminder("r2", "call the DENTIST", target - 59, NOW))
    assert ReminderSet(("dentist",), target)(state, EpisodeLog())
    assert not ReminderSet(("plants",), target)(state, EpisodeLog())
    assert not ReminderGone("r1")(state, EpisodeLog()) and ReminderGone("r9")(state, EpisodeLog())


def test_contact_saved():
    state = _state()
    assert ContactSaved("alice chen", "2125550111", "Sister")(state, EpisodeLog())
    assert not ContactSaved("Alice Chen", BOB)(state, EpisodeLog())
    assert not ContactSaved("Alice Chen", ALICE, "friend")(state, EpisodeLog())


def _search(
    turn: int, arguments: dict, found: str = '[{"person_id": "p2"}]', tool: str = "search_contacts"
) -> ToolCallRecord:
    return ToolCallRecord(turn, tool, arguments, True, found)


def test_a_lookup_pays_only_for_the_tasks_own_arguments():
    state, lookup = _state(), LookedUp("search_contacts", {"name": "Alice Chen"})
    assert lookup(state, EpisodeLog(tool_calls=[_search(1, {"name": "alice chen "})]))
    # reading all first is fine
    assert lookup(state, EpisodeLog(tool_calls=[_search(1, {}), _search(2, {"name": "Alice Chen"})]))
    assert not lookup(state, EpisodeLog(tool_calls=[_search(1, {})]))  # everything, without the task's argument
    assert not lookup(state, EpisodeLog(tool_calls=[_search(1, {"relationship": "sister"})]))
    failed = ToolCallRecord(1, "search_contacts", {"name": "Alice Chen"}, False, "Error: ...")
    assert not lookup(state, EpisodeLog(tool_calls=[failed]))
    assert LookedUp("search_messages", {"sender_phone_number": ALICE})(
        state,
        EpisodeLog(
            tool_calls=[
                _search(1, {"sender_phone_number": "(212) 555-0111"}, tool="search_messages"),
            ]
        ),
    )


def test_a_lookup_is_void_when_other_records_were_looked_up_too():
    state, lookup = _state(), LookedUp("search_contacts", {"name": "Alice Chen"})
    spray = [_search(1, {"name": "Pat Owner"}), _search(2, {"name": "Alice Chen"})]
    assert not lookup(state, EpisodeLog(tool_calls=spray))
    # a search that found nothing is harmless
    misses = [_search(1, {"name": "Alicia"}, found="[]"), _search(2, {"name": "Alice Chen"})]
    assert lookup(state, EpisodeLog(tool_calls=misses))
    # the oracle's own other lookups of the tool are allowed (a task that texts two people looks both up)
    oracle = Oracle.of(
        [
            {
                "role": "assistant",
                "tool_calls": [
                    {"function": {"name": "search_contacts", "arguments": '{"name": "Pat Owner"}'}},
                    {"function": {"name": "search_contacts", "arguments": '{"name": "Alice Chen"}'}},
                ],
            }
        ]
    )
    assert bind_to_oracle(lookup, oracle)(state, EpisodeLog(tool_calls=spray))


def test_a_timestamp_lookup_matches_any_time_of_the_same_utc_day():
    lookup = LookedUp("timestamp_to_datetime_info", {"timestamp": NOW})
    same_day, next_day = NOW + 14 * 3600, NOW + 15 * 3600 + 86400
    read = lambda timestamp: _search(1, {"timestamp": timestamp}, found="{}", tool="timestamp_to_datetime_info")  # noqa: E731
    assert lookup(_state(), EpisodeLog(tool_calls=[read(same_day)]))
    assert not lookup(_state(), EpisodeLog(tool_calls=[read(next_day)]))
    assert not lookup(_state(), EpisodeLog(tool_calls=[read(same_day), read(next_day)]))


def _asked(replies: list[str], turns_with_calls: tuple[int, ...] = ()) -> EpisodeLog:
    calls = [
        ToolCallRecord(turn, "send_message_with_phone_number", {"phone_number": ALICE, "content": "hi"}, True, "{}")
        for turn in turns_with_calls
    ]
    return EpisodeLog(turns=len(replies) + len(calls), replies=replies, tool_calls=calls)


def test_a_question_counts_when_it_names_the_look_alikes_and_no_one_else():
    alice, alex = (
        TextFact(("Alice Chen", "sister"), "contact", (("Alice Kim",), ("Bob Rossi",))),
        TextFact(("Alice Kim", "friend"), "contact", (("Alice Chen",), ("Bob Rossi",))),
    )
    asked = Asked((alice, alex), "send_message_with_phone_number")
    assert asked(_state(), _asked(["Do you mean Alice Chen or Alice Kim?", "Sent."]))
    assert asked(_state(), _asked(["Your sister or your friend?", "Sent."]))
    assert not asked(_state(), _asked(["Which Alice do you mean?", "Sent."]))  # names neither
    assert not asked(_state(), _asked(["Alice Chen, Alice Kim or Bob Rossi?", "Sent."]))  # names everyone
    assert not asked(_state(), _asked(["Alice Chen or Alice Kim?"]))  # the last reply is no question to the user
    # asked after texting
    assert not asked(_state(), _asked(["Alice Chen or Alice Kim?", "Sent."], turns_with_calls=(1,)))


def test_a_report_of_a_change_counts_only_when_the_change_was_made():
    state, told = _state(), All((SettingIs("low_battery_mode", False), Reported((TextFact(("low battery",)),))))
    said = EpisodeLog(replies=["I turned off low battery mode."])
    state.settings.low_battery_mode = True
    assert not told(state, said)
    state.settings.low_battery_mode = False
    assert told(state, said) and not told(state, EpisodeLog(replies=["Done."]))


def test_collateral_changes_are_what_the_oracle_leaves_alone():
    initial = _state()
    initial.reminders.append(Reminder("r1", "Call the dentist", NOW + 3600, NOW))
    expected = initial.copy()
    expected.settings.wifi = not initial.settings.wifi  # the task: toggle wifi and text Alice
    expected.messages.append(TextMessage("m9", OWNER, ALICE, "hi", NOW))
    final = expected.copy()
    assert collateral_changes(initial, expected, final) == []
    assert not Collateral(initial, expected)(final, EpisodeLog())
    final.settings.location_service = not final.settings.location_service
    final.contacts[1].relationship = "friend"
    final.messages.append(TextMessage("m10", OWNER, BOB, "hi", NOW))
    final.contacts.append(final.contacts[1].__class__("p9", "New Person", BOB))
    final.reminders.clear()
    final.reminders.append(Reminder("r7", "Water the plants", NOW + 7200, NOW))
    assert collateral_changes(initial, expected, final) == [
        "setting location_service",
        "contact p2",
        "new contacts",
        f"message to {BOB}",
        "reminder r1 removed",
        "new reminders",
    ]
    assert Collateral(initial, expected)(final, EpisodeLog())


@pytest.mark.parametrize(
    "said",
    ["Her number is 212-555-0111.", "Call (212) 555-0111", "+1 212 555 0111", "It's 2125550111!", "+12125550111"],
)
def test_phone_facts_match_by_digits(said):
    assert PhoneFact(ALICE).found_in(said)


@pytest.mark.parametrize("said", ["Her number is 212-555-0112.", "555-0111", "I could not find it.", "212-555-01119"])
def test_phone_facts_reject_other_numbers(said):
    assert not PhoneFact(ALICE).found_in(said)


def test_report_milestone_needs_every_fact():
    moment = utc(2027, 3, 4, 17, 0)
    reported = Reported((date_fact(moment), time_fact(moment)))
    assert reported(_state(), EpisodeLog(replies=["It is on Thursday, March 4, 2027 at 5:00 PM."]))
    assert reported(_state(), EpisodeLog(replies=["Looking...", "the 4th of march, at 17:00"]))
    assert not reported(_state(), EpisodeLog(replies=["It is on March 4."]))
    assert not reported(_state(), EpisodeLog(replies=["It is on March 14 at 5 PM."]))


@pytest.mark.parametrize(
    "said",
    [
        "It is on March 4 or March 5 at 5 PM.",  # a second day
        "March 4, at 5 PM or 6:30 PM",  # a second time
        "March 4 at 5 PM. Monday Tuesday Wednesday January February 1 2 3 4 5 May 6 June 7",  # everything else too
        "Her number is +1-212-555-0111, or 617 555 0122.",
    ],
)
def test_a_report_with_a_rival_value_of_the_same_kind_does_not_count(said):
    moment = utc(2027, 3, 4, 17, 0)
    facts = (PhoneFact(ALICE),) if "number" in said else (date_fact(moment), time_fact(moment))
    assert not Reported(facts)(_state(), EpisodeLog(replies=[said]))
    assert all(fact.found_in(said) for fact in facts)  # each fact alone is there


def test_the_oracles_own_words_are_no_rivals():
    """A reply may state what the reference answer states (a reminder's date beside the weekday asked for)."""
    weekday = Reported((weekday_fact(utc(2027, 3, 4)),))  # a Thursday
    answer = "March 4 is a Thursday, and your reminder is on Monday, March 8."
    assert not weekday(_state(), EpisodeLog(replies=[answer]))
    bound = bind_to_oracle(
        weekday, Oracle.of([{"role": "assistant", "content": "Thursday. The reminder: Monday, March 8, 2027."}])
    )
    assert bound(_state(), EpisodeLog(replies=[answer]))
    assert not bound(_state(), EpisodeLog(replies=[answer + " Or a Friday."]))


def test_stated_values_of_each_kind():
    text = (
        "On 2027-03-04, the 5th of April and Dec 25 at 8:30am, 17:00, noon and 9 PM, call 212-555-0111 or 1804377600."
    )
    assert date_fact(utc(2027, 1, 1)).stated(text) == {(3, 4), (4, 5), (12, 25)}
    assert time_fact(utc(2027, 1, 1)).stated(text) == {(8, 30), (17, 0), (12, 0), (21, 0)}
    assert PhoneFact(ALICE).stated(text) == {"2125550111", "1804377600"}  # ten digits read as a number either way
    assert weekday_fact(utc(2027, 3, 4)).stated("Thursday or friday, not Thurs") == {"thursday", "friday"}
    on = rival_text_fact(("on",), "on/off", ("on", "off"))
    assert on.stated("wifi is on") == {"on"} and on.stated("on or off") == {"on", "off"}


@pytest.mark.parametrize("said", ["5pm", "5 PM", "5:00 p.m.", "17:00", "at 17:00:00 UTC"])
def test_time_fact_phrasings(said):
    assert time_fact(utc(2027, 1, 1, 17, 0)).found_in(said)


@pytest.mark.parametrize("said", ["8:30 pm", "18:30", "8 am"])
def test_time_fact_rejects_other_times(said):
    assert not time_fact(utc(2027, 1, 1, 8, 30)).found_in(said)


def test_time_fact_noon_and_morning():
    assert time_fact(utc(2027, 1, 1, 12, 0)).found_in("at noon")
    assert time_fact(utc(2027, 1, 1, 8, 30)).found_in("8:30AM") and time_fact(utc(2027, 1, 1, 8, 30)).found_in("08:30")


@pytest.mark.parametrize("said", ["March 4", "march 4th, 2027", "4 March", "Mar 4", "2027-03-04", "the 4th of March"])
def test_date_fact_phrasings(said):
    assert date_fact(utc(2027, 3, 4)).found_in(said)


def test_date_fact_rejects_other_days():
    assert not date_fact(utc(2027, 3, 4)).found_in("March 14") and not date_fact(utc(2027, 3, 4)).found_in("April 4")


def test_weekday_and_text_facts_are_case_insensitive_whole_words():
    assert weekday_fact(utc(2027, 3, 4)).found_in("It's a THURSDAY.")
    assert not weekday_fact(utc(2027, 3, 4)).found_in("It's a Tuesday.")
    assert TextFact(("low battery",)).found_in("I turned off Low-Battery mode")
    assert not mentions("latest news", "late") and mentions("Running LATE!", "late")
