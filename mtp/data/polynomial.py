"""Polynomial arithmetic in F7[X]/(X^5), the algorithmic task of Gloeckle et al. 2024 (section 4.2).

A polynomial has 5 coefficients mod 7 (degree below 5) and is written as those 5 digits, the constant first:
``3 + 2X + 6X^4`` is ``32006``. Four operations, each truncated at X^5 (terms of degree 5 and above dropped):

- negation ``-A``;
- addition ``(A+B)``;
- multiplication ``(A*B)``;
- composition ``(AoB)``: A(B(X)).

A problem with k operations is drawn recursively: with k = 0 an operand, uniform among the 7^5 polynomials; else an
operator uniform among the four, then (binary operators) the k - 1 remaining operations split between the two sides,
the left side's share uniform in 0..k-1. Its text, one document, states the problem and its answer::

    <problem>=<answer>\\n          e.g. (12000+60000)=02000\\n

The answer is always 5 digits and a newline ends it, so a reply is right when its text up to the first newline is
the answer (a byte-level tokenizer reads each character as one token). Training documents have ``min_ops..max_ops``
operations (1-5 in the paper), drawn from their own seed; the evaluation sets (``eval_problems`` distinct problems
per operation count 1..10, 2,000 in the paper) are fixed by the evaluation seed, and a training problem whose text
is in an evaluation set is skipped, so the two never share a problem.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from mtp.errors import SettingError, UserError, settings_named_by_keys

MODULUS = 7
DEGREE = 5
"""Coefficients are taken mod MODULUS; terms of degree DEGREE and above are dropped."""
MAX_OPS = 10
"""The most operations a problem may have (the paper evaluates 1..10)."""
OPERATORS = ("neg", "+", "*", "o")
GENERATOR_VERSION = 1
"""Raised when the problems a seed gives change, so that no data cache of the old ones is reused."""

Poly = tuple[int, ...]
"""DEGREE coefficients mod MODULUS, the constant first."""


def negate(a: Poly) -> Poly:
    return tuple(-x % MODULUS for x in a)


def add(a: Poly, b: Poly) -> Poly:
    return tuple((x + y) % MODULUS for x, y in zip(a, b, strict=True))


def multiply(a: Poly, b: Poly) -> Poly:
    """a * b with the terms of degree DEGREE and above dropped."""
    return tuple(sum(a[i] * b[k - i] for i in range(k + 1)) % MODULUS for k in range(DEGREE))


def compose(a: Poly, b: Poly) -> Poly:
    """a(b(X)) truncated, by Horner's rule: truncating at each step gives the same result, since dropping X^5 and
    above commutes with addition and multiplication."""
    result: Poly = (0,) * DEGREE
    for coefficient in reversed(a):
        result = add(multiply(result, b), (coefficient,) + (0,) * (DEGREE - 1))
    return result


def poly_text(a: Poly) -> str:
    return "".join(map(str, a))


def check_ops(ops: int, field: str) -> None:
    """A :class:`~mtp.errors.SettingError` naming the setting ``field`` (with the value ``ops``) unless
    1 <= ops <= MAX_OPS."""
    if not 1 <= ops <= MAX_OPS:
        raise SettingError(
            f"{{{field}:{ops}}} is outside the operation counts the generator supports; use 1 to {MAX_OPS}.",
            **{field: ops},
        )


def check_ops_range(min_ops: int, max_ops: int) -> None:
    """The training operation counts ``data.source.min_ops..max_ops``, each checked, in order."""
    with settings_named_by_keys("data.source"):
        check_ops(min_ops, "min_ops")
        check_ops(max_ops, "max_ops")
    if min_ops > max_ops:
        raise UserError(f"data.source.min_ops={min_ops} is above data.source.max_ops={max_ops}; swap them.")


@dataclass(frozen=True)
class Problem:
    expression: str
    """The problem, e.g. ``(12000+60000)``."""
    answer: str
    """Its value, 5 digits."""
    ops: int

    @property
    def operator(self) -> str:
        """The outermost operation: ``neg``, ``+``, ``*`` or ``o`` (empty for a bare operand)."""
        if self.expression.startswith("-"):
            return "neg"
        depth = 0
        for char in self.expression:
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 1 and char in "+*o":
                return char
        return ""

    @property
    def prompt(self) -> str:
        """What the model reads before answering: the expression and ``=``."""
        return f"{self.expression}="

    @property
    def text(self) -> str:
        """The document: prompt, answer and the newline that ends it."""
        return f"{self.prompt}{self.answer}\n"


def _expression(rng: random.Random, ops: int) -> tuple[str, Poly]:
    if ops == 0:
        value = tuple(rng.randrange(MODULUS) for _ in range(DEGREE))
        return poly_text(value), value
    operator = rng.choice(OPERATORS)
    if operator == "neg":
        text, value = _expression(rng, ops - 1)
        return f"-{text}", negate(value)
    left_ops = rng.randrange(ops)
    left, a = _expression(rng, left_ops)
    right, b = _expression(rng, ops - 1 - left_ops)
    value = {"+": add, "*": multiply, "o": compose}[operator](a, b)
    return f"({left}{operator}{right})", value


def random_problem(rng: random.Random, ops: int) -> Problem:
    """A problem of exactly ``ops`` operations (1..MAX_OPS), drawn as the module docstring says."""
    check_ops(ops, "ops")
    expression, value = _expression(rng, ops)
    return Problem(expression, poly_text(value), ops)


def evaluation_problems(ops: int, count: int, seed: int) -> list[Problem]:
    """The evaluation set of ``ops`` operations: ``count`` distinct problems, the same for the same seed."""
    check_ops(ops, "ops")
    rng = random.Random(f"polynomial-evaluation-{seed}-{ops}")  # a str seed hashes the same in every process
    problems: dict[str, Problem] = {}
    while len(problems) < count:
        problem = random_problem(rng, ops)
        problems.setdefault(problem.expression, problem)
    return list(problems.values())


def training_problems(
    seed: int, count: int, min_ops: int, max_ops: int, eval_seed: int, eval_problems: int
) -> Iterator[Problem]:
    """``count`` training problems, each of ``min_ops..max_ops`` operations (uniform), none in the evaluation sets
    of ``eval_seed`` and ``eval_problems`` (a problem drawn from one is skipped and another drawn)."""
    check_ops_range(min_ops, max_ops)
    held_out = {
        problem.expression
        for ops in range(min_ops, max_ops + 1)
        for problem in evaluation_problems(ops, eval_problems, eval_seed)
    }
    rng = random.Random(f"polynomial-training-{seed}")
    made = 0
    while made < count:
        problem = random_problem(rng, rng.randint(min_ops, max_ops))
        if problem.expression in held_out:
            continue
        made += 1
        yield problem
