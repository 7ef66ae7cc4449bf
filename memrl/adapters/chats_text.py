"""What the held-out chats (:mod:`memrl.adapters.chats`) say: names, attribute values, the many ways a person
states a fact or a change of it, and a wide hand-written pool of small talk.

None of it comes from the synthetic task (:mod:`memrl.adapters.synthetic`) or from the training small-talk pool
(:mod:`memrl.adapters.small_talk`): tests check that the names, values and small-talk lines are disjoint, so a
writer that borrows the synthetic task's vocabulary shows up as invented facts here. Small talk states nothing a
memory should keep: no names of third persons, no numbers, no attribute values.
"""

from __future__ import annotations

from dataclasses import dataclass


def words(text: str) -> tuple[str, ...]:
    """A whitespace-separated list of names or values as a tuple."""
    return tuple(text.split())


NAMES = words(
    "Amelie Bram Cecile Dmitri Farah Gideon Halima Ilse Joaquin Katya Lorenzo Mireille Nadim Odile Pavel Quinn "
    "Rania Soren Thandi Ulrike Valentin Wanjiru Xavier Yara Zeno Beatriz Casimir Delphine Emeka Fiona Gustavo "
    "Henrike Idris Jolene Kwame Linnea Matteo Nalani Orla Piotr"
)


@dataclass(frozen=True)
class ChatAttr:
    """One personal attribute: its values, how its holder states it and a change of it (first person), the fact
    a memory should keep, and the questions about it now, before the change, and when it never changed."""

    name: str
    values: tuple[str, ...]
    first: tuple[str, ...]  # "{v}": the value
    change: tuple[str, ...]  # "{old}" → "{v}"
    fact: str  # "{p}": the person
    now: str
    before: str
    never: str


