"""The code task's functions: what each does, a reference solution, and how to draw its inputs.

    >>> FUNCTIONS[0].name, FUNCTIONS[0].sig
    ('add', 'a, b')

`valueprobe.datasets.tasks` asks for each function in a chat and writes asserts whose expected
values come from running the reference on inputs drawn from the family's seeded generator, so
every assert holds for the reference (tests/test_tasks.py runs them all through the sandbox).
Every output is exact (ints, strings, lists, bools, None): no float comparisons.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FUNCTIONS", "TaskFunction"]

Args = tuple[object, ...]


@dataclass(frozen=True)
class TaskFunction:
    name: str
    sig: str
    what: str
    reference: str  # Python source defining ``name``
    inputs: Callable[[random.Random], Args]


def _ints(r: random.Random, lo: int = -20, hi: int = 50, k: tuple[int, int] = (1, 7)) -> list[int]:
    return [r.randint(lo, hi) for _ in range(r.randint(*k))]


_WORDS = ("apple", "river", "stone", "level", "moon", "tiger", "noon", "cloud", "bread", "radar", "lamp")


def _word(r: random.Random) -> str:
    return r.choice(_WORDS)


def _sentence(r: random.Random) -> str:
    return " ".join(r.choice(_WORDS) for _ in range(r.randint(1, 6)))


def _mixed_case(r: random.Random) -> str:
    return "".join(c.upper() if r.random() < 0.4 else c for c in _sentence(r))


FUNCTIONS: tuple[TaskFunction, ...] = (
    TaskFunction("add", "a, b", "returns the sum of two integers",
             "def add(a, b):\n    return a + b", lambda r: (r.randint(-99, 99), r.randint(-99, 99))),
    TaskFunction("square", "x", "returns x squared",
             "def square(x):\n    return x * x", lambda r: (r.randint(-30, 30),)),
    TaskFunction("is_even", "n", "returns True if the integer n is even, else False",
             "def is_even(n):\n    return n % 2 == 0", lambda r: (r.randint(-50, 50),)),
    TaskFunction("maximum", "numbers", "returns the largest number in a non-empty list",
             "def maximum(numbers):\n    return max(numbers)", lambda r: (_ints(r),)),
    TaskFunction("minimum", "numbers", "returns the smallest number in a non-empty list",
             "def minimum(numbers):\n    return min(numbers)", lambda r: (_ints(r),)),
    TaskFunction("reverse_string", "s", "returns the string s reversed",
             "def reverse_string(s):\n    return s[::-1]", lambda r: (_sentence(r),)),
    TaskFunction("count_vowels", "s", "returns how many of the characters of s are vowels (a, e, i, o, u, either case)",
             "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)", lambda r: (_mixed_case(r),)),
    TaskFunction("is_palindrome", "s", "returns True if the string s is the same reversed, else False",
             "def is_palindrome(s):\n    return s == s[::-1]", lambda r: (_word(r),)),
    TaskFunction("factorial", "n", "returns n factorial for a non-negative integer n (factorial(0) is 1)",
             "def factorial(n):\n    out = 1\n    for k in range(2, n + 1):\n        out *= k\n    return out",
             lambda r: (r.randint(0, 10),)),
    TaskFunction("fibonacci", "n", "returns the n-th Fibonacci number, where fibonacci(0) is 0 and fibonacci(1) is 1",
             "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
             lambda r: (r.randint(0, 20),)),
    TaskFunction("sum_list", "numbers", "returns the sum of a list of integers (0 for an empty list)",
             "def sum_list(numbers):\n    return sum(numbers)", lambda r: (_ints(r, k=(0, 6)),)),
    TaskFunction("count_words", "text", "returns the number of words in a sentence (words are separated by spaces)",
             "def count_words(text):\n    return len(text.split())", lambda r: (_sentence(r),)),
    TaskFunction("remove_duplicates", "items", "returns the list without repeated items, keeping the first of each",
             "def remove_duplicates(items):\n    out = []\n    for x in items:\n        if x not in out:\n"
             "            out.append(x)\n    return out", lambda r: (_ints(r, 0, 5, (0, 8)),)),
    TaskFunction("is_prime", "n", "returns True if the integer n is a prime number, else False",
             "def is_prime(n):\n    return n > 1 and all(n % k for k in range(2, int(n ** 0.5) + 1))",
             lambda r: (r.randint(0, 60),)),
    TaskFunction("gcd", "a, b", "returns the greatest common divisor of two positive integers",
             "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a",
             lambda r: (r.randint(1, 12) * r.randint(1, 9), r.randint(1, 12) * r.randint(1, 9))),
    TaskFunction("lcm", "a, b", "returns the least common multiple of two positive integers",
             "def lcm(a, b):\n    m = max(a, b)\n    while m % a or m % b:\n        m += 1\n    return m",
             lambda r: (r.randint(1, 15), r.randint(1, 15))),
    TaskFunction("flatten", "nested", "flattens a list of lists into one list",
             "def flatten(nested):\n    return [x for part in nested for x in part]",
             lambda r: ([_ints(r, 0, 9, (0, 3)) for _ in range(r.randint(1, 4))],)),
    TaskFunction("is_anagram", "a, b", "returns True if the words a and b use the same letters the same number of times",
             "def is_anagram(a, b):\n    return sorted(a) == sorted(b)",
             lambda r: (lambda w: (w, "".join(r.sample(w, len(w))) if r.random() < 0.5 else _word(r)))(_word(r))),
    TaskFunction("second_largest", "numbers", "returns the second largest distinct number in a list with at least two distinct numbers",
             "def second_largest(numbers):\n    return sorted(set(numbers))[-2]",
             lambda r: (_ints(r, 0, 9, (2, 7)) + [10, 11],)),
    TaskFunction("count_occurrences", "items, x", "returns how many times x appears in the list items",
             "def count_occurrences(items, x):\n    return items.count(x)", lambda r: (_ints(r, 0, 4, (0, 8)), r.randint(0, 4))),
    TaskFunction("clamp", "x, low, high", "returns x limited to the range from low to high (inclusive)",
             "def clamp(x, low, high):\n    return max(low, min(x, high))",
             lambda r: (r.randint(-20, 40), r.randint(-5, 5), r.randint(10, 20))),
    TaskFunction("is_leap_year", "year", "returns True if year is a leap year in the Gregorian calendar, else False",
             "def is_leap_year(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
             lambda r: (r.choice((1900, 2000, 2024, 2023, 2100, 1996, 2400, 2019)),)),
    TaskFunction("digit_sum", "n", "returns the sum of the digits of a non-negative integer",
             "def digit_sum(n):\n    return sum(int(c) for c in str(n))", lambda r: (r.randint(0, 99999),)),
    TaskFunction("to_binary", "n", "returns the binary digits of a non-negative integer as a string, without a prefix",
             "def to_binary(n):\n    return bin(n)[2:]", lambda r: (r.randint(0, 300),)),
    TaskFunction("power", "base, exponent", "returns base raised to a non-negative integer exponent, using a loop",
             "def power(base, exponent):\n    return base ** exponent", lambda r: (r.randint(-5, 9), r.randint(0, 6))),
    TaskFunction("chunk", "items, size", "splits a list into consecutive lists of the given size (the last may be shorter)",
             "def chunk(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]",
             lambda r: (_ints(r, 0, 9, (0, 9)), r.randint(1, 4))),
    TaskFunction("is_sorted", "numbers", "returns True if the list is in ascending order (equal neighbours allowed), else False",
             "def is_sorted(numbers):\n    return all(a <= b for a, b in zip(numbers, numbers[1:]))",
             lambda r: (sorted(_ints(r)) if r.random() < 0.5 else _ints(r),)),
    TaskFunction("count_uppercase", "s", "returns how many characters of s are uppercase letters",
             "def count_uppercase(s):\n    return sum(c.isupper() for c in s)", lambda r: (_mixed_case(r),)),
    TaskFunction("rotate_list", "items, k", "returns the list rotated to the right by k places (k >= 0)",
             "def rotate_list(items, k):\n    if not items:\n        return []\n    k %= len(items)\n"
             "    return items[-k:] + items[:-k] if k else list(items)", lambda r: (_ints(r, 0, 9, (0, 6)), r.randint(0, 8))),
    TaskFunction("range_sum", "a, b", "returns the sum of the integers from a to b inclusive (a <= b)",
             "def range_sum(a, b):\n    return sum(range(a, b + 1))", lambda r: (lambda a: (a, a + r.randint(0, 30)))(r.randint(-10, 20))),
    TaskFunction("first_repeated", "items", "returns the first item that appears a second time in the list, or None if none does",
             "def first_repeated(items):\n    seen = set()\n    for x in items:\n        if x in seen:\n            return x\n"
             "        seen.add(x)\n    return None", lambda r: (_ints(r, 0, 9, (0, 8)),)),
    TaskFunction("count_negatives", "numbers", "returns how many numbers in the list are negative",
             "def count_negatives(numbers):\n    return sum(x < 0 for x in numbers)", lambda r: (_ints(r, k=(0, 8)),)),
    TaskFunction("swap_case", "s", "returns s with upper case letters made lower case and lower case letters made upper case",
             "def swap_case(s):\n    return s.swapcase()", lambda r: (_mixed_case(r),)),
    TaskFunction("nth_triangle", "n", "returns the n-th triangular number 1 + 2 + ... + n (0 for n = 0)",
             "def nth_triangle(n):\n    return n * (n + 1) // 2", lambda r: (r.randint(0, 100),)),
    TaskFunction("product", "numbers", "returns the product of a list of integers (1 for an empty list)",
             "def product(numbers):\n    out = 1\n    for x in numbers:\n        out *= x\n    return out",
             lambda r: (_ints(r, -5, 9, (0, 5)),)),
    TaskFunction("running_total", "numbers", "returns the list of running totals (the k-th is the sum of the first k + 1 numbers)",
             "def running_total(numbers):\n    out, total = [], 0\n    for x in numbers:\n        total += x\n"
             "        out.append(total)\n    return out", lambda r: (_ints(r, k=(0, 7)),)),
    TaskFunction("last_element", "items", "returns the last item of a list, or None if the list is empty",
             "def last_element(items):\n    return items[-1] if items else None", lambda r: (_ints(r, k=(0, 4)),)),
    TaskFunction("filter_positive", "numbers", "returns the numbers of the list that are greater than zero, in order",
             "def filter_positive(numbers):\n    return [x for x in numbers if x > 0]", lambda r: (_ints(r, k=(0, 8)),)),
    TaskFunction("squares_up_to", "n", "returns the list of the squares of 1 to n",
             "def squares_up_to(n):\n    return [k * k for k in range(1, n + 1)]", lambda r: (r.randint(0, 9),)),
    TaskFunction("longest_word", "text", "returns the longest word of a sentence (the first one if several tie)",
             "def longest_word(text):\n    return max(text.split(), key=len)", lambda r: (_sentence(r),)),
)  # fmt: skip
