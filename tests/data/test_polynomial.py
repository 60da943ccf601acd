"""Polynomial arithmetic in F7[X]/(X^5): every generated answer checked by an independent implementation (its own parser
of the text, polynomials as dicts of degree -> coefficient, composition as a sum of powers), seeds, the evaluation
sets kept out of training, the data source and its bad settings."""

import random
from collections import Counter

import pytest

from mtp.data import polynomial
from mtp.data.packing import TokenizerConfig, fingerprint
from mtp.data.sources import SourceConfig, load_documents, source_identity
from mtp.errors import UserError


def truncated(p: dict[int, int]) -> dict[int, int]:
    return {d: c % 7 for d, c in p.items() if d < 5 and c % 7}


def times(p: dict[int, int], q: dict[int, int]) -> dict[int, int]:
    """The full product (no truncation here: the caller truncates)."""
    out: dict[int, int] = {}
    for i, a in p.items():
        for j, b in q.items():
            out[i + j] = out.get(i + j, 0) + a * b
    return out


def plus(p: dict[int, int], q: dict[int, int]) -> dict[int, int]:
    return {d: p.get(d, 0) + q.get(d, 0) for d in p.keys() | q.keys()}


def composed(p: dict[int, int], q: dict[int, int]) -> dict[int, int]:
    """p(q(X)) = sum of p_i q^i, each power in full, truncated once at the end."""
    out: dict[int, int] = {}
    power: dict[int, int] = {0: 1}
    for i in range(max(p, default=-1) + 1):
        out = plus(out, {d: p.get(i, 0) * c for d, c in power.items()})
        power = times(power, q)
    return truncated(out)


def evaluate(text: str) -> dict[int, int]:
    """The value of a problem's text, by a recursive-descent parser of the documented grammar:
    term := digits5 | '-' term | '(' term op term ')'."""
    position = 0

    def term() -> dict[int, int]:
        nonlocal position
        if text[position] == "-":
            position += 1
            return truncated({d: -c for d, c in term().items()})
        if text[position] == "(":
            position += 1
            left = term()
            operator = text[position]
            position += 1
            right = term()
            assert text[position] == ")"
            position += 1
            if operator == "+":
                return truncated(plus(left, right))
            if operator == "*":
                return truncated(times(left, right))
            assert operator == "o"
            return composed(left, right)
        digits = text[position : position + 5]
        assert len(digits) == 5 and digits.isdigit() and all(d < "7" for d in digits)
        position += 5
        return truncated({d: int(c) for d, c in enumerate(digits)})

    value = term()
    assert position == len(text), f"trailing text in {text!r}"
    return value


def as_text(p: dict[int, int]) -> str:
    return "".join(str(p.get(d, 0)) for d in range(5))


def operations(expression: str) -> int:
    return sum(expression.count(c) for c in "-+*o")


def check(problem: polynomial.Problem) -> None:
    expression, _, rest = problem.text.partition("=")
    assert rest == f"{problem.answer}\n" and problem.prompt == f"{expression}="
    assert len(problem.answer) == 5 and problem.answer.isdigit()
    assert as_text(evaluate(expression)) == problem.answer, problem.text
    assert operations(expression) == problem.ops


def test_hand_computed_answers():
    x, one_plus_x, x4 = (0, 1, 0, 0, 0), (1, 1, 0, 0, 0), (0, 0, 0, 0, 1)
    assert polynomial.multiply(x4, x) == (0, 0, 0, 0, 0)  # X^5 is dropped
    assert polynomial.multiply(one_plus_x, one_plus_x) == (1, 2, 1, 0, 0)
    assert polynomial.compose((0, 0, 1, 0, 0), one_plus_x) == (1, 2, 1, 0, 0)  # X^2 o (1 + X)
    assert polynomial.compose(x4, (0, 0, 1, 0, 0)) == (0, 0, 0, 0, 0)  # X^8, dropped
    assert polynomial.compose((3, 0, 0, 0, 0), one_plus_x) == (3, 0, 0, 0, 0)
    assert polynomial.add((6, 6, 0, 0, 0), one_plus_x) == (0, 0, 0, 0, 0)
    assert polynomial.negate((1, 0, 6, 0, 3)) == (6, 0, 1, 0, 4)
    assert as_text(evaluate("((00001*01000)o12000)")) == "00000"