ATTRS = (
    ChatAttr(
        "city",
        words("Porto Lyon Gdansk Valencia Krakow Antwerp Bergen Tallinn Seville Graz Leeds Trieste Bilbao Ghent Turku "
           "Utrecht Malmo Bordeaux Kyoto Busan Cork Geneva"),
        (
            "I live in {v}, right by the river.",
            "Home is {v} these days, I love the little bakeries.",
            "We've been in {v} for a while and it still surprises me.",
            "Life in {v} is pretty relaxed, honestly.",
            "I'm based in {v}, so the winters are long.",
            "My flat in {v} has the tiniest kitchen.",
        ),
        (
            "We finally moved out of {old} - I live in {v} now!",
            "Big news: I left {old} and moved to {v}.",
            "Packed up everything in {old}; {v} is home now.",
            "I relocated from {old} to {v} last month, still unpacking.",
            "No more {old} for me, I've settled in {v}.",
            "Goodbye {old}, hello {v}! The move went fine.",
        ),
        "{p} lives in {v}.",
        "Which city does {p} live in now?",
        "Which city did {p} live in before moving?",
        "Which city does {p} live in?",
    ),
    ChatAttr(
        "job",
        words("carpenter pharmacist architect librarian electrician veterinarian translator paramedic geologist "
           "welder photographer accountant midwife locksmith zookeeper cartographer"),
        (
            "I work as {a} {v}, long hours but I like it.",
            "Being {a} {v} keeps me busy most weeks.",
            "I've been {a} {v} for years now.",
            "Work was hectic, that's {a} {v}'s life for you.",
            "As {a} {v} I rarely get a quiet Monday.",
        ),
        (
            "I quit being {a_old} {old} - I'm {a} {v} now.",
            "Career change! No longer {a_old} {old}, I started as {a} {v}.",
            "After years as {a_old} {old} I retrained as {a} {v}.",
            "I handed in my notice as {a_old} {old}; first week as {a} {v} went well.",
            "Turns out I'm happier as {a} {v} than I ever was as {a_old} {old}.",
        ),
        "{p} works as {a} {v}.",
        "What is {p}'s job now?",
        "What job did {p} have before the career change?",
        "What is {p}'s job?",
    ),
    ChatAttr(
        "sport",
        words("fencing rowing climbing badminton karate surfing cycling archery volleyball judo curling squash "
           "handball kayaking"),
        (
            "I do {v} twice a week, it clears my head.",
            "{V} is my sport, I never miss a session.",
            "I've gotten really into {v} lately.",
            "My {v} club meets on Thursdays.",
            "Nothing beats {v} after a long day.",
        ),
        (
            "I gave up {old} and took up {v} instead.",
            "No more {old} for me - I switched to {v}.",
            "These days it's {v}, not {old}.",
            "I dropped {old}; {v} is my thing now.",
            "My knees hated {old}, so I moved on to {v}.",
        ),
        "{p} does {v}.",
        "Which sport does {p} do now?",
        "Which sport did {p} do before switching?",
        "Which sport does {p} do?",
    ),
    ChatAttr(
        "instrument",
        words("cello trumpet accordion banjo harp clarinet ukulele oboe saxophone mandolin flute trombone"),
        (
            "I play the {v} in a little band.",
            "I've been practising the {v} every evening.",
            "The {v} is my instrument, my neighbours are very patient.",
            "Band rehearsal tonight, I'm bringing my {v}.",
        ),
        (
            "I sold my {old} and bought a {v}.",
            "I stopped playing the {old}; it's the {v} now.",
            "Switched from the {old} to the {v}, harder than it looks.",
            "The {old} is gathering dust, I only play the {v} these days.",
        ),
        "{p} plays the {v}.",
        "Which instrument does {p} play now?",
        "Which instrument did {p} play before?",
        "Which instrument does {p} play?",
    ),
    ChatAttr(
        "language",
        words("Swahili Finnish Korean Portuguese Icelandic Turkish Greek Hungarian Tagalog Welsh Polish Vietnamese"),
        (
            "I'm learning {v}, the grammar is wild.",
            "My {v} lessons are going slowly but surely.",
            "I practise {v} on the bus every morning.",
            "I signed up for a {v} course at the community centre.",
        ),
        (
            "I dropped {old} and started learning {v}.",
            "Gave up on {old}; {v} is my new language project.",
            "I switched my evening class from {old} to {v}.",
            "Enough {old} for now - I'm studying {v} instead.",
        ),
        "{p} is learning {v}.",
        "Which language is {p} learning now?",
        "Which language was {p} learning before?",
        "Which language is {p} learning?",
    ),
    ChatAttr(
        "pet",
        words("Pumpkin Clementine Bramble Tinsel Marzipan Figaro Pretzel Juno Basil Crumpet Dumpling Sprocket "
           "Velvet Zephyr Quill"),
        (
            "My dog {v} chewed my slippers again.",
            "I adopted a cat, her name is {v}.",
            "{v}, my rabbit, is the boss of the house.",
            "Took {v}, my dog, to the vet this morning.",
            "My parrot {v} learned a new whistle.",
        ),
        (),  # a pet's name never changes here
        "{p}'s pet is called {v}.",
        "",
        "",
        "What is the name of {p}'s pet?",
    ),
)  # fmt: skip

