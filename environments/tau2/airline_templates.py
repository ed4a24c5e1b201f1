"""The τ²-bench airline templates: one builder per capability, and ``AIRLINE_TEMPLATES`` (capability -> template).

Each builder makes one airline task on a :class:`Tau2Draft` at a difficulty
and returns the user's request; the draft, the facts, :class:`Action` and the
confirmation helpers they use are the shared machinery of
``synthetic_templates.py``.
"""

from __future__ import annotations

from typing import Any

from environments.tau2.synthetic_data import BAG_FEE, CABINS, CITY_OF, FLIGHT_STATUSES, FREE_BAGS, day, spoken_date
from environments.tau2.synthetic_templates import (
    Action,
    Tau2Draft,
    _check,
    _confirm,
    _do_all,
    _join,
    _templates,
    amount_fact,
    denial_fact,
    text_fact,
)


def _greet(draft: Tau2Draft, user: Any) -> str:
    draft.call("get_user_details", user_id=user.user_id)
    return f"Hi, my user id is {user.user_id}."


def _trip(reservation: Any) -> str:
    kind = "round trip" if reservation.flight_type == "round_trip" else "one-way trip"
    date = spoken_date(reservation.flights[0].date)
    return f"{kind} from {CITY_OF[reservation.origin]} to {CITY_OF[reservation.destination]} on {date}"


def _card(draft: Tau2Draft, user: Any, by_digits: bool) -> tuple[str, str]:
    """A credit card of the user and how the request names it."""
    cards = [key for key, method in user.payment_methods.items() if method.source == "credit_card"]
    card = draft.rng.choice(cards)
    method = user.payment_methods[card]
    return card, (
        f"my {method.brand.capitalize()} card ending in {method.last_four}" if by_digits else "my credit card"
    )


def _bags(count: int) -> str:
    return f"{count} checked bag{'s' if count != 1 else ''}"


def _added_bags(user: Any, reservation: Any, paid: int) -> tuple[int, int, int, int]:
    """Bags to add so that ``paid`` more are paid for: (added, new total, new paid bags, fee), by the policy's
    allowance."""
    free = FREE_BAGS[user.membership][reservation.cabin] * len(reservation.passengers)
    added = max(0, free - reservation.total_baggages) + paid
    total = reservation.total_baggages + added
    return added, total, total - free, BAG_FEE * paid


def _passenger_dicts(passengers: list[Any]) -> list[dict[str, str]]:
    return [passenger.model_dump() for passenger in passengers]