@pytest.mark.parametrize("ops", range(1, 11))
def test_every_evaluation_answer_is_right(ops):
    problems = polynomial.evaluation_problems(ops, 300, seed=0)
    assert len({p.expression for p in problems}) == 300
    for problem in problems:
        check(problem)


def test_every_training_answer_is_right_and_the_counts_and_operators_are_uniform():
    problems = list(polynomial.training_problems(3, 4000, 1, 5, eval_seed=0, eval_problems=200))
    for problem in problems:
        check(problem)
    counts = Counter(p.ops for p in problems)
    assert set(counts) == {1, 2, 3, 4, 5} and min(counts.values()) > 700  # 800 expected each
    one_op = Counter(p.expression[0] if p.expression[0] == "-" else p.expression[6] for p in problems if p.ops == 1)
    assert set(one_op) == {"-", "+", "*", "o"} and min(one_op.values()) > 150  # ~200 expected each


def test_seeds_are_reproducible_and_distinct():
    def texts(seed: int, eval_seed: int = 0) -> list[str]:
        return [p.text for p in polynomial.training_problems(seed, 50, 1, 5, eval_seed, 50)]

    assert texts(0) == texts(0) and texts(0) != texts(1)
    assert polynomial.evaluation_problems(4, 20, 0) == polynomial.evaluation_problems(4, 20, 0)
    assert polynomial.evaluation_problems(4, 20, 0) != polynomial.evaluation_problems(4, 20, 1)
    assert polynomial.evaluation_problems(4, 10, 0) == polynomial.evaluation_problems(4, 20, 0)[:10]  # a prefix


def test_training_never_repeats_an_evaluation_problem():
    """One-operation negations are few (7^5), so unfiltered draws would repeat the evaluation set's."""
    held_out = {p.expression for p in polynomial.evaluation_problems(1, 2000, seed=0)}
    training = [p.expression for p in polynomial.training_problems(0, 20000, 1, 1, eval_seed=0, eval_problems=2000)]
    assert len(training) == 20000 and not held_out & set(training)
    rng = random.Random("polynomial-training-0")
    unfiltered = {polynomial.random_problem(rng, rng.randint(1, 1)).expression for _ in range(20000)}
    assert len(held_out & unfiltered) > 20  # what the filter removed: the check above is not vacuous


def test_the_source_gives_one_problem_per_document_and_its_settings_change_the_cache():
    config = SourceConfig(kind="polynomial", problems=40, seed=2, eval_problems=20)
    texts = load_documents(config)["text"]
    assert texts == [p.text for p in polynomial.training_problems(2, 40, 1, 5, 0, 20)]
    names = {
        fingerprint(SourceConfig(**settings), TokenizerConfig(kind="byte"), 0.02)
        for settings in [
            {"kind": "polynomial"},
            {"kind": "polynomial", "seed": 1},
            {"kind": "polynomial", "problems": 10},
            {"kind": "polynomial", "max_ops": 4},
            {"kind": "polynomial", "eval_seed": 1},
            {"kind": "polynomial", "eval_problems": 10},
        ]
    }
    assert len(names) == 6
    assert source_identity(SourceConfig(kind="polynomial"))["generator"] == polynomial.GENERATOR_VERSION


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_ops": 11}, "data.source.max_ops=11 is outside the operation counts the generator supports; use 1 to 10"),
        ({"min_ops": 0}, "data.source.min_ops=0 is outside"),
        ({"min_ops": 4, "max_ops": 2}, "data.source.min_ops=4 is above data.source.max_ops=2; swap them."),
        ({"problems": 0}, "data.source.problems=0"),
    ],
)
def test_bad_settings_are_one_sentence(settings, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        SourceConfig(kind="polynomial", **settings)


def test_an_operation_count_outside_1_to_10_is_refused():
    for ops in (0, 11):
        with pytest.raises(UserError, match=f"ops={ops} is outside"):
            polynomial.evaluation_problems(ops, 5, 0)
