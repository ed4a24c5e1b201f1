"""The τ²-bench retail templates: one builder per capability, and ``RETAIL_TEMPLATES`` (capability -> template).

Each builder makes one retail task on a :class:`Tau2Draft` at a difficulty and
returns the user's request; the draft, the facts, :class:`Action` and the
confirmation helpers they use are the shared machinery of
``synthetic_templates.py``.
"""

from __future__ import annotations

from typing import Any

from environments.tau2.synthetic_data import CATALOGUE, ORDER_STATUSES, describe_options
from environments.tau2.synthetic_templates import (
    Action,
    Fact,
    Tau2Draft,
    _check,
    _confirm,
    _do_all,
    _join,
    _templates,
    amount_fact,
    denial_fact,
    money,
    text_fact,
)


def _address_text(fields: dict[str, str]) -> str:
    street = f"{fields['address1']}, {fields['address2']}" if fields["address2"] else fields["address1"]
    return f"{street}, {fields['city']}, {fields['state']} {fields['zip']}, {fields['country']}"


def _login(draft: Tau2Draft, user: Any) -> str:
    """The oracle authenticates the user (email, or name and zip) and reads the profile; returns the request's
    opening."""
    name = f"{user.name.first_name} {user.name.last_name}"
    if draft.rng.random() < 0.5:
        draft.call("find_user_id_by_email", email=user.email)
        opening = f"Hi, I'm {name} and my email is {user.email}."
    else:
        draft.call(
            "find_user_id_by_name_zip",
            first_name=user.name.first_name,
            last_name=user.name.last_name,
            zip=user.address.zip,
        )
        opening = f"Hi, I'm {name}, zip code {user.address.zip}."
    draft.call("get_user_details", user_id=user.user_id)
    return opening


def _method_name(user: Any, method_id: str) -> str:
    method = user.payment_methods[method_id]
    if method.source == "credit_card":
        return f"{method.brand.capitalize()} card ending in {method.last_four}"
    return "PayPal account" if method.source == "paypal" else "gift card"


def _distractor_orders(draft: Tau2Draft, user: Any, count: int) -> None:
    for _ in range(count):
        draft.data.add_simple_order(user, draft.rng.choice(("pending", "processed", "delivered")))


