"""How the synthetic task says its facts: ``fixed`` templates, or ``varied`` ones (moves, switches, replacements,
in the first person, with the old value named or not).

``fixed`` states an attribute as "Mia lives in Paris." and every change as "Mia now lives in Rome.": a memory
writer trained only on that learns the keyword "now", not memory. ``varied`` draws each statement from a pool
of phrasings ("Mia moved from Paris to Rome.", "I relocated to Rome.", "Mia is not in Paris anymore, Mia lives in
Rome."); a statement about a speaker said by that speaker is in the first person. The pools are split like the
task's values: ``train`` and ``test`` use disjoint phrasings, so a held-out episode's sentences were never
trained on.

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
    third, mine = rng.choice(_pool(first if old is None else changes, split))
    template = mine if speaker == person else third
    text = template.format(p=person, v=value, old=old or "")
    return text[0].upper() + text[1:]
