"""What the chats adapter's **training** chats say (``split: train`` / ``validation``): the held-out chats' shape
(:mod:`memrl.adapters.chats_text`) with none of their words.

A writer trained on the synthetic task's templates missed most of the held-out chats' first statements and
changes: it learned the templates, not how people state a fact or a change.
These chats say the same kinds of things (where one lives, the job, a sport, an instrument, a language, a pet, a
hobby) in a first person of their own, with changes that name the old value and changes that do not. Names,
values and wordings share nothing with the held-out pool, and small talk comes from the training pool
(:mod:`memrl.adapters.small_talk`); tests check both, so the held-out chats stay a test of generalisation.
"""

from __future__ import annotations

from memrl.adapters.chats_text import ChatAttr, words

NAMES = words(
    "Alba Benedikt Colette Dario Elif Florian Greta Hamid Ines Jonas Kiri Leandro Maren Nikos Oona Pablo Rosalind "
    "Stellan Talia Umberto Vesna Wilhelm Ximena Yusuf Zora Anouk Bartek Chiara Desmond Elodie Fergus Hanne Ivo "
    "Jasmijn Kenji Lotte Mateus Noor Oskar Priyanka"
)

ATTRS = (
    ChatAttr(
        "city",
        words("Oslo Nantes Riga Vilnius Zagreb Ljubljana Naples Verona Salzburg Bruges Aarhus Tampere Galway Cardiff "
           "Dundee Hamburg Leipzig Marseille Toulouse Lisbon Sapporo Osaka Hanoi Adelaide"),
        (
            "I've got a little place in {v} now, near the old market.",
            "{V} is where I live, it rains a lot.",
            "Living in {v} has its perks, the food mostly.",
            "My apartment in {v} gets the morning sun.",
            "I rent a room in {v}, close to the station.",
            "I grew to love {v}, I've lived here for ages.",
            "Our street in {v} is so noisy at night.",
        ),
        (
            "Guess what, I moved from {old} to {v}!",
            "I finally said goodbye to {old}, I'm living in {v} now.",
            "New city for me: {v}. {Old} feels like ages ago.",
            "We left {old} behind and found a flat in {v}.",
            "I live in {v} now, the move was exhausting.",
            "Just moved to {v}, boxes everywhere.",
            "Not living in {old} anymore, I'm in {v} these days.",
        ),
        "{p} lives in {v}.",
        "Which city does {p} live in now?",
        "Which city did {p} live in before moving?",
        "Which city does {p} live in?",
    ),
    ChatAttr(
        "job",
        words("plumber baker nurse florist surveyor chemist tailor butcher dentist firefighter journalist optician "
           "potter sommelier beekeeper glazier"),
        (
            "I'm {a} {v}, so early starts are normal for me.",
            "My job? I'm {a} {v}, have been for ages.",
            "Being {a} {v} pays the bills.",
            "I work as {a} {v} at a small shop in town.",
            "Long shift today, the life of {a} {v}.",
            "I trained as {a} {v} and I still enjoy it.",
        ),
        (
            "I'm not {a_old} {old} anymore, I became {a} {v}.",
            "Started a new job as {a} {v} this week!",
            "I left my {old} job to work as {a} {v}.",
            "I've switched careers, I'm {a} {v} now.",
            "No more {old} work for me, I'm {a} {v} these days.",
            "Big change: I work as {a} {v} now.",
        ),
        "{p} works as {a} {v}.",
        "What is {p}'s job now?",
        "What job did {p} have before the career change?",
        "What is {p}'s job?",
    ),
    ChatAttr(
        "sport",
        words("tennis hockey boxing sailing skiing swimming golf rugby cricket netball lacrosse snowboarding diving "
           "taekwondo"),
        (
            "I play {v} every weekend with friends.",
            "{V} is my thing, I train three times a week.",
            "I joined a {v} team last year.",
            "I'm hooked on {v}, honestly.",
            "Had {v} practice this morning, I'm wrecked.",
            "My favourite way to unwind is {v}.",
        ),
        (
            "I quit {old}; these days I do {v}.",
            "I've taken up {v} instead of {old}.",
            "I do {v} now, I got bored of {old}.",
            "New sport for me: {v}!",
            "I switched to {v}, it's way more fun.",
            "Stopped doing {old} after my injury, I do {v} now.",
        ),
        "{p} does {v}.",
        "Which sport does {p} do now?",
        "Which sport did {p} do before switching?",
        "Which sport does {p} do?",
    ),
    ChatAttr(
        "instrument",
        words("violin piano drums guitar bassoon viola tuba harmonica xylophone bagpipes sitar marimba"),
        (
            "I play the {v}, badly but happily.",
            "I've had {v} lessons since I was a kid.",
            "Practising the {v} is how I relax.",
            "I bought a second-hand {v} and I play it every day.",
            "Our little group needs me on the {v} on Friday.",
        ),
        (
            "I sold the {old}; I'm learning the {v} now.",
            "I switched instruments, it's the {v} for me now.",
            "I play the {v} these days instead of the {old}.",
            "Put the {old} away for good, the {v} is more fun.",
            "I picked up the {v} now, my new obsession.",
        ),
        "{p} plays the {v}.",
        "Which instrument does {p} play now?",
        "Which instrument did {p} play before?",
        "Which instrument does {p} play?",
    ),
    ChatAttr(
        "language",
        words("Spanish Italian German Japanese Dutch Arabic Russian Hindi Czech Danish Norwegian Mandarin Hebrew "
           "Romanian Thai"),
        (
            "I'm studying {v} with an app every night.",
            "I take {v} classes on Wednesdays.",
            "Learning {v} is harder than I expected.",
            "My {v} teacher is very strict.",
            "I've started learning {v}, wish me luck.",
        ),
        (
            "I stopped learning {old}, I'm on {v} now.",
            "I swapped my {old} classes for {v}.",
            "I'm learning {v} now, {old} didn't stick.",
            "New language: {v}! I quit {old}.",
            "I'm studying {v} these days.",
        ),
        "{p} is learning {v}.",
        "Which language is {p} learning now?",
        "Which language was {p} learning before?",
        "Which language is {p} learning?",
    ),
    ChatAttr(
        "pet",
        words("Biscuit Pepper Noodle Mochi Waffle Ziggy Olive Rocket Peanut Button Truffle Nugget Maple Pickle Wasabi"),
        (
            "My cat {v} knocked a glass off the table.",
            "I have a puppy called {v}, pure chaos.",
            "{v}, my hamster, escaped again.",
            "Walked {v}, my dog, for an hour this morning.",
            "My tortoise {v} is older than me.",
        ),
        (),
        "{p}'s pet is called {v}.",
        "",
        "",
        "What is the name of {p}'s pet?",
    ),
    ChatAttr(
        "hobby",
        words("knitting pottery painting baking birdwatching chess woodworking juggling origami calligraphy "
           "embroidery stargazing"),
        (
            "My hobby is {v}, it keeps me sane.",
            "I spend my evenings on {v}.",
            "I'm really into {v} at the moment.",
            "I signed up for a {v} club.",
            "Weekends are for {v} in my house.",
        ),
        (
            "I've dropped {old}, my hobby is {v} now.",
            "I'm into {v} now instead of {old}.",
            "Gave {old} a rest, {v} is my new hobby.",
            "New hobby: {v}!",
            "These days I spend my free time on {v}.",
        ),
        "{p}'s hobby is {v}.",
        "What is {p}'s hobby now?",
        "What was {p}'s hobby before?",
        "What is {p}'s hobby?",
    ),
)  # fmt: skip