def _retail_structured_data_reasoning(draft: Tau2Draft, difficulty: int) -> str:
    """Exchange a delivered item for the variant with the requested options, everything else kept.

    The agent finds the delivered order holding the product among the user's
    orders (from 2 on, a pending order holds the same product), then the one
    in-stock variant that changes exactly the named options (1 option at
    difficulty 1, 2 after) among 4 / 6 / 8 variants whose look-alikes change
    another option too or are out of stock. Marked: the exchange call.
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    user = data.add_user(credit_cards=2 if difficulty == 3 else 1)
    kind = data.new_kind()
    dimensions = CATALOGUE[kind]
    old = data.options(kind)
    changed = rng.sample(sorted(dimensions), 1 if difficulty == 1 else 2)
    wanted = {
        **old,
        **{option: rng.choice([value for value in dimensions[option] if value != old[option]]) for option in changed},
    }
    kept = [option for option in dimensions if option not in changed]
    lookalikes = []  # the wanted options with another one changed too: the first in stock, the second not
    for _ in range(2):
        option = rng.choice(kept)
        other = {**wanted, option: rng.choice([value for value in dimensions[option] if value != wanted[option]])}
        if other not in lookalikes:
            lookalikes.append(other)
    fixed = ((old, True), (wanted, True), *((options, index == 0) for index, options in enumerate(lookalikes)))
    product = data.add_product({1: 4, 2: 6, 3: 8}[difficulty], kind, fixed)
    old_variant, new_variant = data.variant(product, old), data.variant(product, wanted)
    if abs(new_variant.price - old_variant.price) < 0.01:
        new_variant.price = round(old_variant.price + 5, 2)
    companions = [data.add_product(3)] if difficulty >= 2 else []
    order = data.add_order(
        user, "delivered", [(product, old_variant)] + [(p, rng.choice(list(p.variants.values()))) for p in companions]
    )
    if difficulty >= 2:
        data.add_order(user, "pending", [(product, data.variant(product, lookalikes[0]))])
    _distractor_orders(draft, user, difficulty)
    rng.shuffle(user.orders)
    if difficulty == 3:
        method_id = rng.choice([key for key, method in user.payment_methods.items() if method.source == "credit_card"])
    else:
        method_id = data.payment_method(user, "paypal")
    method = _method_name(user, method_id)
    opening = _login(draft, user)
    for order_id in user.orders[: user.orders.index(order.order_id) + 1]:
        draft.call("get_order_details", order_id=order_id)
    draft.call("get_product_details", product_id=product.product_id)
    difference = round(new_variant.price - old_variant.price, 2)
    direction = "charged to" if difference > 0 else "refunded to"
    _confirm(
        draft,
        [
            f"exchange the {kind} ({describe_options(old)}) of order {order.order_id} for item {new_variant.item_id} "
            f"({describe_options(wanted)}), with the price difference of {money(difference)} {direction} your {method}"
        ],
    )
    draft.call(
        "exchange_delivered_order_items",
        order_id=order.order_id,
        item_ids=[old_variant.item_id],
        new_item_ids=[new_variant.item_id],
        payment_method_id=method_id,
    )
    draft.mark_capability_step()
    draft.say(
        f"Your exchange is requested: the {kind} in order {order.order_id} becomes {describe_options(wanted)} "
        f"(item {new_variant.item_id}). The price difference of {money(difference)} will be {direction} your {method}. "
        "You will receive an email with instructions for returning the old item."
    )
    draft.report(amount_fact("the price difference", difference))
    wording = _join([f"{option} {wanted[option]}" for option in changed])
    return (
        f"{opening} I received my {kind} and I'd like to exchange it for the same one with {wording}, everything else "
        "the same. "
        f"Please use my {method} for any price difference."
    )


_REASONS = {  # the tool's reason -> how the user says it (the first fits after "because")
    "no longer needed": ("I no longer need it", "I don't need it anymore", "I changed my mind and don't need it"),
    "ordered by mistake": ("I ordered it by mistake", "I placed it by accident", "I bought it accidentally"),
}


def _retail_tool_calling_precision(draft: Tau2Draft, difficulty: int) -> str:
    """Write calls whose arguments come straight from the user's words, in the tool's format.

    The user names the order without its '#'. 1: cancel it, the reason in
    other words (the tool takes 'no longer needed' or 'ordered by mistake').
    2: ship it to a new address (six fields; no second line means ''; zip
    codes may start with 0). 3: that, and make it the default address too.
    Marked: the write calls.
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    user = data.add_user()
    product = data.add_product(3)
    order = data.add_order(user, "pending", [(product, rng.choice(list(product.variants.values())))])
    _distractor_orders(draft, user, difficulty)
    rng.shuffle(user.orders)
    opening = _login(draft, user)
    spoken_id = order.order_id.lstrip("#")
    draft.call("get_order_details", order_id=order.order_id)
    if difficulty == 1:
        reason = rng.choice(sorted(_REASONS))
        total = order.payment_history[0].amount
        _confirm(
            draft,
            [
                f"cancel order {order.order_id} (reason: {reason}), refunding {money(total)} to your original "
                "payment method"
            ],
        )
        draft.call("cancel_pending_order", order_id=order.order_id, reason=reason)
        draft.mark_capability_step()
        draft.say(
            f"Order {order.order_id} is cancelled; {money(total)} will be refunded to your original payment "
            "method in 5 to 7 business days."
        )
        draft.report(amount_fact("the refund", total))
        return f"{opening} Please cancel my order {spoken_id}; {rng.choice(_REASONS[reason])}."
    address = data.address_fields()
    while address["zip"] == order.address.zip:
        address = data.address_fields()
    text = _address_text(address)
    actions = [f"change the shipping address of order {order.order_id} to {text}"]
    if difficulty == 3:
        actions.append(f"change your default address to {text}")
    _confirm(draft, actions)
    draft.call("modify_pending_order_address", order_id=order.order_id, **address)
    draft.mark_capability_step()
    if difficulty == 3:
        draft.call("modify_user_address", user_id=user.user_id, **address)
        draft.mark_capability_step()
    default = " It is your default address now as well." if difficulty == 3 else ""
    draft.say(f"Order {order.order_id} will now ship to {text}.{default}")
    draft.report(
        text_fact("the new street address", address["address1"]), text_fact("the new zip code", address["zip"])
    )
    second = f", {address['address2']}" if address["address2"] else ", no apartment or suite number"
    spoken = (
        f"{address['address1']}{second}, {address['city']}, {address['state']} {address['zip']}, {address['country']}"
    )
    also = " Please also make it my default address." if difficulty == 3 else ""
    return f"{opening} Please ship my order {spoken_id} to {spoken} instead.{also}"


