"""The induction task of Gloeckle et al. 2024 (section 4.1): children's stories whose names are random two-token names,
scored by the accuracy on the second token of a name where it repeats.

**The text.** Nothing is downloaded: the stories are generated here from templates, seeded. A story has two or three
characters (a girl, a boy, a cat, ...), each named by a random name; it introduces them, tells four to eight sentences
of what they do together (subject, verb, object, place) and ends; every character's name occurs at least twice. The
paper rewrote TinyStories-like stories; templates give the same shape (a name introduced, then repeated among ordinary
words) with every name position known from generation. All words are lower case; only names have capitals::

    once upon a time, there was a little girl named Kalor. Kalor had a friend named Bimek. one day, Kalor and Bimek
    went to the park to play. Bimek gave the ball to Kalor. in the end, Kalor and Bimek were happy.

**The names and the tokenizer.** A name is a first piece (an upper-case consonant and a vowel: ``Ka``) and a second
piece (a consonant, a vowel and an ending: ``lor``), written as one word (``Kalor``). The text is read by its own
tokenizer, ``data.tokenizer.kind=induction`` (:func:`induction_tokenizer`): a fixed vocabulary of every word the
templates use, every first piece and every second piece as a WordPiece suffix, so that each word is one token and each
name exactly two (``Ka`` ``##lor``) by construction, not by what a BPE happened to learn. The second piece of a repeated
name is then an induction: it is in the context after the same first piece, and otherwise unpredictable, since the
training names pair every first piece with second pieces drawn uniformly. Within a story the characters' first pieces
differ, so that a repeated name's first piece determines its second.

**The split.** The names (every first piece with every second piece) are shuffled once by a fixed seed; a tenth of them
are evaluation names, the rest training names. Training stories (:func:`training_stories`, seed ``data.source.seed``)
use training names only, the fixed evaluation set (:func:`evaluation_stories`, seed :data:`EVAL_SEED`) evaluation names
only, so no evaluation story and no evaluation name pair occurs in training.

**The metric** (:func:`mtp.training.task_scores.name_repeat_accuracy`; ``mtp eval-task``, ``callbacks=task_curve``):
each evaluation story is read teacher-forced after end-of-text (as documents start in training); at every repeated
name, head 1's argmax at the position of the name's first piece is compared with its second piece. Accuracy with a
Wilson 95% interval; the accuracy on the repeated names' first pieces is reported beside it, for contrast.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from mtp.data.tokenizer import eot_id, fixed_vocabulary_tokenizer
from mtp.errors import UserError

if TYPE_CHECKING:
    pass

CONSONANTS = "bdfghjklmnprstvz"
VOWELS = "aeiou"
ENDINGS = "nrlsk"
FIRST_PIECES = tuple(c.upper() + v for c in CONSONANTS for v in VOWELS)
"""80 first pieces: ``Ba`` .. ``Zu``."""
SECOND_PIECES = tuple(c + v + e for c in CONSONANTS[:12] for v in VOWELS for e in ENDINGS)
"""300 second pieces: ``ban`` .. ``ruk``."""
NAME_SPLIT_SEED = 60
EVAL_NAME_FRACTION = 0.1
EVAL_SEED = 1_000_003
"""The evaluation set's seed; training stories use data.source.seed, and evaluation names never occur in them."""
EVAL_STORIES = 1000

KINDS = ("girl", "boy", "cat", "dog", "bird", "bunny", "bear", "fox")
ADJECTIVES = ("little", "big", "red", "blue", "happy", "small", "kind", "shiny", "soft", "old")
THINGS = ("ball", "kite", "book", "cake", "hat", "box", "toy", "apple", "flower", "stick", "shell", "drum")
PLACES = ("park", "garden", "forest", "house", "school", "beach", "river", "hill", "shop", "farm")
FEELINGS = ("happy", "sad", "tired", "proud", "scared", "glad", "angry", "sleepy")
ACTIVITIES = ("play", "run", "sing", "dance", "read", "swim", "jump", "draw")

INTRODUCTIONS = (
    "once upon a time, there was a {J} {K} named {A}.",
    "there was a {J} {K} named {A}.",
    "{A} was a {J} {K} who lived near the {L}.",
)
FRIEND = "{A} had a friend named {B}."
"""How a character after the first is introduced: with an earlier character's name."""
EVENTS = (
    "{A} went to the {L}.",
    "{A} saw a {J} {X} in the {L}.",
    "{A} gave the {X} to {B}.",
    "{A} and {B} played with a {J} {X}.",
    "{A} was very {F}.",
    '{A} said to {B}, "let us go to the {L}."',
    "{B} helped {A} find the {X}.",
    "{A} liked to {V} with {B}.",
    "one day, {A} and {B} went to the {L} to {V}.",
    "{A} looked at {B} and smiled.",
    "{A} was {F} because the {X} was lost.",
    "then {A} found a {J} {X} under a tree.",
)
ENDS = (
    "in the end, {A} and {B} were {F}.",
    "{A} and {B} were best friends.",
    "the end.",
)
MIN_EVENTS, MAX_EVENTS = 4, 8
SLOTS = re.compile(r"\{([A-Z])\}")
WORDS = re.compile(r"\w+|[^\w\s]")
"""How the tokenizer's pre-tokenizer (BERT's) cuts text into words: runs of word characters, single punctuation."""


@dataclass(frozen=True)
class Story:
    """A generated story: its text, its tokens as the induction tokenizer writes them (a name as two pieces, the second
    with its ``##``), and where repeated names end."""

    text: str
    pieces: tuple[str, ...]
    repeats: tuple[int, ...]
    """Indices into ``pieces`` of the second piece of every name occurrence after the name's first one."""