# Small talk of the held-out chats: states nothing worth remembering. "{other}": the other speaker's name.
SMALL_TALK = (
    "Traffic was terrible today.",
    "Oh nice!",
    "Makes sense.",
    "I burned the pasta again, classic me.",
    "Haha, that's so you.",
    "Ugh, Mondays.",
    "Did you sleep well?",
    "Not really, the neighbours had a party.",
    "I could use a holiday.",
    "Same here, honestly.",
    "How was your weekend?",
    "Quiet, mostly laundry and naps.",
    "That sounds lovely.",
    "I finally fixed the wobbly table.",
    "Good for you!",
    "It's pouring again.",
    "The sunset yesterday was unreal.",
    "I keep forgetting my umbrella.",
    "We should catch up properly soon.",
    "Definitely, let's find a date.",
    "I'm so behind on emails.",
    "Tell me about it.",
    "My phone died halfway through the day.",
    "Have you tried turning it off and on again?",
    "Very funny, {other}.",
    "I spilled coffee on my shirt before a meeting.",
    "Oof, that's the worst.",
    "Any plans for tonight?",
    "Just a quiet night in.",
    "I'm thinking of baking something.",
    "Save me a slice!",
    "The internet has been so slow.",
    "I know, it drives me mad.",
    "Did you see the moon last night?",
    "No, I missed it.",
    "I tried a new recipe and it flopped.",
    "Next time it'll work.",
    "Thanks, that's kind.",
    "Long day, but a good one.",
    "Glad to hear it!",
    "I need a nap.",
    "Coffee first, then life.",
    "True words.",
    "I cleaned out the garage at last.",
    "Find anything interesting?",
    "Mostly old cables and one sad glove.",
    "Classic.",
    "The shop was out of bread again.",
    "That keeps happening lately.",
    "I think spring is finally coming.",
    "About time!",
    "My plants are actually alive this year.",
    "Impressive, mine never make it.",
    "You just have to talk to them.",
    "I'll try that, {other}.",
    "I watched a documentary about octopuses.",
    "They're so clever, right?",
    "Absolutely fascinating creatures.",
    "I got lost on the way to the post office.",
    "How do you even manage that?",
    "Talent, I guess.",
    "It's been a strange week.",
    "Hope the next one's calmer.",
    "Me too.",
    "I lost my keys for an hour this morning.",
    "Where were they?",
    "In the fridge, don't ask.",
    "Ha! I won't.",
    "I'm craving soup.",
    "Soup weather for sure.",
    "The bus waited for me today, a small miracle.",
    "Small kindnesses make the day.",
    "So true.",
    "I started a puzzle with a thousand pieces.",
    "Brave. How far along are you?",
    "Only the edges so far.",
    "Good luck with it.",
    "I stayed up way too late reading.",
    "Was it worth it?",
    "Every page.",
    "Wait, really?",
    "No way!",
    "Oh, I totally forgot about that.",
    "Happens to the best of us.",
    "I'm running late, talk later?",
    "Sure, no rush.",
    "Sorry, I was in the shower.",
    "All good.",
    "It's so windy out there.",
    "Hold on to your hat!",
    "I tried meditating this morning.",
    "Did it help?",
    "For about five minutes.",
    "That counts.",
    "My neighbour's kid waved at me from the window.",
    "Cute!",
    "I'm addicted to this new crossword app.",
    "Send me the link sometime.",
    "Will do.",
    "I rearranged the living room.",
    "Post a picture when you can.",
    "I went for a long walk to clear my head.",
    "Walking always helps me too.",
    "The market smelled amazing today.",
    "I love market days.",
    "I'm trying to drink more water.",
    "Same resolution here.",
    "That movie last night was way too long.",
    "Three hours is a lot.",
    "I fell asleep halfway through.",
    "I would have too.",
    "Hope you're doing okay, {other}.",
    "I'm fine, just tired.",
    "Take it easy tonight.",
    "Thanks, I will.",
    "Good morning!",
    "Morning! How's it going?",
    "Not bad at all.",
    "Happy Friday!",
    "Finally!",
    "I found a great little café around the corner.",
    "Let's go there sometime.",
    "I'm terrible at replying, sorry.",
    "No worries at all.",
    "The heating broke again.",
    "Wear two jumpers until it's fixed.",
    "I painted my nails a wild shade for fun.",
    "Bold choice, I like it.",
    "Anyway, enough about me.",
    "Right, where were we?",
    "I've been humming that song all day.",
    "It's catchy, isn't it?",
    "I need new shoes, mine have holes.",
    "The eternal struggle.",
    "Lovely chatting, as always.",
    "Likewise, talk soon!",
)
