"""Milestone scoring: partial credit, minefields, and report matching."""

from __future__ import annotations

import pytest

from environments.device.clock import to_timestamp, utc
from environments.device.milestones import (
    AskedUser, ContactSaved, MessageSent, Milestone, PhoneFact, ReminderGone, ReminderSet, Reported,
    SentToOther, SettingIs, TextFact, ToolCalled, date_fact, mentions, score_episode, time_fact, weekday_fact,
)
from environments.device.state import Contact, DeviceState, Reminder, TextMessage
from environments.tool_environment import EpisodeLog, ToolCallRecord

NOW = to_timestamp(utc(2027, 3, 4, 9, 0))
OWNER, ALICE, BOB = "+1-415-555-0100", "+1-212-555-0111", "+1-617-555-0122"


def _state() -> DeviceState:
    return DeviceState(now=NOW, contacts=[Contact("p1", "Pat Owner", OWNER, "self", True), Contact("p2", "Alice Chen", ALICE, "sister")])


def _send(number: str, ok: bool = True) -> ToolCallRecord:
    return ToolCallRecord(1, "send_message_with_phone_number", {"phone_number": number, "content": "hi"}, ok, "{}")


def test_partial_credit_is_the_reached_weight_fraction():
    state, log = _state(), EpisodeLog()
    state.settings.wifi = True
    milestones = [Milestone("wifi on", SettingIs("wifi", True), 2), Milestone("location off", SettingIs("location_service", False), 1)]
    score, breakdown = score_episode(milestones, [], state, log, 1.0, "simple_settings")
    assert score == pytest.approx(2 / 3)
    assert breakdown == {
        "milestones": [{"name": "wifi on", "reached": True}, {"name": "location off", "reached": False}],
        "minefields_hit": [], "score": score, "success": False, "family": "simple_settings",
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


def test_tool_called_matches_an_argument_subset_of_successful_calls():
    log = EpisodeLog(tool_calls=[
        ToolCallRecord(1, "search_contacts", {"name": "alice "}, True, "[]"),
        ToolCallRecord(2, "search_messages", {"sender_phone_number": "(212) 555-0111"}, True, "[]"),
        ToolCallRecord(3, "set_wifi_status", {"on": True}, False, "Error: ..."),
    ])
    state = _state()
    assert ToolCalled("search_contacts")(state, log)
    assert ToolCalled("search_contacts", {"name": "Alice"})(state, log)
    assert not ToolCalled("search_contacts", {"relationship": "sister"})(state, log)
    assert ToolCalled("search_messages", {"sender_phone_number": ALICE})(state, log)
    assert not ToolCalled("set_wifi_status")(state, log)


def test_asked_user_needs_a_question_before_the_last_reply():
    assert not AskedUser()(_state(), EpisodeLog(replies=["Which Alex?"]))
    assert not AskedUser()(_state(), EpisodeLog(replies=["I'll check.", "Done."]))
    assert AskedUser()(_state(), EpisodeLog(replies=["Which Alex do you mean?", "Sent."]))


@pytest.mark.parametrize("said", ["Her number is 212-555-0111.", "Call (212) 555-0111", "+1 212 555 0111", "It's 2125550111!", "+12125550111"])
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
