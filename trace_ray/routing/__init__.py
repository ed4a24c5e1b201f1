"""Step 4 of TRACE: routing each task to the capability adapter that helps it.

``router=logit`` (:mod:`trace_ray.routing.logit_router`) is the paper's
training-free router. The frozen base model reads a routing prompt: the
task's first observation (system policy, shortened, and the user's request),
then one option per capability (its name, description and one successful
trajectory from its synthetic environment, compacted) and a last ``base``
option meaning "no adapter". Each option is labelled by a letter that is a
single token; the option whose label token gets the highest next-token logit
after the prompt wins. The decision keeps every option's logit and the
softmax over them, not only the winner. ``base`` means the base model
answers alone; any other choice means W' = W + B_c A_c with that adapter.
"""

from trace_ray.routing.logit_router import (
    BASE,
    BASE_OPTION,
    LogitRouter,
    RouteDecision,
    RouteOption,
    decide,
    label_tokens,
    routing_messages,
)

__all__ = [
    "BASE",
    "BASE_OPTION",
    "LogitRouter",
    "RouteDecision",
    "RouteOption",
    "decide",
    "label_tokens",
    "routing_messages",
]