def _airline_structured_data_reasoning(draft: Tau2Draft, difficulty: int) -> str:
    """Add checked bags to the reservation the user describes, with the free allowance worked out.

    The agent finds the reservation by route and date among 2 / 3 / 4 (look-
    alikes: the same route another day, the way back, and at 3 a cancelled
    copy of it), then computes the paid bags from the membership, cabin and
    passengers (the policy's allowance table). At 3 the card is named by its
    last digits among two. Marked: the baggage update.
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    user = data.add_user(credit_cards=2 if difficulty == 3 else 1)
    origin, destination = data.route()
    date = day(rng.randint(3, 12))
    cabin = rng.choice(["economy", "business"])
    passengers = rng.randint(1, difficulty)
    extra = rng.choice([0, 1])
    target = data.add_reservation(user, origin, destination, date, cabin=cabin, passengers=passengers, extra_bags=extra)
    lookalikes = [(origin, destination, day(rng.randint(13, 20))), (destination, origin, date)][:difficulty]
    for start, end, when in lookalikes:
        data.add_reservation(user, start, end, when, cabin=rng.choice(CABINS), passengers=rng.randint(1, 2))
    if difficulty == 3:
        copy = data.add_reservation(user, origin, destination, date, cabin=cabin, passengers=passengers)
        copy.status = "cancelled"
    rng.shuffle(user.reservations)
    free = FREE_BAGS[user.membership][cabin] * passengers
    added, total, nonfree, fee = _added_bags(user, target, rng.randint(1, 3))
    card, card_words = _card(draft, user, by_digits=difficulty == 3)
    opening = _greet(draft, user)
    for reservation_id in user.reservations[: user.reservations.index(target.reservation_id) + 1]:
        draft.call("get_reservation_details", reservation_id=reservation_id)
    _confirm(
        draft,
        [
            f"add {_bags(added)} to reservation {target.reservation_id}: {total} bags in all, {free} of them free for "
            f"{passengers} {user.membership} {cabin} passenger(s), {nonfree} paid; ${fee} charged to your card"
        ],
    )
    draft.call(
        "update_reservation_baggages",
        reservation_id=target.reservation_id,
        total_baggages=total,
        nonfree_baggages=nonfree,
        payment_id=card,
    )
    draft.mark_capability_step()
    draft.say(
        f"Reservation {target.reservation_id} now has {total} checked bags, {nonfree} of them paid; ${fee} was "
        "charged to your card."
    )
    draft.report(amount_fact("the baggage fee", fee))
    return f"{opening} I'd like to add {_bags(added)} to my {_trip(target)}. Please charge any fee to {card_words}."


def _airline_tool_calling_precision(draft: Tau2Draft, difficulty: int) -> str:
    """Replace passengers of a reservation with the people the user names, birth dates spoken in words.

    1 / 2 / 3 passengers on the reservation; one replaced (two at 3). The call
    takes the whole list, in order, others unchanged, dates as YYYY-MM-DD.
    Marked: the passenger update.
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    user = data.add_user()
    origin, destination = data.route()
    reservation = data.add_reservation(
        user,
        origin,
        destination,
        day(rng.randint(2, 14)),
        cabin=rng.choice(CABINS),
        passengers=difficulty,
        round_trip=rng.random() < 0.5,
    )
    for _ in range(difficulty):
        start, end = data.route()
        data.add_reservation(user, start, end, day(rng.randint(2, 20)), cabin=rng.choice(CABINS))
    rng.shuffle(user.reservations)
    indexes = sorted(rng.sample(range(difficulty), 2 if difficulty == 3 else 1))
    passengers = list(reservation.passengers)
    replaced, clauses = [], []
    for index in indexes:
        old, new = passengers[index], data.passenger()
        passengers[index] = new
        replaced.append(new)
        clauses.append(
            f"{old.first_name} {old.last_name} with {new.first_name} {new.last_name}, born {spoken_date(new.dob)}"
        )
    opening = _greet(draft, user)
    draft.call("get_reservation_details", reservation_id=reservation.reservation_id)
    names = _join([f"{p.first_name} {p.last_name} (born {p.dob})" for p in replaced])
    _confirm(draft, [f"update the passengers of reservation {reservation.reservation_id}, putting in {names}"])
    draft.call(
        "update_reservation_passengers",
        reservation_id=reservation.reservation_id,
        passengers=_passenger_dicts(passengers),
    )
    draft.mark_capability_step()
    draft.say(f"Reservation {reservation.reservation_id} is updated: {names} now on it instead.")
    draft.report(
        *(
            text_fact(f"the new passenger {p.first_name} {p.last_name}", f"{p.first_name} {p.last_name}")
            for p in replaced
        )
    )
    return f"{opening} On reservation {reservation.reservation_id}, please replace {'; and '.join(clauses)}."


