"""How the synthetic task says its facts: ``fixed`` templates, or ``varied`` ones (moves, switches, replacements,
in the first person, with the old value named or not).

``fixed`` states an attribute as "Mia lives in Paris." and every change as "Mia now lives in Rome.": a memory
writer trained only on that learns the keyword "now", not memory. ``varied`` draws each statement from a pool
of phrasings ("Mia moved from Paris to Rome.", "I relocated to Rome.", "Mia is not in Paris anymore, Mia lives in
Rome."); a statement about a speaker said by that speaker is in the first person. The pools are split like the
task's values: ``train`` and ``test`` use disjoint phrasings, so a held-out episode's sentences were never
trained on. In the train split a quarter of first statements are worded as a change from a value the
conversation never stated: their gold operation is still ADD, so that a writer learns to look at its memory
before it replaces anything.

Every history turn also carries its gold memory operation in its metadata (:mod:`memrl.memory.gold`).
"""

from __future__ import annotations

import random

# attribute -> (first statements, changes); each entry is (third person, first person).
_VARIED: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {
    "city": (
        [("{p} lives in {v}.", "I live in {v}."), ("{p} is based in {v}.", "I am based in {v}."),
         ("{p}'s home is in {v}.", "My home is in {v}."), ("{p} has a flat in {v}.", "I have a flat in {v}.")],
        [("{p} moved to {v}.", "I moved to {v}."), ("{p} moved from {old} to {v}.", "I moved from {old} to {v}."),
         ("{p} relocated to {v}.", "I relocated to {v}."),
         ("{p} left {old} and lives in {v} now.", "I left {old}, I live in {v} now."),
         ("{p} now lives in {v}.", "I live in {v} now."),
         ("{p} is not in {old} anymore, {p} lives in {v}.", "I'm not in {old} anymore, I live in {v}.")],
    ),
    "colour": (
        [("{p}'s favourite colour is {v}.", "My favourite colour is {v}."),
         ("{p} loves the colour {v} most.", "I love the colour {v} most.")],
        [("{p}'s favourite colour changed from {old} to {v}.", "My favourite colour changed from {old} to {v}."),
         ("{p} likes {v} best these days.", "I like {v} best these days."),
         ("{p}'s favourite colour is now {v}.", "My favourite colour is {v} now."),
         ("{p} switched favourite colours to {v}.", "I switched my favourite colour to {v}.")],
    ),
    "pet_name": (
        [("{p}'s pet is called {v}.", "My pet is called {v}."), ("{p} has a pet named {v}.", "I have a pet named {v}.")],
        [("{p} renamed the pet from {old} to {v}.", "I renamed my pet from {old} to {v}."),
         ("{p} replaced the old pet with a new one called {v}.", "I got a new pet called {v} instead of {old}."),
         ("{p}'s pet is now called {v}.", "My pet is called {v} now."),
         ("{p}'s pet got a new name: {v}.", "My pet has a new name: {v}.")],
    ),
    "job": (
        [("{p} is a {v}.", "I am a {v}."), ("{p} works as a {v}.", "I work as a {v}.")],
        [("{p} switched jobs and works as a {v} now.", "I switched jobs, I work as a {v} now."),
         ("{p} quit being a {old} and became a {v}.", "I quit being a {old} and became a {v}."),
         ("{p} is now a {v}.", "I am a {v} now."),
         ("{p} started a new job as a {v}.", "I started a new job as a {v}.")],
    ),
    "age": ([("{p} is {v} years old.", "I am {v} years old."), ("{p} turned {v} this year.", "I turned {v} this year.")], []),
    "siblings": (
        [("{p} has {v} siblings.", "I have {v} siblings."), ("{p} grew up with {v} siblings.", "I grew up with {v} siblings.")],
        [("{p} has {v} siblings now, not {old}.", "I have {v} siblings now, not {old}."),
         ("With the new baby, {p} has {v} siblings.", "With the new baby, I have {v} siblings."),
         ("{p} now has {v} siblings.", "I have {v} siblings now.")],
    ),
    "pets": (
        [("{p} has {v} pets.", "I have {v} pets."), ("{p} keeps {v} pets at home.", "I keep {v} pets at home.")],
        [("{p} went from {old} to {v} pets.", "I went from {old} to {v} pets."),
         ("{p} has {v} pets at this point.", "I have {v} pets at this point."),
         ("{p} now has {v} pets.", "I have {v} pets now.")],
    ),
    "savings": (
        [("{p} has {v} dollars in savings.", "I have {v} dollars in savings."),
         ("{p} saved {v} dollars so far.", "I saved {v} dollars so far.")],
        [("{p}'s savings went from {old} to {v} dollars.", "My savings went from {old} to {v} dollars."),
         ("{p} has {v} dollars saved now.", "I have {v} dollars saved now."),
         ("{p} now has {v} dollars in savings.", "I have {v} dollars in savings now.")],
    ),
}  # fmt: skip
# More wordings for the train split only (the test pools above are unchanged): with one or two wordings per
# attribute to imitate, the writer skipped (NOOP) many held-out first statements; more train wordings are what a
# writer needs to recognise a statement it has never seen (docs/experiments.md).
_TRAIN_ONLY: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {
    "city": (
        [("{p} resides in {v}.", "I reside in {v}."), ("{p} calls {v} home.", "I call {v} home."),
         ("{p} rents an apartment in {v}.", "I rent an apartment in {v}."), ("Home for {p} is {v}.", "Home for me is {v}.")],
        [("{p} packed up and went to live in {v}.", "I packed up and went to live in {v}."),
         ("{p} traded {old} for {v}.", "I traded {old} for {v}."),
         ("{p} does not live in {old} any more; {p} is in {v} now.", "I don't live in {old} any more; I'm in {v} now."),
         ("{p} settled in {v} after leaving {old}.", "I settled in {v} after leaving {old}.")],
    ),
    "colour": (
        [("{p} really likes {v} the most.", "I really like {v} the most."),
         ("{v} is the colour {p} prefers.", "{v} is the colour I prefer."),
         ("The colour {p} likes best is {v}.", "The colour I like best is {v}.")],
        [("{p} prefers {v} now instead of {old}.", "I prefer {v} now instead of {old}."),
         ("{p} went off {old}; {v} is the favourite now.", "I went off {old}; {v} is my favourite now."),
         ("{p}'s new favourite colour is {v}.", "My new favourite colour is {v}.")],
    ),
    "pet_name": (
        [("{p} owns a pet called {v}.", "I own a pet called {v}."),
         ("{p} looks after a pet named {v}.", "I look after a pet named {v}.")],
        [("{p} calls the pet {v} now instead of {old}.", "I call my pet {v} now instead of {old}."),
         ("{p} adopted a new pet, {v}, after {old}.", "I adopted a new pet, {v}, after {old}."),
         ("{p}'s pet goes by {v} these days.", "My pet goes by {v} these days.")],
    ),
    "job": (
        [("{p} earns a living as a {v}.", "I earn a living as a {v}."), ("{p} is employed as a {v}.", "I am employed as a {v}."),
         ("By trade, {p} is a {v}.", "By trade, I am a {v}.")],
        [("{p} left the {old} job and is a {v} now.", "I left my {old} job and I am a {v} now."),
         ("{p} changed careers to become a {v}.", "I changed careers to become a {v}."),
         ("{p} got hired as a {v}.", "I got hired as a {v}.")],
    ),
    "age": ([("{p} is aged {v}.", "I am aged {v}."), ("{p} celebrated birthday number {v}.", "I celebrated birthday number {v}.")], []),
    "siblings": (
        [("{p} comes from a family with {v} siblings.", "I come from a family with {v} siblings."),
         ("{p} has {v} brothers and sisters.", "I have {v} brothers and sisters.")],
        [("{p}'s sibling count is {v} now.", "My sibling count is {v} now."),
         ("{p} counts {v} siblings these days.", "I count {v} siblings these days.")],
    ),
    "pets": (
        [("{p} owns {v} pets.", "I own {v} pets."), ("{p} looks after {v} pets.", "I look after {v} pets.")],
        [("{p} has {v} pets these days, no longer {old}.", "I have {v} pets these days, no longer {old}."),
         ("{p}'s pet count changed to {v}.", "My pet count changed to {v}.")],
    ),
    "savings": (
        [("{p} put aside {v} dollars.", "I put aside {v} dollars."),
         ("{p} keeps {v} dollars in the bank.", "I keep {v} dollars in the bank.")],
        [("{p}'s savings are at {v} dollars now.", "My savings are at {v} dollars now."),
         ("{p} had {old} dollars saved and has {v} now.", "I had {old} dollars saved and have {v} now.")],
    ),
}  # fmt: skip
PHRASINGS = ("fixed", "varied")


def _pool(entries: list[tuple[str, str]], split: str) -> list[tuple[str, str]]:
    # Even positions → train, odd → test (as the task's values); a one-entry pool is shared.
    own = entries[0 if split == "train" else 1 :: 2]
    return own or entries


def varied_text(
    attr: str, person: str, value: str, old: str | None, speaker: str, split: str, rng: random.Random
) -> str:
    """One varied statement: a first statement (``old`` is None) or a change, first person if ``speaker`` is
    ``person``."""
    first, changes = _VARIED[attr]
    pool = _pool(first if old is None else changes, split)
    if split == "train":
        more_first, more_changes = _TRAIN_ONLY[attr]
        pool = pool + (more_first if old is None else more_changes)
    third, mine = rng.choice(pool)
    template = mine if speaker == person else third
    text = template.format(p=person, v=value, old=old or "")
    return text[0].upper() + text[1:]
