"""Seeded, small τ²-bench-shaped databases: airline (users, flights, reservations) and retail (users, products, orders).

A builder (:class:`AirlineData`, :class:`RetailData`) draws every name, id,
price and date from one ``random.Random`` and holds the package's own pydantic
records, so ``db()`` is a database the package's toolkit runs on unchanged.
The synthetic templates add the records a task needs (the target and its
distractors) plus a few unrelated ones; ids never repeat within a database and
avoid the ids the package itself hands out (new reservations, certificates).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

from environments.tau2.package import tau2_module

airline = tau2_module("domains.airline.data_model")
retail = tau2_module("domains.retail.data_model")
FLIGHT_STATUSES = ("available", "on time", "delayed", "flying", "landed", "cancelled")  # the package's flight statuses
# and orders'
ORDER_STATUSES = ("pending", "processed", "delivered", "cancelled", "return requested", "exchange requested")
DATABASE_MODELS = {"airline": airline.FlightDB, "retail": retail.RetailDB}


def empty_database(domain: str) -> Any:
    model = DATABASE_MODELS[domain]
    return model(**{name: {} for name in model.model_fields})


FIRST_NAMES = (
    "Aarav",
    "Amelia",
    "Chen",
    "Daiki",
    "Elena",
    "Fatima",
    "Harper",
    "Ivan",
    "Juan",
    "Lei",
    "Liam",
    "Mei",
    "Mohamed",
    "Noah",
    "Olivia",
    "Omar",
    "Priya",
    "Raj",
    "Sofia",
    "Yusuf",
    "Anya",
    "Ethan",
    "Isabella",
    "Lucas",
    "Mason",
    "Nina",
)
LAST_NAMES = (
    "Ahmed",
    "Brown",
    "Garcia",
    "Gonzalez",
    "Ito",
    "Johansson",
    "Khan",
    "Kim",
    "Lopez",
    "Martin",
    "Moore",
    "Nguyen",
    "Patel",
    "Rossi",
    "Santos",
    "Silva",
    "Smith",
    "Taylor",
    "Thomas",
    "Wilson",
    "Young",
    "Zhang",
)
STREETS = (
    "Maple Drive",
    "Cedar Avenue",
    "Hillcrest Drive",
    "Lakeview Road",
    "Elm Street",
    "Park Avenue",
    "River Road",
    "Sunset Drive",
)
CITIES = (  # city, state, zip prefix
    ("Denver", "CO", "802"),
    ("Austin", "TX", "787"),
    ("Boston", "MA", "021"),
    ("Seattle", "WA", "981"),
    ("Phoenix", "AZ", "850"),
    ("Chicago", "IL", "606"),
    ("Columbus", "OH", "432"),
    ("Portland", "OR", "972"),
    ("Newark", "NJ", "071"),
    ("Hartford", "CT", "061"),
)
CARD_BRANDS = ("visa", "mastercard")

# -- the airline ------------------------------------------------------------------------------------
NOW = datetime(2024, 5, 15, 15, 0, 0)  # the airline policy's current time (EST); the package books at this time too
AIRPORTS = (
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("MSP", "Minneapolis"),
)
CITY_OF = dict(AIRPORTS)
CABINS = ("basic_economy", "economy", "business")
FREE_BAGS = {  # membership -> cabin -> free checked bags per passenger (the airline policy)
    "regular": {"basic_economy": 0, "economy": 1, "business": 2},
    "silver": {"basic_economy": 1, "economy": 2, "business": 3},
    "gold": {"basic_economy": 2, "economy": 3, "business": 4},
}
BAG_FEE, INSURANCE_FEE = 50, 30
# ids its tools create
_PACKAGE_IDS = {"HATHAT", "HATHAU", "HATHAV", "certificate_3221322", "certificate_3221323", "certificate_3221324"}


def day(offset: int) -> str:
    """The date ``offset`` days after the policy's today, as YYYY-MM-DD."""
    return (NOW + timedelta(days=offset)).strftime("%Y-%m-%d")


