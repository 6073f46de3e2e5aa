"""Synthetic verifiable tasks small transformers learn on a CPU.

All use the character vocabulary of `rl_batch.tokenizers.CharTokenizer`, so lengths in
characters are lengths in tokens (BOS/EOS not counted).

- ``addition``: ``"123+456="`` -> ``"9750"``: the sum's digits least-significant first,
  zero-padded to ``n_digits + 1``. Operands are zero-padded to ``n_digits``, so every prompt
  and every response of a task has the same length. Writing the answer reversed lets a
  left-to-right model emit each digit after the carry it depends on (see CPU-NOTES.md).
  ``scratchpad=True`` writes one step per digit column first:
  ``"3+6+0=09,2+5+0=07,1+4+0=05>9750"`` (digit of a, digit of b, carry in = carry out and
  sum digit), then ``>`` and the answer.
- ``arithmetic_mix``: one training distribution of several of the problems above,
  ``add`` (``"123+456="``) and ``mul`` (``"123*4="``) drawn per example with the
  weights ``mix`` (default half and half), each in its own task's format; the example's
  ``meta["op"]`` records the draw. Its success probability differs by prompt and can be
  read off it (the operator), which gives a PPO critic something to predict.
- ``multiplication``: ``"12*34="`` -> ``"8040"`` (408 reversed, padded to ``n + m`` digits).
  ``scratchpad=True`` writes, for each digit ``b_j`` of the second operand (least
  significant first), the shifted partial product ``a * b_j * 10^j`` and the running sum,
  both reversed and padded to ``n + m`` digits: ``"8400:8400,0630:8040>8040"``.
- ``countdown``: ``"3 5 7|26="`` -> an expression over the given numbers equal to the
  target, e.g. ``"5*7-3*3"`` is *not* allowed (3 used twice) but ``"3*7+5"`` is. Each given
  number may be used at most once; intermediate values may be fractions. The verifier
  parses the expression with a small recursive-descent parser (no ``eval``).

Verifiers compare values, not strings: for the digit tasks a response is correct when its
reversed digits equal the true number (so missing or extra padding zeros are tolerated);
leading/trailing whitespace is ignored.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from rl_batch.tasks.base import Example, Score, to_example

_DIGITS_RE = re.compile(r"[0-9]+")


def reversed_digits(value: int, width: int) -> str:
    """``value`` zero-padded to ``width`` digits, least-significant digit first."""
    return str(value).zfill(width)[::-1]


def _random_operand(rng: np.random.Generator, n_digits: int) -> int:
    return int(rng.integers(0, 10**n_digits))


def _score_reversed_number(response: str, expected: int, scratchpad: bool, max_len: int) -> Score:
    """Scores a digit-task response whose answer is written least-significant digit first.

    Without scratchpad the whole (stripped) response must be digits; with scratchpad the
    answer is what follows the last ``>``.
    """
    text = response.strip()
    if scratchpad:
        if ">" not in text:
            return Score(0.0, False, None, "no '>' before the final answer")
        text = text.rsplit(">", 1)[1].strip()
    if not _DIGITS_RE.fullmatch(text):
        return Score(0.0, False, None, f"answer {text[:max_len]!r} is not a digit string")
    value = int(text[::-1])
    if value != expected:
        return Score(0.0, True, text, f"value {value} != {expected}")
    return Score(1.0, True, text)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdditionTask:
    """``a + b`` for ``n_digits``-digit operands, answer reversed (see module docstring).

    Attributes:
        n_digits: digits per operand (difficulty knob).
        scratchpad: write one step per digit column before the answer.
    """

    n_digits: int = 3
    scratchpad: bool = False
    name: str = dataclasses.field(default="addition", init=False)

    def __post_init__(self):
        if not 1 <= self.n_digits <= 30:
            raise ValueError(f"AdditionTask n_digits must be in [1, 30], got {self.n_digits}")

    @property
    def max_prompt_len(self) -> int:
        return 2 * self.n_digits + 2  # "a+b="

    @property
    def max_response_len(self) -> int:
        answer = self.n_digits + 1
        # Steps "a+b+c=cs" (8 chars) joined by ",", then ">" and the answer.
        return 9 * self.n_digits + answer if self.scratchpad else answer

    def response_for(self, a: int, b: int) -> str:
        """The reference response for ``a + b``."""
        answer = reversed_digits(a + b, self.n_digits + 1)
        if not self.scratchpad:
            return answer
        ra, rb = reversed_digits(a, self.n_digits), reversed_digits(b, self.n_digits)
        steps, carry = [], 0
        for da, db in zip(ra, rb):
            total = int(da) + int(db) + carry
            steps.append(f"{da}+{db}+{carry}={total // 10}{total % 10}")
            carry = total // 10
        return ",".join(steps) + ">" + answer

    def make_example(self, rng: np.random.Generator) -> Example:
        a, b = _random_operand(rng, self.n_digits), _random_operand(rng, self.n_digits)
        prompt = f"{a:0{self.n_digits}d}+{b:0{self.n_digits}d}="
        return Example(prompt, self.response_for(a, b), {"a": a, "b": b})

    def score(self, example: Example | Mapping[str, Any], response: str) -> Score:
        example = to_example(example)
        a, b = _parse_binary_prompt(example.prompt, "+")
        return _score_reversed_number(response, a + b, self.scratchpad, self.max_response_len)

    def reward(self, example: Example | Mapping[str, Any], response: str) -> float:
        return self.score(example, response).reward


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiplicationTask:
    """``a * b`` with ``n_digits`` x ``m_digits`` operands, answer reversed.

    Attributes:
        n_digits: digits of the first operand (difficulty knob).
        m_digits: digits of the second operand (defaults to ``n_digits``).
        scratchpad: write shifted partial products and running sums before the answer.
    """

    n_digits: int = 2
    m_digits: int | None = None
    scratchpad: bool = False
    name: str = dataclasses.field(default="multiplication", init=False)

    def __post_init__(self):
        if self.m_digits is None:
            object.__setattr__(self, "m_digits", self.n_digits)
        for field in ("n_digits", "m_digits"):
            if not 1 <= getattr(self, field) <= 20:
                raise ValueError(
                    f"MultiplicationTask {field} must be in [1, 20], got {getattr(self, field)}"
                )

    @property
    def _width(self) -> int:
        return self.n_digits + self.m_digits

    @property
    def max_prompt_len(self) -> int:
        return self.n_digits + self.m_digits + 2  # "a*b="

    @property
    def max_response_len(self) -> int:
        w = self._width
        # m steps "partial:sum" (2w+1 chars) joined by ",", then ">" and the answer.
        return self.m_digits * (2 * w + 2) + w if self.scratchpad else w

    def response_for(self, a: int, b: int) -> str:
        """The reference response for ``a * b``."""
        w = self._width
        answer = reversed_digits(a * b, w)
        if not self.scratchpad:
            return answer
        steps, running = [], 0
        for j, digit in enumerate(reversed_digits(b, self.m_digits)):
            partial = a * int(digit) * 10**j
            running += partial
            steps.append(f"{reversed_digits(partial, w)}:{reversed_digits(running, w)}")
        return ",".join(steps) + ">" + answer

    def make_example(self, rng: np.random.Generator) -> Example:
        a, b = _random_operand(rng, self.n_digits), _random_operand(rng, self.m_digits)
        prompt = f"{a:0{self.n_digits}d}*{b:0{self.m_digits}d}="
        return Example(prompt, self.response_for(a, b), {"a": a, "b": b})

    def score(self, example: Example | Mapping[str, Any], response: str) -> Score:
        example = to_example(example)
        a, b = _parse_binary_prompt(example.prompt, "*")
        return _score_reversed_number(response, a * b, self.scratchpad, self.max_response_len)

    def reward(self, example: Example | Mapping[str, Any], response: str) -> float:
        return self.score(example, response).reward


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArithmeticMixTask:
    """Addition and multiplication problems in one distribution (see module docstring).

    Attributes:
        add_digits: digits per addition operand.
        mul_digits: digits of the multiplication's two operands (e.g. ``(3, 1)``).
        scratchpad: both write their steps before the answer.
        mix: the weights of ``("add", "mul")``, drawn per example.
    """

    add_digits: int = 3
    mul_digits: tuple[int, int] = (3, 1)
    scratchpad: bool = True
    mix: tuple[float, float] = (0.5, 0.5)
    name: str = dataclasses.field(default="arithmetic_mix", init=False)

    OPS = ("add", "mul")

    def __post_init__(self):
        mix = tuple(float(w) for w in self.mix)  # JSON and flags give lists
        if len(mix) != len(self.OPS) or min(mix) < 0 or sum(mix) <= 0:
            raise ValueError(
                f"arithmetic_mix mix={list(mix)}: expected {len(self.OPS)} weights >= 0 of "
                f"{self.OPS} with a positive sum"
            )
        digits = tuple(int(d) for d in self.mul_digits)
        if len(digits) != 2:
            raise ValueError(f"arithmetic_mix mul_digits={list(digits)}: expected two lengths")
        object.__setattr__(self, "mix", mix)
        object.__setattr__(self, "mul_digits", digits)
        _ = self._tasks  # Validates the digit counts.

    @property
    def _tasks(self) -> dict[str, Any]:
        n, m = self.mul_digits
        return {
            "add": AdditionTask(n_digits=self.add_digits, scratchpad=self.scratchpad),
            "mul": MultiplicationTask(n_digits=n, m_digits=m, scratchpad=self.scratchpad),
        }

    @property
    def max_prompt_len(self) -> int:
        return max(t.max_prompt_len for t in self._tasks.values())

    @property
    def max_response_len(self) -> int:
        return max(t.max_response_len for t in self._tasks.values())

    def make_example(self, rng: np.random.Generator) -> Example:
        weights = np.asarray(self.mix) / sum(self.mix)
        op = self.OPS[int(rng.choice(len(self.OPS), p=weights))]
        ex = self._tasks[op].make_example(rng)
        return Example(ex.prompt, ex.answer, {**ex.meta, "op": op})

    def _task_of(self, prompt: str):
        return self._tasks["mul" if "*" in prompt else "add"]

    def score(self, example: Example | Mapping[str, Any], response: str) -> Score:
        example = to_example(example)
        return self._task_of(example.prompt).score(example, response)

    def reward(self, example: Example | Mapping[str, Any], response: str) -> float:
        return self.score(example, response).reward


def _parse_binary_prompt(prompt: str, op: str) -> tuple[int, int]:
    m = re.fullmatch(rf"([0-9]+){re.escape(op)}([0-9]+)=", prompt)
    if m is None:
        raise ValueError(f"prompt {prompt!r} is not of the form '<digits>{op}<digits>='")
    return int(m.group(1)), int(m.group(2))


# ---------------------------------------------------------------------------------------
# Countdown: a safe arithmetic-expression parser and the task.


class ExpressionError(ValueError):
    """A response that is not a well-formed expression over integers and + - * / ( )."""


_TOKEN_RE = re.compile(r"\s*(?:([0-9]+)|([-+*/()]))")
_MAX_EXPR_CHARS = 256
_MAX_DEPTH = 32


def _tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise ExpressionError(f"unexpected character {text[pos]!r} at position {pos}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """Evaluates an arithmetic expression exactly, without ``eval``.

    Grammar: ``expr := term (('+'|'-') term)*``, ``term := factor (('*'|'/') factor)*``,
    ``factor := INT | '(' expr ')'``. No unary minus, no exponent.

    Args:
        text: the expression, e.g. ``"(11 - 5) * (7 - 3)"``.

    Returns:
        ``(value, numbers)``: the exact value and the integer literals in order of use.

    Raises:
        ExpressionError: malformed expression (bad character, unbalanced parentheses,
            missing operand, too long or too deeply nested).
        ZeroDivisionError: a division by zero.
    """
    if len(text) > _MAX_EXPR_CHARS:
        raise ExpressionError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    tokens = _tokenize(text)
    if not tokens:
        raise ExpressionError("empty expression")
    numbers: list[int] = []
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def expr(depth: int) -> Fraction:
        nonlocal pos
        value = term(depth)
        while peek() in ("+", "-"):
            op = tokens[pos]
            pos += 1
            rhs = term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(depth: int) -> Fraction:
        nonlocal pos
        value = factor(depth)
        while peek() in ("*", "/"):
            op = tokens[pos]
            pos += 1
            rhs = factor(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise ZeroDivisionError("division by zero")
            else:
                value = value / rhs
        return value

    def factor(depth: int) -> Fraction:
        nonlocal pos
        if depth > _MAX_DEPTH:
            raise ExpressionError(f"parentheses nested deeper than {_MAX_DEPTH}")
        tok = peek()
        if tok is None:
            raise ExpressionError("expression ends where a number was expected")
        pos += 1
        if tok == "(":
            value = expr(depth + 1)
            if peek() != ")":
                raise ExpressionError("unbalanced parentheses")
            pos += 1
            return value
        if tok.isdigit():
            numbers.append(int(tok))
            return Fraction(int(tok))
        raise ExpressionError(f"unexpected {tok!r} where a number was expected")

    value = expr(0)
    if pos != len(tokens):
        raise ExpressionError(f"unexpected {tokens[pos]!r} after a complete expression")
    return value, numbers


def _format_fraction(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def check_countdown(response: str, numbers: list[int], target: int) -> Score:
    """Scores a Countdown response: a valid expression using each given number at most once
    (as many times as it is given) whose exact value equals ``target``.

    Args:
        response: the model's expression.
        numbers: the given numbers (a multiset).
        target: the target value.

    Returns:
        A `Score`; ``format_ok`` is whether the expression parsed (a division by zero is a
        well-formed but wrong answer), ``parsed`` the value as text.
    """
    try:
        value, used = evaluate_expression(response)
    except ZeroDivisionError:
        return Score(0.0, True, None, "division by zero")
    except ExpressionError as e:
        return Score(0.0, False, None, str(e))
    parsed = _format_fraction(value)
    over = Counter(used) - Counter(numbers)
    if over:
        n = min(over)
        given, times = numbers.count(n), used.count(n)
        why = f"number {n} is not given" if given == 0 else f"uses {n} {times}x, given {given}x"
        return Score(0.0, True, parsed, why)
    if value != target:
        return Score(0.0, True, parsed, f"value {parsed} != target {target}")
    return Score(1.0, True, parsed)


# Precedence of a formatted sub-expression: 1 for + and -, 2 for * and /, 3 for a number.
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def _combine(lhs: tuple[int, str, int], rhs: tuple[int, str, int], op: str):
    """Joins two (value, text, precedence) terms with minimal parentheses."""
    lv, lt, lp = lhs
    rv, rt, rp = rhs
    p = _PREC[op]
    if lp < p:
        lt = f"({lt})"
    # Right operand needs brackets at equal precedence for - and / (a-(b+c), a/(b*c)).
    if rp < p or (rp == p and op in "-/"):
        rt = f"({rt})"
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv // rv if rv else 0}[op]
    return value, f"{lt}{op}{rt}", p


@dataclasses.dataclass(frozen=True, kw_only=True)
class CountdownTask:
    """Reach a target with + - * / over given numbers, each used at most once.

    Prompt ``"3 5 7|26="``; the reference answer uses all numbers, with integer
    intermediate values, and the target is never one of the given numbers.

    Attributes:
        n_numbers: how many numbers are given (difficulty knob, 2..6).
        max_number: numbers are drawn uniformly from ``[1, max_number]``.
        max_target: targets lie in ``[1, max_target]``.
    """

    n_numbers: int = 3
    max_number: int = 9
    max_target: int = 99
    name: str = dataclasses.field(default="countdown", init=False)

    def __post_init__(self):
        if not 2 <= self.n_numbers <= 6:
            raise ValueError(f"CountdownTask n_numbers must be in [2, 6], got {self.n_numbers}")
        if self.max_number < 2 or self.max_target < 2:
            raise ValueError(
                f"CountdownTask needs max_number >= 2 and max_target >= 2, got "
                f"{self.max_number}, {self.max_target}"
            )

    @property
    def max_prompt_len(self) -> int:
        return self.n_numbers * (len(str(self.max_number)) + 1) + len(str(self.max_target)) + 1

    @property
    def max_response_len(self) -> int:
        # Longest reference: n numbers, n-1 operators, at most n-1 bracket pairs; the rest is
        # slack for the model's own (possibly spaced) expressions.
        n = self.n_numbers
        return n * len(str(self.max_number)) + 3 * (n - 1) + 8

    def make_example(self, rng: np.random.Generator) -> Example:
        for _ in range(10_000):
            numbers = [int(x) for x in rng.integers(1, self.max_number + 1, self.n_numbers)]
            pool = [(x, str(x), 3) for x in numbers]
            while len(pool) > 1:
                i, j = rng.choice(len(pool), size=2, replace=False)
                lhs, rhs = pool[i], pool[j]
                op = "+-*/"[int(rng.integers(4))]
                # Keep intermediates positive integers so references read naturally.
                if op == "-" and lhs[0] <= rhs[0]:
                    op = "+"
                if op == "/" and (rhs[0] in (0, 1) or lhs[0] % rhs[0]):
                    op = "*"
                pool = [t for k, t in enumerate(pool) if k not in (i, j)]
                pool.append(_combine(lhs, rhs, op))
            target, text, _ = pool[0]
            if 1 <= target <= self.max_target and target not in numbers:
                prompt = " ".join(map(str, numbers)) + f"|{target}="
                return Example(prompt, text, {"numbers": numbers, "target": target})
        raise RuntimeError(f"no Countdown example found for {self!r} in 10000 tries")

    def parse_prompt(self, prompt: str) -> tuple[list[int], int]:
        """``"3 5 7|26="`` -> ``([3, 5, 7], 26)``."""
        m = re.fullmatch(r"([0-9]+(?: [0-9]+)*)\|([0-9]+)=", prompt)
        if m is None:
            raise ValueError(f"prompt {prompt!r} is not of the form 'n1 n2 ...|target='")
        return [int(x) for x in m.group(1).split()], int(m.group(2))

    def score(self, example: Example | Mapping[str, Any], response: str) -> Score:
        numbers, target = self.parse_prompt(to_example(example).prompt)
        return check_countdown(response, numbers, target)

    def reward(self, example: Example | Mapping[str, Any], response: str) -> float:
        return self.score(example, response).reward
