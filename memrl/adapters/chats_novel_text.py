"""Attributes of a kind no chat of the training pool states (``kinds: novel`` of :mod:`memrl.adapters.chats`).

The held-out chats (:mod:`memrl.adapters.chats_text`) ask about the kinds the training chats state (city, job,
sport, instrument, language, pet) in new words. These ask about kinds the training chats never state: the car a
person drives, a drink, an author, an evening course, a sibling's name, an allergy, a football club. A writer
that learned its training templates rather than how people state a fact writes such a turn into one of those
templates ("Amelie's pet is called Saab."), which the invented-fact rule (:mod:`memrl.memory.faithfulness`) and
the never-changed questions show. Names and small talk are the held-out chats'; values and wordings share no word
with either pool (tests check it).
"""

from __future__ import annotations

from memrl.adapters.chats_text import ChatAttr, words

ATTRS = (
    ChatAttr(
        "car",
        words("Volvo Skoda Subaru Fiat Saab Lancia Citroen Dacia Mazda Opel Kia Rover Lada Suzuki Alfa Mini"),
        (
            "I drive {a} {v}, old but it never lets me down.",
            "My {v} needs new tyres before winter.",
            "The {v} I drive is parked on the street all week.",
            "I took my {v} to the coast on Sunday.",
            "I've had my {v} long enough to name it.",
        ),
        (
            "Sold the {old}, I drive {a} {v} now.",
            "I traded in my {old} for {a} {v} last week.",
            "Goodbye {old}: the new car is {a} {v}.",
            "No more {old} for me, I picked up {a} {v}.",
            "I swapped my {old} for {a} {v}, much smoother.",
        ),
        "{p} drives {a} {v}.",
        "Which car does {p} drive now?",
        "Which car did {p} drive before?",
        "Which car does {p} drive?",
    ),
    ChatAttr(
        "drink",
        words("espresso kombucha rooibos matcha lemonade cider chai horchata kefir mate lassi oolong cortado "
           "buttermilk ayran"),
        (
            "I can't start the day without {v}.",
            "A glass of {v} is my little treat.",
            "I'm hooked on {v}, I have it every evening.",
            "Nothing beats cold {v} after a walk.",
            "{V} is my drink of choice, always.",
        ),
        (
            "I've gone off {old}, it's {v} for me now.",
            "Switched from {old} to {v}, feeling great.",
            "These days I drink {v}, not {old}.",
            "Bye {old}, I'm all about {v} now.",
        ),
        "{p}'s favourite drink is {v}.",
        "What is {p}'s favourite drink now?",
        "What was {p}'s favourite drink before?",
        "What is {p}'s favourite drink?",
    ),
    ChatAttr(
        "author",
        words("Tolstoy Murakami Austen Borges Dickens Woolf Calvino Kafka Atwood Achebe Chekhov Lispector Ishiguro "
           "Saramago Pessoa"),
        (
            "I'm rereading {v}, nobody writes like that.",
            "My favourite author is {v}, hands down.",
            "I've read everything by {v}, twice.",
            "If I'm on a train I've got some {v} with me.",
            "{V} is the author I always come back to.",
        ),
        (
            "I used to read only {old}, but now it's all {v}.",
            "{V} has replaced {old} as my favourite author.",
            "I'm done with {old}; {v} is the one now.",
            "Forget {old}, I've discovered {v}.",
        ),
        "{p}'s favourite author is {v}.",
        "Who is {p}'s favourite author now?",
        "Who was {p}'s favourite author before?",
        "Who is {p}'s favourite author?",
    ),
    ChatAttr(
        "course",
        words("astronomy economics statistics archaeology linguistics botany philosophy sculpture robotics "
           "nutrition oceanography bookbinding geometry"),
        (
            "I signed up for an evening course in {v}.",
            "My {v} course meets on Thursdays.",
            "I'm taking {v} classes after work.",
            "Homework for my {v} course is piling up.",
        ),
        (
            "I dropped {old} and started a course in {v}.",
            "The {old} classes ended, now I'm taking {v}.",
            "I switched my evening course from {old} to {v}.",
            "{V} instead of {old} this term, much more fun.",
        ),
        "{p} is taking a course in {v}.",
        "What course is {p} taking now?",
        "What course was {p} taking before?",
        "What course is {p} taking?",
    ),
    ChatAttr(
        "sibling",
        words("Rosalie Tobias Magnus Elsa Jorge Ingrid Felix Agnes Tomas Hugo Leonie Anton Mila Rafael Sabine Emil"),
        (
            "My twin {v} visited this weekend.",
            "{V} is my only sibling, we talk every day.",
            "I had dinner at my sibling {v}'s place.",
            "My big sibling {v} borrowed my bike again.",
        ),
        (),  # a sibling's name never changes here
        "{p}'s sibling is called {v}.",
        "",
        "",
        "What is the name of {p}'s sibling?",
    ),
    ChatAttr(
        "allergy",
        words("peanuts shellfish pollen penicillin gluten sesame latex eggs strawberries kiwi mustard celery "
           "walnuts almonds wasps"),
        (
            "I'm allergic to {v}, so I read every label.",
            "Careful with {v} around me, I react badly.",
            "My allergy to {v} flared up again.",
            "I can't go near {v}, doctor's orders.",
        ),
        (),
        "{p} is allergic to {v}.",
        "",
        "",
        "What is {p} allergic to?",
    ),
    ChatAttr(
        "club",
        words("Feyenoord Benfica Celtic Juventus Galatasaray Boca Ajax Anderlecht Fenerbahce Olympiacos Palmeiras "
           "Flamengo Besiktas Dortmund"),
        (
            "I support {v}, win or lose.",
            "{V} lost again, I'm heartbroken.",
            "Got tickets to see {v} play on Saturday.",
            "My whole family are {v} fans.",
        ),
        (),
        "{p} supports {v}.",
        "",
        "",
        "Which football club does {p} support?",
    ),
)  # fmt: skip