def _airline_action(draft: Tau2Draft, user: Any, kind: str) -> Action:
    """One action of a multi-step request on its own new reservation (read by the oracle now, written later)."""
    data, rng = draft.data, draft.rng
    origin, destination = data.route()
    date = day(rng.randint(2, 14))
    card = data.credit_card(user)
    if kind == "cancel":
        reservation = data.add_reservation(
            user, origin, destination, date, cabin="economy", created_at=data.created_recently()
        )
    elif kind == "bags":
        cabin = rng.choice(["economy", "business"])
        reservation = data.add_reservation(user, origin, destination, date, cabin=cabin, extra_bags=rng.choice([0, 1]))
    else:
        passengers, round_trip = rng.randint(1, 2), rng.random() < 0.5
        reservation = data.add_reservation(
            user, origin, destination, date, cabin="economy", passengers=passengers, round_trip=round_trip
        )
    rid = reservation.reservation_id
    draft.call("get_reservation_details", reservation_id=rid)
    if kind == "cancel":
        paid = sum(payment.amount for payment in reservation.payment_history)
        return Action(
            f"cancel reservation {rid} (I booked it less than a day ago and my plans changed)",
            f"cancel reservation {rid}, refunding ${paid}",
            f"Reservation {rid} is cancelled; ${paid} goes back to your original payment method in 5 to 7 business "
            "days.",
            "cancel_reservation",
            {"reservation_id": rid},
            amount_fact(f"the refund of {rid}", paid),
        )
    if kind == "bags":
        added, total, nonfree, fee = _added_bags(user, reservation, rng.randint(1, 2))
        return Action(
            f"add {_bags(added)} to reservation {rid}",
            f"add {_bags(added)} to reservation {rid} ({nonfree} paid in all, ${fee} fee)",
            f"Reservation {rid} now has {total} checked bags; the fee of ${fee} was charged to your credit card.",
            "update_reservation_baggages",
            {"reservation_id": rid, "total_baggages": total, "nonfree_baggages": nonfree, "payment_id": card},
            amount_fact(f"the baggage fee of {rid}", fee),
        )
    if kind == "cabin":
        flights = [{"flight_number": flight.flight_number, "date": flight.date} for flight in reservation.flights]
        new_prices = sum(
            data.flights[flight.flight_number].dates[flight.date].prices["business"] for flight in reservation.flights
        )
        difference = (new_prices - sum(flight.price for flight in reservation.flights)) * len(reservation.passengers)
        return Action(
            f"upgrade reservation {rid} to business class",
            f"upgrade reservation {rid} to business (${difference} more)",
            f"Reservation {rid} is now in business class; the difference of ${difference} was charged to your credit "
            "card.",
            "update_reservation_flights",
            {"reservation_id": rid, "cabin": "business", "flights": flights, "payment_id": card},
            amount_fact(f"the upgrade price of {rid}", difference),
        )
    passengers = list(reservation.passengers)
    old, new = passengers[-1], data.passenger()
    passengers[-1] = new
    return Action(
        f"on reservation {rid}, replace {old.first_name} {old.last_name} with {new.first_name} {new.last_name}, born "
        f"{spoken_date(new.dob)}",
        f"put {new.first_name} {new.last_name} on reservation {rid} instead of {old.first_name} {old.last_name}",
        f"{new.first_name} {new.last_name} now flies on reservation {rid}.",
        "update_reservation_passengers",
        {"reservation_id": rid, "passengers": _passenger_dicts(passengers)},
        text_fact(f"the new passenger of {rid}", f"{new.first_name} {new.last_name}"),
    )