def spoken_date(date: str) -> str:
    """2024-05-20 -> May 20, 2024."""
    moment = datetime.strptime(date, "%Y-%m-%d")
    return f"{moment:%B} {moment.day}, {moment.year}"


class _Records:
    """Names, ids and addresses drawn without repetition."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self._ids: set[str] = set()
        self._names: set[tuple[str, str]] = set()

    def new_id(self, make) -> str:
        value = make()
        while value in self._ids:
            value = make()
        self._ids.add(value)
        return value

    def digits(self, count: int) -> str:
        return "".join(self.rng.choice("0123456789") for _ in range(count))

    def new_name(self) -> tuple[str, str]:
        name = (self.rng.choice(FIRST_NAMES), self.rng.choice(LAST_NAMES))
        while name in self._names:
            name = (self.rng.choice(FIRST_NAMES), self.rng.choice(LAST_NAMES))
        self._names.add(name)
        return name

    def address_fields(self) -> dict[str, str]:
        city, state, prefix = self.rng.choice(CITIES)
        suite = f"Suite {self.rng.randint(100, 999)}" if self.rng.random() < 0.6 else ""
        return {
            "address1": f"{self.rng.randint(10, 999)} {self.rng.choice(STREETS)}",
            "address2": suite,
            "city": city,
            "country": "USA",
            "state": state,
            "zip": prefix + self.digits(2),
        }


class AirlineData(_Records):
    def __init__(self, rng: random.Random):
        super().__init__(rng)
        self.flights: dict[str, Any] = {}
        self.users: dict[str, Any] = {}
        self.reservations: dict[str, Any] = {}
        self._ids |= _PACKAGE_IDS

    def route(self) -> tuple[str, str]:
        origin, destination = self.rng.sample(AIRPORTS, 2)
        return origin[0], destination[0]

    def add_flight(self, origin: str, destination: str, date: str, status: str = "available") -> Any:
        """A new flight number flying ``origin``-``destination`` on ``date`` (with ``status``) and on a neighbouring
        day."""
        number = self.new_id(lambda: f"HAT{self.rng.randint(100, 999)}")
        departure = self.rng.randint(5, 20)
        hours = self.rng.randint(1, 3)
        flight = airline.Flight(
            flight_number=number,
            origin=origin,
            destination=destination,
            scheduled_departure_time_est=f"{departure:02d}:{self.rng.choice(['00', '30'])}:00",
            scheduled_arrival_time_est=f"{departure + hours:02d}:{self.rng.choice(['00', '30'])}:00",
            dates={},
        )
        moment = datetime.strptime(date, "%Y-%m-%d")
        other = (moment + timedelta(days=self.rng.choice([-1, 1]))).strftime("%Y-%m-%d")
        for when, state in ((date, status), (other, "available" if other > day(0) else "landed")):
            flight.dates[when] = self.flight_status(flight, when, state)
        self.flights[number] = flight
        return flight

    def flight_status(self, flight: Any, date: str, status: str) -> Any:
        if status == "available":
            return airline.FlightDateStatusAvailable(
                status="available",
                available_seats={cabin: self.rng.randint(4, 20) for cabin in CABINS},
                prices={
                    "basic_economy": self.rng.randint(50, 100),
                    "economy": self.rng.randint(110, 200),
                    "business": self.rng.randint(220, 500),
                },
            )
        if status == "landed":
            return airline.FlightDateStatusLanded(
                status="landed",
                actual_departure_time_est=f"{date}T{flight.scheduled_departure_time_est}",
                actual_arrival_time_est=f"{date}T{flight.scheduled_arrival_time_est}",
            )
        if status == "cancelled":
            return airline.FlightDateStatusCancelled(status="cancelled")
        times = {
            "estimated_departure_time_est": f"{date}T{flight.scheduled_departure_time_est}",
            "estimated_arrival_time_est": f"{date}T{flight.scheduled_arrival_time_est}",
        }
        if status == "delayed":
            return airline.FlightDateStatusDelayed(status="delayed", **times)
        return airline.FlightDataStatusOnTime(status="on time", **times)

    def add_user(self, membership: str | None = None, credit_cards: int = 1) -> Any:
        first, last = self.new_name()
        user_id = self.new_id(lambda: f"{first.lower()}_{last.lower()}_{self.rng.randint(100, 9999)}")
        methods: dict[str, Any] = {}
        for _ in range(credit_cards):
            card = self.new_id(lambda: f"credit_card_{self.digits(7)}")
            methods[card] = airline.CreditCard(
                source="credit_card", id=card, brand=self.rng.choice(CARD_BRANDS), last_four=self.digits(4)
            )
        gift = self.new_id(lambda: f"gift_card_{self.digits(7)}")
        methods[gift] = airline.GiftCard(source="gift_card", id=gift, amount=self.rng.randint(20, 300))
        if self.rng.random() < 0.7:
            certificate = self.new_id(lambda: f"certificate_{self.digits(7)}")
            methods[certificate] = airline.Certificate(
                source="certificate", id=certificate, amount=self.rng.choice([100, 150, 250, 500])
            )
        user = airline.User(
            user_id=user_id,
            name=airline.Name(first_name=first, last_name=last),
            address=airline.Address(**self.address_fields()),
            email=f"{first.lower()}.{last.lower()}{self.digits(4)}@example.com",
            dob=self.birth_date(),
            payment_methods=methods,
            saved_passengers=[self.passenger()],
            membership=membership or self.rng.choice(list(FREE_BAGS)),
            reservations=[],
        )
        self.users[user_id] = user
        return user

    def birth_date(self) -> str:
        return f"{self.rng.randint(1950, 2005)}-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}"

    def passenger(self) -> Any:
        first, last = self.new_name()
        return airline.Passenger(first_name=first, last_name=last, dob=self.birth_date())

    def credit_card(self, user: Any) -> str:
        return next(key for key, method in user.payment_methods.items() if method.source == "credit_card")

    def add_reservation(
        self,
        user: Any,
        origin: str,
        destination: str,
        date: str,
        *,
        cabin: str,
        passengers: int = 1,
        round_trip: bool = False,
        created_at: str | None = None,
        insurance: str = "no",
        extra_bags: int = 0,
        status: str = "available",
    ) -> Any:
        """A reservation of ``user`` on new flights (``status`` on the outbound date), paid by its first credit card.

        Checked bags: the whole free allowance plus ``extra_bags`` paid ones, or (none paid) part of the allowance.
        """
        legs = [(origin, destination, date)]
        if round_trip:
            back = (datetime.strptime(date, "%Y-%m-%d") + timedelta(days=self.rng.randint(2, 6))).strftime("%Y-%m-%d")
            legs.append((destination, origin, back))
        flights = []
        for index, (start, end, when) in enumerate(legs):
            state = status if index == 0 else ("available" if when > day(0) else "landed")
            flight = self.add_flight(start, end, when, state)
            status_now = flight.dates[when]
            price = status_now.prices[cabin] if state == "available" else self.rng.randint(60, 480)
            flights.append(
                airline.ReservationFlight(
                    flight_number=flight.flight_number, origin=start, destination=end, date=when, price=price
                )
            )
        people = [self.passenger() for _ in range(passengers)]
        people[0] = airline.Passenger(first_name=user.name.first_name, last_name=user.name.last_name, dob=user.dob)
        free = FREE_BAGS[user.membership][cabin] * passengers
        total_bags = free + extra_bags if extra_bags else self.rng.randint(0, free)
        total = sum(flight.price for flight in flights) * passengers + BAG_FEE * extra_bags
        total += INSURANCE_FEE * passengers if insurance == "yes" else 0
        reservation_id = self.new_id(
            lambda: "".join(self.rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(6))
        )
        reservation = airline.Reservation(
            reservation_id=reservation_id,
            user_id=user.user_id,
            origin=origin,
            destination=destination,
            flight_type="round_trip" if round_trip else "one_way",
            cabin=cabin,
            flights=flights,
            passengers=people,
            payment_history=[airline.Payment(payment_id=self.credit_card(user), amount=total)],
            created_at=created_at or self.created_before(days=2),
            total_baggages=total_bags,
            nonfree_baggages=extra_bags,
            insurance=insurance,
        )
        self.reservations[reservation_id] = reservation
        user.reservations.append(reservation_id)
        return reservation

    def created_before(self, days: int) -> str:
        """A booking time at least ``days`` days before now."""
        moment = NOW - timedelta(days=self.rng.randint(days, days + 12), minutes=self.rng.randint(0, 1000))
        return moment.strftime("%Y-%m-%dT%H:%M:%S")

    def created_recently(self) -> str:
        """A booking time within the last 24 hours."""
        return (NOW - timedelta(minutes=self.rng.randint(30, 1300))).strftime("%Y-%m-%dT%H:%M:%S")

    def db(self) -> Any:
        return airline.FlightDB(flights=self.flights, users=self.users, reservations=self.reservations)


# -- retail ---------------------------------------------------------------------------------------
CATALOGUE = {  # product -> option -> values
    "T-Shirt": {
        "color": ["red", "blue", "black", "white", "green"],
        "size": ["S", "M", "L", "XL"],
        "material": ["cotton", "polyester"],
    },
    "Water Bottle": {
        "capacity": ["500ml", "750ml", "1000ml"],
        "material": ["plastic", "stainless steel", "glass"],
        "color": ["blue", "black", "green", "red"],
    },
    "Desk Lamp": {
        "color": ["white", "black", "silver"],
        "power source": ["AC adapter", "battery", "USB"],
        "brightness": ["low", "medium", "high"],
    },
    "Running Shoes": {
        "size": ["7", "8", "9", "10", "11"],
        "color": ["black", "white", "red", "yellow"],
        "material": ["mesh", "synthetic", "leather"],
    },
    "Backpack": {
        "color": ["black", "grey", "navy", "green"],
        "size": ["small", "medium", "large"],
        "material": ["nylon", "polyester", "leather"],
    },
    "Headphones": {
        "type": ["over-ear", "on-ear", "in-ear"],
        "connectivity": ["wired", "wireless"],
        "color": ["black", "white", "blue", "red"],
    },
    "Coffee Maker": {
        "color": ["black", "stainless steel", "white"],
        "capacity": ["1 cup", "4 cups", "8 cups", "12 cups"],
        "type": ["drip", "espresso", "french press"],
    },
    "Yoga Mat": {
        "thickness": ["4mm", "6mm", "8mm"],
        "material": ["PVC", "TPE", "natural rubber"],
        "color": ["purple", "blue", "green", "pink"],
    },
    "Office Chair": {
        "material": ["fabric", "mesh", "leather"],
        "color": ["black", "gray", "blue"],
        "armrest": ["fixed", "adjustable", "none"],
    },
    "Electric Kettle": {
        "capacity": ["1L", "1.5L", "2L"],
        "material": ["plastic", "glass", "stainless steel"],
        "color": ["white", "black", "silver"],
    },
}
ORDER_STATUSES = ("pending", "processed", "delivered")


def describe_options(options: dict[str, str]) -> str:
    """{'color': 'blue', 'size': 'L'} -> 'color blue, size L'."""
    return ", ".join(f"{name} {value}" for name, value in options.items())


class RetailData(_Records):
    def __init__(self, rng: random.Random):
        super().__init__(rng)
        self.products: dict[str, Any] = {}
        self.users: dict[str, Any] = {}
        self.orders: dict[str, Any] = {}
        self._kinds = rng.sample(sorted(CATALOGUE), len(CATALOGUE))

    def new_kind(self) -> str:
        """A kind of product (a CATALOGUE key) not in the store yet."""
        return self._kinds.pop()

    def options(self, kind: str) -> dict[str, str]:
        return {option: self.rng.choice(values) for option, values in CATALOGUE[kind].items()}

    def add_product(
        self, variants: int = 3, kind: str | None = None, fixed: tuple[tuple[dict[str, str], bool], ...] = ()
    ) -> Any:
        """A product with ``fixed`` (option set, in stock) variants plus random ones up to ``variants``, in random
        order."""
        name = kind or self.new_kind()
        chosen = [(dict(options), available) for options, available in fixed]
        while len(chosen) < variants:
            options = self.options(name)
            if all(options != taken for taken, _ in chosen):
                chosen.append((options, self.rng.random() < 0.8))
        self.rng.shuffle(chosen)
        product = retail.Product(name=name, product_id=self.new_id(lambda: self.digits(10)), variants={})
        for options, available in chosen:
            self.add_variant(product, options, available)
        self.products[product.product_id] = product
        return product

    def variant(self, product: Any, options: dict[str, str]) -> Any:
        return next(variant for variant in product.variants.values() if variant.options == options)

    def add_variant(self, product: Any, options: dict[str, str], available: bool = True) -> Any:
        item_id = self.new_id(lambda: self.digits(10))
        variant = retail.Variant(item_id=item_id, options=dict(options), available=available, price=self.price())
        product.variants[item_id] = variant
        return variant

    def price(self) -> float:
        return round(self.rng.uniform(15, 450), 2)

    def add_user(self, credit_cards: int = 1) -> Any:
        first, last = self.new_name()
        user_id = self.new_id(lambda: f"{first.lower()}_{last.lower()}_{self.digits(4)}")
        methods: dict[str, Any] = {}
        for _ in range(credit_cards):
            card = self.new_id(lambda: f"credit_card_{self.digits(7)}")
            methods[card] = retail.CreditCard(
                source="credit_card", id=card, brand=self.rng.choice(CARD_BRANDS), last_four=self.digits(4)
            )
        paypal = self.new_id(lambda: f"paypal_{self.digits(7)}")
        methods[paypal] = retail.Paypal(source="paypal", id=paypal)
        gift = self.new_id(lambda: f"gift_card_{self.digits(7)}")
        methods[gift] = retail.GiftCard(source="gift_card", id=gift, balance=round(self.rng.uniform(20, 400), 2))
        user = retail.User(
            user_id=user_id,
            name=retail.UserName(first_name=first, last_name=last),
            address=retail.UserAddress(**self.address_fields()),
            email=f"{first.lower()}.{last.lower()}{self.digits(4)}@example.com",
            payment_methods=methods,
            orders=[],
        )
        self.users[user_id] = user
        return user

    def payment_method(self, user: Any, source: str) -> str:
        return next(key for key, method in user.payment_methods.items() if method.source == source)

    def add_order(
        self, user: Any, status: str, items: list[tuple[Any, Any]], payment_method_id: str | None = None
    ) -> Any:
        """An order of ``user`` for (product, variant) pairs, paid in one payment (credit card unless given)."""
        order_id = self.new_id(lambda: f"#W{self.digits(7)}")
        lines = [
            retail.OrderItem(
                name=product.name,
                product_id=product.product_id,
                item_id=variant.item_id,
                price=variant.price,
                options=dict(variant.options),
            )
            for product, variant in items
        ]
        fulfillments = (
            []
            if status == "pending"
            else [retail.OrderFullfilment(tracking_id=[self.digits(12)], item_ids=[line.item_id for line in lines])]
        )
        total = round(sum(line.price for line in lines), 2)
        payer = payment_method_id or self.payment_method(user, "credit_card")
        order = retail.Order(
            order_id=order_id,
            user_id=user.user_id,
            address=user.address.model_copy(),
            items=lines,
            status=status,
            fulfillments=fulfillments,
            payment_history=[retail.OrderPayment(transaction_type="payment", amount=total, payment_method_id=payer)],
        )
        self.orders[order_id] = order
        user.orders.append(order_id)
        return order

    def add_simple_order(self, user: Any, status: str) -> Any:
        """A one-item order of a new product (a distractor)."""
        product = self.add_product(3)
        return self.add_order(user, status, [(product, self.rng.choice(list(product.variants.values())))])

    def db(self) -> Any:
        return retail.RetailDB(products=self.products, users=self.users, orders=self.orders)