def name_split() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training names, evaluation names), each a list of (first piece, second piece); fixed, disjoint."""
    names = [(first, second) for first in FIRST_PIECES for second in SECOND_PIECES]
    random.Random(NAME_SPLIT_SEED).shuffle(names)
    n_eval = round(len(names) * EVAL_NAME_FRACTION)
    return names[n_eval:], names[:n_eval]


def vocabulary() -> tuple[list[str], list[str]]:
    """(words, suffixes) of the induction tokenizer: every word of the templates and slot lists and every first piece;
    every second piece as a suffix."""
    texts = INTRODUCTIONS + (FRIEND,) + EVENTS + ENDS + KINDS + ADJECTIVES + THINGS + PLACES + FEELINGS + ACTIVITIES
    words = {word for text in texts for word in WORDS.findall(SLOTS.sub(" ", text))}
    return sorted(words) + list(FIRST_PIECES), list(SECOND_PIECES)


def induction_tokenizer() -> Tokenizer:
    """The tokenizer of ``data.tokenizer.kind=induction``: each template word one token, each name two."""
    words, suffixes = vocabulary()
    return fixed_vocabulary_tokenizer(words, suffixes)


def generator_digest() -> str:
    """A hash of everything that shapes the stories (templates, word lists, names, seeds): part of the data cache's
    fingerprint, so that a change to the generator builds new data."""
    parts = (INTRODUCTIONS, FRIEND, EVENTS, ENDS, KINDS, ADJECTIVES, THINGS, PLACES, FEELINGS, ACTIVITIES)
    shape = (parts, FIRST_PIECES, SECOND_PIECES, NAME_SPLIT_SEED, EVAL_NAME_FRACTION, MIN_EVENTS, MAX_EVENTS)
    return hashlib.sha256(repr(shape).encode()).hexdigest()[:16]


def story(rng: random.Random, names: list[tuple[str, str]]) -> Story:
    """One story from ``rng``, its characters named from ``names`` (distinct first pieces within the story)."""
    n_characters = rng.choice((2, 3))
    cast: list[tuple[str, str]] = []
    while len(cast) < n_characters:
        name = rng.choice(names)
        if all(name[0] != other[0] for other in cast):
            cast.append(name)
    sentences: list[tuple[str, dict[str, int]]] = [(rng.choice(INTRODUCTIONS), {"A": 0})]
    for i in range(1, n_characters):
        sentences.append((FRIEND, {"A": rng.randrange(i), "B": i}))
    for _ in range(rng.randint(MIN_EVENTS, MAX_EVENTS)):
        a, b = rng.sample(range(n_characters), 2)
        sentences.append((rng.choice(EVENTS), {"A": a, "B": b}))
    mentions = [0] * n_characters
    for template, cast_slots in sentences:
        for slot in SLOTS.findall(template):
            if slot in cast_slots:
                mentions[cast_slots[slot]] += 1
    for i in range(n_characters):
        if mentions[i] < 2:  # every name repeats at least once
            sentences.append(("{A} was very {F}.", {"A": i}))
    a, b = rng.sample(range(n_characters), 2)
    sentences.append((rng.choice(ENDS), {"A": a, "B": b}))
    return render(rng, cast, sentences)


def render(rng: random.Random, cast: list[tuple[str, str]], sentences: list[tuple[str, dict[str, int]]]) -> Story:
    """The story's text and pieces: character slots (``{A}``, ``{B}``) from ``cast``, the others drawn from their
    word lists."""
    fillers = {"J": ADJECTIVES, "K": KINDS, "X": THINGS, "L": PLACES, "F": FEELINGS, "V": ACTIVITIES}
    texts: list[str] = []
    pieces: list[str] = []
    repeats: list[int] = []
    seen: set[int] = set()
    for template, cast_slots in sentences:
        out = []
        for part in re.split(r"(\{[A-Z]\})", template):
            slot = part[1:-1] if SLOTS.fullmatch(part) else None
            if slot in cast_slots:
                character = cast_slots[slot]
                first, second = cast[character]
                out.append(first + second)
                pieces.extend((first, "##" + second))
                if character in seen:
                    repeats.append(len(pieces) - 1)
                seen.add(character)
            elif slot is not None:
                word = rng.choice(fillers[slot])
                out.append(word)
                pieces.append(word)
            else:
                out.append(part)
                pieces.extend(WORDS.findall(part))
        texts.append("".join(out))
    return Story(" ".join(texts), tuple(pieces), tuple(repeats))


def training_stories(count: int, seed: int) -> list[Story]:
    """``count`` training stories from ``seed``, with training names only."""
    if count < 1:
        raise UserError(f"data.source.documents={count} must be at least 1 (the number of stories to generate).")
    rng = random.Random(seed)
    names = name_split()[0]
    return [story(rng, names) for _ in range(count)]


def evaluation_stories(count: int = EVAL_STORIES, seed: int = EVAL_SEED) -> list[Story]:
    """The fixed evaluation set: ``count`` stories from ``seed``, with evaluation names only."""
    if count < 1:
        raise UserError(f"an induction evaluation needs at least 1 story, not {count}.")
    rng = random.Random(seed)
    names = name_split()[1]
    return [story(rng, names) for _ in range(count)]


def story_ids(tokenizer: Tokenizer, item: Story) -> list[int]:
    """The ids a model reads for ``item``: end-of-text, then the story's tokens (as documents start in training).
    Refuses a tokenizer that does not write the story as its generator did."""
    ids = tokenizer.encode(item.text).ids
    expected = [tokenizer.token_to_id(piece) for piece in item.pieces]
    if ids != expected:
        raise UserError(
            "the model's tokenizer does not write the induction stories as data.tokenizer.kind=induction does (names "
            "as two tokens); evaluate a model trained with data=induction."
        )
    return [eot_id(tokenizer), *ids]