def _airline_multi_step_task_completion(draft: Tau2Draft, difficulty: int) -> str:
    """2 / 3 / 4 different changes in one request (add bags, upgrade to business, replace a passenger, cancel a fresh
    booking).

    Each on its own reservation, besides a distractor one. One confirmation
    lists them all; the final reply reports each one's fee, price, refund or
    name. Marked: every write after the first.
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    user = data.add_user()
    start, end = data.route()
    data.add_reservation(user, start, end, day(rng.randint(2, 20)), cabin=rng.choice(CABINS))
    kinds = rng.sample(["bags", "cabin", "passenger", "cancel"], difficulty + 1)
    opening = _greet(draft, user)
    requests = _do_all(draft, [_airline_action(draft, user, kind) for kind in kinds])
    return f"{opening} I have several requests: {requests}. Charge any fees to my credit card."


_CANCELLABLE = ("recent", "business", "airline_cancelled")


def _airline_precondition_verification(draft: Tau2Draft, difficulty: int) -> str:
    """Cancel the reservations the user lists for a change of plans; only those the policy allows.

    2 / 3 / 4 reservations. Allowed: booked within 24 hours, business class,
    or a flight cancelled by the airline (seen only with get_flight_status).
    Not allowed: an older (basic) economy booking, with or without insurance
    (which does not cover a change of plans). The tool cancels anything, so
    the agent checks each first. Marked: reading each reservation that may
    not be cancelled (broken: cancelling it without the check).
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    user = data.add_user()
    bad = {1: ["old"], 2: ["old", "insured"], 3: ["old", "insured"]}[difficulty]
    kinds = rng.sample(_CANCELLABLE[: 2 if difficulty == 1 else 3], difficulty + 1 - len(bad)) + bad
    rng.shuffle(kinds)
    reservations = []
    for kind in kinds:
        origin, destination = data.route()
        cabin = "business" if kind == "business" else rng.choice(["basic_economy", "economy"])
        reservations.append(
            (
                kind,
                data.add_reservation(
                    user,
                    origin,
                    destination,
                    day(rng.randint(2, 14)),
                    cabin=cabin,
                    created_at=data.created_recently() if kind == "recent" else None,
                    insurance="yes" if kind == "insured" else "no",
                    status="cancelled" if kind == "airline_cancelled" else "available",
                ),
            )
        )
    start, end = data.route()
    data.add_reservation(user, start, end, day(rng.randint(2, 20)), cabin=rng.choice(CABINS))
    rng.shuffle(user.reservations)
    opening = _greet(draft, user)
    for kind, reservation in reservations:
        draft.call("get_reservation_details", reservation_id=reservation.reservation_id)
        if kind in ("old", "insured"):
            draft.mark_capability_step(instead=("cancel_reservation", {"reservation_id": reservation.reservation_id}))
        if kind not in ("recent", "business"):
            flight = reservation.flights[0]
            draft.call("get_flight_status", flight_number=flight.flight_number, date=flight.date)
    allowed = [reservation for kind, reservation in reservations if kind in _CANCELLABLE]
    refused = [(kind, reservation) for kind, reservation in reservations if kind not in _CANCELLABLE]
    paid = {
        reservation.reservation_id: sum(payment.amount for payment in reservation.payment_history)
        for reservation in allowed
    }
    _confirm(
        draft,
        [
            f"cancel reservation {rid}, refunding ${amount} to the original payment method"
            for rid, amount in paid.items()
        ],
    )
    for rid, amount in paid.items():
        draft.call("cancel_reservation", reservation_id=rid)
        draft.report(amount_fact(f"the refund of {rid}", amount))
    draft.report(*(denial_fact(reservation.reservation_id) for _, reservation in refused))
    why = {
        "old": "it was booked more than 24 hours ago in economy and no flight was cancelled",
        "insured": (
            "its insurance does not cover a change of plans, and it was booked more than 24 hours ago in economy"
        ),
    }
    done = " ".join(
        f"Reservation {rid} is cancelled; ${amount} will be refunded in 5 to 7 business days."
        for rid, amount in paid.items()
    )
    denials = " ".join(f"I cannot cancel reservation {r.reservation_id}: {why[kind]}." for kind, r in refused)
    draft.say(f"{done} {denials}")
    listed = _join([reservation.reservation_id for _, reservation in reservations])
    return f"{opening} Please cancel my reservations {listed}. The reason is a change of plans."