def _retail_action(draft: Tau2Draft, user: Any, kind: str) -> Action:
    """One action of a multi-step request; its order (if any) is created and read by the oracle now, written later."""
    data, rng = draft.data, draft.rng
    if kind == "user_address":
        address = data.address_fields()
        text = _address_text(address)
        return Action(
            f"change my default address to {text}",
            f"change your default address to {text}",
            f"Your default address is now {text}.",
            "modify_user_address",
            {"user_id": user.user_id, **address},
            text_fact("the new default street address", address["address1"]),
        )
    status = "delivered" if kind == "return" else "pending"
    products = [data.add_product(3) for _ in range(2 if kind == "return" else 1)]
    order = data.add_order(
        user, status, [(product, rng.choice(list(product.variants.values()))) for product in products]
    )
    order_id, total = order.order_id, order.payment_history[0].amount
    draft.call("get_order_details", order_id=order_id)
    if kind == "cancel":
        reason = rng.choice(sorted(_REASONS))
        return Action(
            f"cancel order {order_id} because {_REASONS[reason][0]}",
            f"cancel order {order_id} (reason: {reason})",
            f"Order {order_id} is cancelled and {money(total)} will be refunded to your credit card.",
            "cancel_pending_order",
            {"order_id": order_id, "reason": reason},
            amount_fact(f"the refund of {order_id}", total),
        )
    if kind == "address":
        address = data.address_fields()
        text = _address_text(address)
        return Action(
            f"ship order {order_id} to {text}",
            f"change the shipping address of order {order_id} to {text}",
            f"Order {order_id} will ship to {text}.",
            "modify_pending_order_address",
            {"order_id": order_id, **address},
            text_fact(f"the new street of {order_id}", address["address1"]),
        )
    if kind == "payment":
        gift = data.payment_method(user, "gift_card")
        user.payment_methods[gift].balance = round(total + rng.uniform(5, 100), 2)
        return Action(
            f"pay for order {order_id} with my gift card instead",
            f"pay order {order_id} ({money(total)}) with your gift card",
            f"Order {order_id} is now paid with your gift card ({money(total)}); the credit card will be refunded.",
            "modify_pending_order_payment",
            {"order_id": order_id, "payment_method_id": gift},
            amount_fact(f"the amount paid by gift card for {order_id}", total),
        )
    item = order.items[0]
    return Action(
        f"return the {item.name} from order {order_id} to my original payment method",
        f"return the {item.name} of order {order_id}, refunding {money(item.price)} to your original payment method",
        f"The return of the {item.name} from order {order_id} is requested; {money(item.price)} goes back to your "
        "original payment method.",
        "return_delivered_order_items",
        {
            "order_id": order_id,
            "item_ids": [item.item_id],
            "payment_method_id": order.payment_history[0].payment_method_id,
        },
        amount_fact(f"the refund for the {item.name}", item.price),
    )