def _airline_information_reporting(draft: Tau2Draft, difficulty: int) -> str:
    """1 / 2 / 3 questions whose answers the final reply must tell; nothing changes.

    Kinds: the status of the flight of a trip (found among the reservations),
    what a reservation cost, the gift card balance, the cheapest fare in a
    cabin on a route and day (among 2-4 flights). Marked: the final reply.
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    user = data.add_user()
    kinds = rng.sample(["flight_status", "total_paid", "gift_balance", "cheapest_fare"], difficulty)
    for _ in range(difficulty):
        start, end = data.route()
        data.add_reservation(user, start, end, day(rng.randint(2, 20)), cabin=rng.choice(CABINS))
    origin, destination = data.route()
    status = rng.choice(["delayed", "on time", "cancelled"])
    when = day(0 if status != "cancelled" else rng.randint(1, 5))  # delayed or on time: today's flight
    trip = data.add_reservation(user, origin, destination, when, cabin=rng.choice(CABINS), status=status)
    start, end = data.route()
    booked = data.add_reservation(
        user, start, end, day(rng.randint(2, 20)), cabin=rng.choice(CABINS), passengers=rng.randint(1, 3)
    )
    rng.shuffle(user.reservations)
    opening = _greet(draft, user)
    questions, answers = [], []
    for kind in kinds:
        if kind == "flight_status":
            for reservation_id in user.reservations[: user.reservations.index(trip.reservation_id) + 1]:
                draft.call("get_reservation_details", reservation_id=reservation_id)
            flight = trip.flights[0]
            draft.call("get_flight_status", flight_number=flight.flight_number, date=flight.date)
            questions.append(
                f"the status of my flight from {CITY_OF[origin]} to {CITY_OF[destination]} on "
                f"{spoken_date(flight.date)}"
            )
            answers.append(f"Your flight {flight.flight_number} on {flight.date} is {status}.")
            rivals = tuple(other for other in FLIGHT_STATUSES if other != status)
            draft.report(
                text_fact(f"the status of {flight.flight_number}", status, status.replace(" ", "-"), rivals=rivals)
            )
        elif kind == "total_paid":
            draft.call("get_reservation_details", reservation_id=booked.reservation_id)
            paid = sum(payment.amount for payment in booked.payment_history)
            questions.append(f"how much I paid in total for reservation {booked.reservation_id}")
            answers.append(f"You paid ${paid} for reservation {booked.reservation_id}.")
            draft.report(amount_fact(f"the total of {booked.reservation_id}", paid))
        elif kind == "gift_balance":
            gift = next(method for method in user.payment_methods.values() if method.source == "gift_card")
            questions.append("the balance of my gift card")
            answers.append(f"Your gift card balance is ${gift.amount:g}.")
            draft.report(amount_fact("the gift card balance", gift.amount))
        else:
            start, end = data.route()
            when, cabin = day(rng.randint(2, 20)), rng.choice(CABINS)
            for _ in range(1 + difficulty):
                data.add_flight(start, end, when)
            cheapest = min(  # over every flight the search finds (a reservation's flight may fly there that day too)
                flight.dates[when].prices[cabin]
                for flight in data.flights.values()
                if (flight.origin, flight.destination) == (start, end)
                and when in flight.dates
                and flight.dates[when].status == "available"
            )
            draft.call("search_direct_flight", origin=start, destination=end, date=when)
            questions.append(
                f"the cheapest {cabin.replace('_', ' ')} fare for a direct flight from {start} to {end} "
                f"on {spoken_date(when)}"
            )
            answers.append(
                f"The cheapest {cabin.replace('_', ' ')} fare from {start} to {end} on {when} is ${cheapest}."
            )
            draft.report(amount_fact("the cheapest fare", cheapest))
    draft.say(" ".join(answers))
    draft.mark_capability_step()
    return f"{opening} Could you tell me {_join(questions)}?"


AIRLINE_TEMPLATES = _templates(
    {
        "structured_data_reasoning": _airline_structured_data_reasoning,
        "tool_calling_precision": _airline_tool_calling_precision,
        "multi_step_task_completion": _airline_multi_step_task_completion,
        "precondition_verification": _airline_precondition_verification,
        "information_reporting": _airline_information_reporting,
    }
)