def _retail_multi_step_task_completion(draft: Tau2Draft, difficulty: int) -> str:
    """2 / 3 / 4 different actions in one request (cancel, new shipping address, return, pay by gift card, default
    address).

    Each acts on its own order, besides a distractor order. One confirmation
    lists them all; the final reply reports each one's fact. Marked: every
    write after the first.
    """
    _check(difficulty)
    user = draft.data.add_user()
    kinds = draft.rng.sample(["cancel", "address", "return", "payment", "user_address"], difficulty + 1)
    _distractor_orders(draft, user, 1)
    opening = _login(draft, user)
    requests = _do_all(draft, [_retail_action(draft, user, kind) for kind in kinds])
    return f"{opening} I need several things done: {requests}."


def _retail_precondition_verification(draft: Tau2Draft, difficulty: int) -> str:
    """Cancel, or re-address, the orders the user lists; only those the policy allows.

    2 / 3 / 4 orders named; ineligible: another customer's order (the tools
    would act on it), for a new address an order whose items were modified
    (the tool allows it, the policy does not), or an order past pending (the
    tool refuses). The agent reads each order before acting, acts on the
    eligible ones and says which it could not do. Marked: reading an order
    the tools would wrongly act on (broken: acting on it without the check).
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    action = rng.choice(["cancel", "address"])
    user, stranger = data.add_user(), data.add_user()  # the stranger owns the orders the user names by mistake
    bad = {1: ["other_user"], 2: ["other_user", rng.choice(["other_user", "status"])], 3: ["other_user", "status"]}[
        difficulty
    ]
    kinds = ["eligible"] * (difficulty + 1 - len(bad)) + bad
    rng.shuffle(kinds)
    address = data.address_fields()
    text = _address_text(address)
    reason = rng.choice(sorted(_REASONS))
    orders = []
    for kind in kinds:
        owner = stranger if kind == "other_user" else user
        product = data.add_product(3)
        status = "pending"
        if kind == "status":
            status = "pending (item modified)" if action == "address" else rng.choice(["processed", "delivered"])
        orders.append((kind, data.add_order(owner, status, [(product, rng.choice(list(product.variants.values())))])))
    _distractor_orders(draft, user, 1)
    rng.shuffle(user.orders)
    opening = _login(draft, user)

    def write(order: Any) -> tuple[str, dict[str, Any]]:
        if action == "cancel":
            return "cancel_pending_order", {"order_id": order.order_id, "reason": reason}
        return "modify_pending_order_address", {"order_id": order.order_id, **address}

    for kind, order in orders:
        draft.call("get_order_details", order_id=order.order_id)
        if kind == "other_user" or (kind == "status" and action == "address"):
            draft.mark_capability_step(instead=write(order))
    eligible = [order for kind, order in orders if kind == "eligible"]
    if action == "cancel":
        refunds = {order.order_id: order.payment_history[0].amount for order in eligible}
        _confirm(
            draft,
            [
                f"cancel order {order_id} (reason: {reason}), refunding {money(refund)}"
                for order_id, refund in refunds.items()
            ],
        )
        replies = [
            f"Order {order_id} is cancelled and {money(refund)} will be refunded."
            for order_id, refund in refunds.items()
        ]
        facts = [amount_fact(f"the refund of {order_id}", refund) for order_id, refund in refunds.items()]
    else:
        _confirm(draft, [f"ship order {order.order_id} to {text}" for order in eligible])
        replies = [f"Order {order.order_id} will now ship to {text}." for order in eligible]
        facts = [
            Fact(f"the new address of {order.order_id}", ((order.order_id.lstrip("#"),), (address["address1"],)))
            for order in eligible
        ]
    for order in eligible:
        tool, arguments = write(order)
        draft.call(tool, **arguments)
    for kind, order in orders:
        if kind != "eligible":
            why = "it is not an order on your account" if kind == "other_user" else f"its status is {order.status}"
            replies.append(f"I cannot {'cancel' if action == 'cancel' else 'change'} order {order.order_id}: {why}.")
            facts.append(denial_fact(order.order_id))
    draft.report(*facts)
    draft.say(" ".join(replies))
    listed = _join([order.order_id for _, order in orders])
    if action == "cancel":
        return f"{opening} Please cancel my orders {listed}; {rng.choice(_REASONS[reason]).replace(' it', ' them')}."
    return f"{opening} Please change the shipping address of my orders {listed} to {text}."


def _retail_information_reporting(draft: Tau2Draft, difficulty: int) -> str:
    """1 / 2 / 3 questions whose answers the final reply must tell; nothing changes.

    Kinds: an order's status and tracking number, the gift card balance, a
    variant's price (found through the product list), what the user paid for
    the order holding a product. Marked: the final reply.
    """
    _check(difficulty)
    data, rng = draft.data, draft.rng
    user = data.add_user()
    kinds = rng.sample(["tracking", "gift_balance", "variant_price", "order_total"], difficulty)
    _distractor_orders(draft, user, difficulty)
    shipped = data.add_simple_order(user, rng.choice(["processed", "delivered"]))
    bought = data.add_product(3)
    paid = data.add_order(
        user, rng.choice(["pending", "delivered"]), [(bought, rng.choice(list(bought.variants.values())))]
    )
    store = data.add_product(3 + difficulty)
    asked = rng.choice(list(store.variants.values()))
    rng.shuffle(user.orders)
    opening = _login(draft, user)
    questions, answers = [], []
    for kind in kinds:
        if kind == "tracking":
            tracking = shipped.fulfillments[0].tracking_id[0]
            draft.call("get_order_details", order_id=shipped.order_id)
            questions.append(f"the status of order {shipped.order_id} and its tracking number")
            answers.append(f"Order {shipped.order_id} is {shipped.status}, tracking number {tracking}.")
            rivals = tuple(other for other in ORDER_STATUSES if other != shipped.status)
            draft.report(
                Fact(
                    f"the status and tracking number of {shipped.order_id}",
                    ((shipped.status,), (tracking,)),
                    rivals=rivals,
                )
            )
        elif kind == "gift_balance":
            gift = user.payment_methods[data.payment_method(user, "gift_card")]
            questions.append("how much is left on my gift card")
            answers.append(f"Your gift card balance is {money(gift.balance)}.")
            draft.report(amount_fact("the gift card balance", gift.balance))
        elif kind == "variant_price":
            draft.call("list_all_product_types")
            draft.call("get_product_details", product_id=store.product_id)
            questions.append(f"how much the {store.name} with {describe_options(asked.options)} costs")
            answers.append(f"The {store.name} with {describe_options(asked.options)} costs {money(asked.price)}.")
            draft.report(amount_fact(f"the price of the {store.name}", asked.price))
        else:
            for order_id in user.orders[: user.orders.index(paid.order_id) + 1]:
                draft.call("get_order_details", order_id=order_id)
            total = paid.payment_history[0].amount
            questions.append(f"how much I paid for the order with my {bought.name}")
            answers.append(f"You paid {money(total)} for order {paid.order_id} ({bought.name}).")
            draft.report(amount_fact(f"the total of {paid.order_id}", total))
    draft.say(" ".join(answers))
    draft.mark_capability_step()
    return f"{opening} Could you tell me {_join(questions)}?"


RETAIL_TEMPLATES = _templates(
    {
        "structured_data_reasoning": _retail_structured_data_reasoning,
        "tool_calling_precision": _retail_tool_calling_precision,
        "multi_step_task_completion": _retail_multi_step_task_completion,
        "precondition_verification": _retail_precondition_verification,
        "information_reporting": _retail_information_reporting,
    }
)
