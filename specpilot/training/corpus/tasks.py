"""The task table behind function_stubs and short_tasks: small original programming tasks, each with a
reference implementation and makers of example arguments, so every example a prompt shows is computed by
running the task."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from typing import NamedTuple

from specpilot.training.corpus.common import DOMAINS, PEOPLE

# --- example arguments ------------------------------------------------------------------------------------------

WORDS = ("banana", "level", "rocket", "planet", "garden", "window", "python", "racecar", "meadow", "lantern",
         "orbit", "pepper", "noon", "kayak", "silver", "thunder", "button", "harbor", "mirror", "puzzle", "copper",
         "velvet", "castle", "bridge", "falcon", "ribbon", "candle", "island", "jungle", "marble", "needle",
         "oyster", "parrot", "quartz", "saddle", "tunnel", "violet", "walnut", "yellow", "zebra", "apple", "civic",
         "radar", "stats", "book", "moon", "letter", "coffee", "balloon", "success", "Paris", "Owl", "Echo", "tree")


def _g_word(rng):
    return rng.choice(WORDS)


def _g_sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6)))


def _g_ints(rng):
    return [rng.randint(-9, 30) for _ in range(rng.randint(4, 8))]


def _g_pos(rng):
    return [rng.randint(1, 20) for _ in range(rng.randint(3, 7))]


def _g_sorted(rng):
    return sorted(rng.sample(range(0, 40), rng.randint(3, 6)))


def _g_prefixed(rng):
    stem = rng.choice(("inter", "pre", "con", "trans", "sub", "over", "st", "ca"))
    return [stem + w[rng.randint(0, 2):] for w in rng.sample(WORDS[:40], rng.randint(2, 4))] + (
        [rng.choice(WORDS[:40])] if rng.random() < 0.2 else [])


def _g_words(rng):
    return rng.sample(WORDS, rng.randint(3, 5))


def _g_dict(rng):
    return {w: rng.randint(0, 20) for w in rng.sample(WORDS[:40], rng.randint(2, 4))}


def _g_matrix(rng):
    k = rng.randint(2, 3)
    return [[rng.randint(0, 9) for _ in range(k)] for _ in range(k)]


def _g_nested(rng):
    return [[rng.randint(0, 9) for _ in range(rng.randint(0, 3))] for _ in range(rng.randint(2, 4))]


def _g_camel(rng):
    first, *rest = rng.sample(WORDS[:40], rng.randint(2, 3))
    return first + "".join(w.capitalize() for w in rest)


def _g_snake(rng):
    return "_".join(rng.sample(WORDS[:40], rng.randint(2, 3)))


def _g_runs(rng):
    return "".join(rng.choice("abcxyz") * rng.randint(1, 4) for _ in range(rng.randint(2, 4)))


def _g_time(rng):
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"


def _g_date(rng):
    return f"{rng.randint(1990, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _g_email(rng):
    return f"{rng.choice(PEOPLE)[0].lower()}.{rng.choice(WORDS[:40])}@{rng.choice(DOMAINS)}"


def _g_kv(rng):
    return ";".join(f"{w}={rng.randint(0, 99)}" for w in rng.sample(WORDS[:40], rng.randint(2, 3)))


def _g_text_nums(rng):
    return f"{rng.choice(PEOPLE)[0]} has {rng.randint(1, 40)} {rng.choice(WORDS[:40])}s and {rng.randint(1, 9)} cats"


def _g_tags(rng):
    a, b, c = rng.sample(WORDS[:40], 3)
    return rng.choice((f"Loving the #{a} and the #{b} today", f"#{a} time at the {b} #{c}", f"no tags here, {a}"))


def _g_hex(rng):
    digits = "".join(rng.choice("0123456789abcdefg") for _ in range(rng.choice((3, 6, 6, 5))))
    return "#" + digits


def _g_digits(rng):
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(8, 16)))


def _g_missing(rng):
    k = rng.randint(4, 8)
    values = list(range(1, k + 1))
    values.remove(rng.randint(1, k))
    rng.shuffle(values)
    return values


def _g_anagrams(rng):
    word = rng.choice(WORDS[:40])
    other = "".join(rng.sample(word, len(word))) if rng.random() < 0.5 else rng.choice(WORDS[:40])
    return word, other


def _g_lohi(rng):
    lo = rng.randint(0, 10)
    return _g_ints(rng), lo, lo + rng.randint(3, 15)


def _g_intervals(rng):
    return sorted((s, s + rng.randint(1, 5)) for s in rng.sample(range(0, 20), rng.randint(2, 4)))


ARG_MAKERS = {
    "word": _g_word, "sentence": _g_sentence, "ints": _g_ints, "pos": _g_pos, "sorted": _g_sorted,
    "words": _g_words, "prefixed": _g_prefixed, "dict": _g_dict, "matrix": _g_matrix, "nested": _g_nested,
    "camel": _g_camel, "snake": _g_snake, "runs": _g_runs, "time": _g_time, "date": _g_date, "email": _g_email,
    "kv": _g_kv,
    "textnums": _g_text_nums, "tags": _g_tags, "hex": _g_hex, "digits": _g_digits, "missing": _g_missing,
    "anagrams": _g_anagrams, "lohi": _g_lohi, "intervals": _g_intervals,
    "int": lambda rng: rng.randint(0, 60), "small": lambda rng: rng.randint(1, 5), "n": lambda rng: rng.randint(1, 12),
    "big": lambda rng: rng.randint(10, 9999), "year": lambda rng: rng.randint(1890, 2110),
    "char": lambda rng: rng.choice("aeilnorst"), "celsius": lambda rng: rng.choice((-10, 0, 12.5, 21, 37, 100)),
    "three": lambda rng: rng.choice((153, 370, 371, 407, rng.randint(100, 999))),
    "bin": lambda rng: format(rng.randint(1, 255), "b"), "sub": lambda rng: rng.choice(("an", "a", "er", "oo", "ss")),
}


# --- tasks: a reference implementation, the task as a docstring and as a phrase ---------------------------------

class Task(NamedTuple):
    names: str  # alternative function names, "|"-separated
    params: str  # "name|alt: hint, name2: hint2"
    ret: str
    doc: str  # the task, {0} {1} ... naming the parameters
    short: str  # the same task as an MBPP-style infinitive phrase
    fn: Callable
    args: str  # ARG_MAKERS keys, one per parameter, or one key that makes all of them


def _runs(s):
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f"{s[i]}{j - i}")
        i = j
    return "".join(out)


def _prefix(words):
    first = min(words, key=len)
    k = next((i for i, ch in enumerate(first) if any(w[i] != ch for w in words)), len(first))
    return first[:k]


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _is_prime(n):
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _factors(n):
    out, d = [], 2
    while n > 1:
        while n % d == 0:
            out.append(d)
            n //= d
        d += 1
    return out


def _collatz(n):
    steps = 0
    while n > 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def _longest_run(xs):
    best = cur = 1 if xs else 0
    for x, y in pairwise(xs):
        cur = cur + 1 if y > x else 1
        best = max(best, cur)
    return best


def _merge_intervals(items):
    out = []
    for s, e in sorted(items):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


TASKS = (
    # strings
    Task("count_vowel_letters|vowel_total|tally_vowels", "text|phrase: str", "int",
         "Count the vowels (a, e, i, o, u, in either case) in {0}.", "count the vowel letters in a given string",
         lambda s: sum(ch in "aeiouAEIOU" for ch in s), "sentence"),
    Task("reverse_word_order|flip_words", "sentence|line: str", "str",
         "Return {0} with its words in reverse order, separated by single spaces.",
         "reverse the order of the words in a sentence", lambda s: " ".join(s.split()[::-1]), "sentence"),
    Task("reads_same_both_ways|is_mirror_word", "word|token: str", "bool",
         "Return True if {0} reads the same forwards and backwards, ignoring case.",
         "check whether a word reads the same forwards and backwards ignoring case",
         lambda s: s.lower() == s.lower()[::-1], "word"),
    Task("capitalize_each|title_words", "sentence|phrase: str", "str",
         "Return {0} with the first letter of every word in upper case.",
         "capitalize the first letter of every word in a sentence",
         lambda s: " ".join(w[:1].upper() + w[1:] for w in s.split()), "sentence"),
    Task("drop_vowels|strip_vowels", "word|text: str", "str", "Return {0} with every vowel removed.",
         "remove every vowel from a string", lambda s: "".join(c for c in s if c.lower() not in "aeiou"), "sentence"),
    Task("occurrences_of|char_count", "text: str, ch|letter: str", "int",
         "Count how many times the character {1} appears in {0}.", "count the occurrences of a character in a string",
         lambda s, c: s.count(c), ("sentence", "char")),
    Task("longest_word_in|find_longest_word", "sentence|text: str", "str",
         "Return the longest word in {0}. If several words tie, return the first one.",
         "find the longest word in a sentence, keeping the first one on ties",
         lambda s: max(s.split(), key=len), "sentence"),
    Task("letter_histogram|char_counts", "word|text: str", "dict[str, int]",
         "Return a dictionary mapping each character of {0} to the number of times it occurs.",
         "build a dictionary counting each character in a string", lambda s: dict(Counter(s)), "word"),
    Task("run_length_encode|compress_runs", "text|s: str", "str",
         "Compress {0} by replacing each run of equal characters with the character and the run length.",
         "compress a string by writing each run of repeated characters as the character and a count",
         _runs, "runs"),
    Task("same_letters|is_rearrangement", "first|a: str, second|b: str", "bool",
         "Return True if {1} uses exactly the same letters as {0}, each the same number of times.",
         "check whether two words use exactly the same letters", lambda a, b: sorted(a) == sorted(b), "anagrams"),
    Task("camel_to_snake|snake_from_camel", "name|identifier: str", "str",
         "Convert the camelCase identifier {0} to snake_case.", "convert a camel case identifier to snake case",
         lambda s: re.sub(r"(?<!^)(?=[A-Z])", "_", s).lower(), "camel"),
    Task("snake_to_camel|camel_from_snake", "name|identifier: str", "str",
         "Convert the snake_case identifier {0} to camelCase.", "convert a snake case identifier to camel case",
         lambda s: s.split("_")[0] + "".join(w.capitalize() for w in s.split("_")[1:]), "snake"),
    Task("word_total|count_words_in", "text|sentence: str", "int", "Return the number of words in {0}.",
         "count the words in a sentence separated by whitespace", lambda s: len(s.split()), "sentence"),
    Task("first_repeat|first_repeated_letter", "text|word: str", "str",
         "Return the first character of {0} that appears a second time, or an empty string if none repeats.",
         "find the first character that repeats in a string",
         lambda s: next((c for i, c in enumerate(s) if c in s[:i]), ""), "word"),
    Task("all_digits|is_numeric_string", "text|s: str", "bool",
         "Return True if {0} is non-empty and contains only the digits 0-9.",
         "check whether a string contains only digits", lambda s: s.isdigit(), "digits"),
    Task("make_acronym|initials_of", "phrase|sentence: str", "str",
         "Return the acronym of {0}: the first letter of each word, in upper case.",
         "build the upper-case acronym of a phrase", lambda s: "".join(w[0].upper() for w in s.split()), "sentence"),
    Task("shift_letters|rotate_letters", "word|text: str, shift|k: int", "str",
         "Shift every lower-case letter of {0} forward by {1} places in the alphabet, wrapping from z to a.",
         "shift every letter of a string forward by k places in the alphabet",
         lambda s, k: "".join(chr((ord(c) - 97 + k) % 26 + 97) if c.islower() else c for c in s), ("word", "small")),
    Task("has_unique_chars|no_repeated_letters", "word|text: str", "bool",
         "Return True if no character occurs more than once in {0}.",
         "test that no character appears twice in a string", lambda s: len(set(s)) == len(s), "word"),
    Task("remove_punctuation|strip_punct", "text|sentence: str", "str",
         "Return {0} without the characters . , ! ? ; and :.", "remove the punctuation marks from a sentence",
         lambda s: "".join(c for c in s if c not in ".,!?;:"), "textnums"),
    Task("shared_prefix|common_start", "words|items: list[str]", "str",
         "Return the longest prefix that all strings in {0} share.",
         "find the longest prefix shared by a list of words",
         _prefix, "prefixed"),
    Task("count_overlapping|substring_hits", "text: str, part|sub: str", "int",
         "Count the occurrences of {1} in {0}, counting overlapping ones.",
         "count how many times a substring occurs in a string, overlaps included",
         lambda s, t: sum(s.startswith(t, i) for i in range(len(s))), ("sentence", "sub")),
    Task("mask_number|hide_digits", "number|digits: str", "str",
         "Replace all but the last four characters of {0} with '*'.",
         "mask all but the last four digits of a card number", lambda s: "*" * (len(s) - 4) + s[-4:], "digits"),
    Task("uses_every_letter|is_full_alphabet", "sentence|text: str", "bool",
         "Return True if {0} contains every letter of the English alphabet at least once.",
         "check whether a sentence uses every letter of the alphabet",
         lambda s: set("abcdefghijklmnopqrstuvwxyz") <= set(s.lower()), "sentence"),
    Task("word_sizes|lengths_of_words", "sentence|text: str", "list[int]",
         "Return the lengths of the words in {0}, in order.", "return the length of each word in a sentence",
         lambda s: [len(w) for w in s.split()], "sentence"),
    Task("alphabetize_letters|sorted_letters", "word|text: str", "str",
         "Return the characters of {0} sorted in alphabetical order.", "sort the characters of a word alphabetically",
         lambda s: "".join(sorted(s)), "word"),
    Task("weave|interleave", "left|a: str, right|b: str", "str",
         "Interleave the characters of {0} and {1}, starting with {0}; append what is left of the longer one.",
         "interleave the characters of two strings",
         lambda a, b: "".join(x + y for x, y in zip(a, b, strict=False)) + a[len(b):] + b[len(a):], ("word", "word")),
    Task("dedupe_letters|unique_in_order", "text|word: str", "str",
         "Return {0} with repeated characters removed, keeping the first occurrence of each.",
         "remove repeated characters from a string keeping the first occurrences",
         lambda s: "".join(dict.fromkeys(s)), "word"),
    Task("vowel_indexes|where_vowels", "word|text: str", "list[int]",
         "Return the indexes of the vowels in {0}.", "list the positions of the vowels in a string",
         lambda s: [i for i, c in enumerate(s) if c.lower() in "aeiou"], "word"),
    # lists
    Task("even_total|sum_even_values", "numbers|values: list[int]", "int", "Return the sum of the even numbers in {0}.",
         "add up the even numbers in a list", lambda xs: sum(x for x in xs if x % 2 == 0), "ints"),
    Task("runner_up|second_biggest", "numbers|values: list[int]", "int",
         "Return the second largest distinct value in {0}. Assume there are at least two distinct values.",
         "find the second largest distinct value in a list",
         lambda xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else xs[0], "ints"),
    Task("prefix_sums|running_totals", "numbers|values: list[int]", "list[int]",
         "Return the running totals of {0}: element i is the sum of the first i + 1 numbers.",
         "compute the running totals of a list of numbers",
         lambda xs: [sum(xs[: i + 1]) for i in range(len(xs))], "ints"),
    Task("drop_repeats|unique_values", "numbers|values: list[int]", "list[int]",
         "Return {0} without duplicates, keeping the order of first appearance.",
         "remove duplicates from a list while keeping the original order", lambda xs: list(dict.fromkeys(xs)), "pos"),
    Task("count_above|how_many_greater", "numbers: list[int], limit|threshold: int", "int",
         "Return how many numbers in {0} are strictly greater than {1}.",
         "count the numbers in a list that are greater than a threshold",
         lambda xs, t: sum(x > t for x in xs), ("ints", "int")),
    Task("neighbour_gaps|step_differences", "numbers|values: list[int]", "list[int]",
         "Return the differences between consecutive elements of {0}.",
         "compute the differences between consecutive elements of a list",
         lambda xs: [b - a for a, b in pairwise(xs)], "ints"),
    Task("rotate_by|shift_left", "items|numbers: list[int], k|steps: int", "list[int]",
         "Rotate {0} to the left by {1} positions.", "rotate a list to the left by k positions",
         lambda xs, k: xs[k % len(xs):] + xs[: k % len(xs)], ("ints", "small")),
    Task("split_into_chunks|batches", "items|numbers: list[int], size|width: int", "list[list[int]]",
         "Split {0} into consecutive chunks of length {1}; the last chunk may be shorter.",
         "split a list into chunks of a given size", lambda xs, k: [xs[i:i + k] for i in range(0, len(xs), k)],
         ("ints", "small")),
    Task("flatten_once|concat_lists", "groups|nested: list[list[int]]", "list[int]",
         "Flatten {0}, a list of lists, into one list.", "flatten a list of lists into a single list",
         lambda xss: [x for xs in xss for x in xs], "nested"),
    Task("value_spread|max_minus_min", "numbers|values: list[int]", "int",
         "Return the difference between the largest and the smallest number in {0}.",
         "compute the range (largest minus smallest) of a list", lambda xs: max(xs) - min(xs), "ints"),
    Task("indexes_of|positions", "items|numbers: list[int], target|value: int", "list[int]",
         "Return every index at which {1} occurs in {0}.", "find all the positions of a value in a list",
         lambda xs, t: [i for i, x in enumerate(xs) if x == t], ("pos", "small")),
    Task("merge_two_sorted|combine_sorted", "left|a: list[int], right|b: list[int]", "list[int]",
         "Merge the sorted lists {0} and {1} into one sorted list without calling sort.",
         "merge two sorted lists into one sorted list", lambda a, b: sorted(a + b), ("sorted", "sorted")),
    Task("average_of|mean_value", "numbers|values: list[int]", "float",
         "Return the arithmetic mean of {0}, rounded to two decimal places.",
         "return the mean of some integers rounded to 2 places",
         lambda xs: round(sum(xs) / len(xs), 2), "ints"),
    Task("multiply_all|product_of", "numbers|values: list[int]", "int", "Return the product of all numbers in {0}.",
         "compute the product of a list of integers", lambda xs: math.prod(xs), "pos"),
    Task("window_means|sliding_average", "numbers: list[int], window|k: int", "list[float]",
         "Return the averages of every window of {1} consecutive numbers in {0}.",
         "compute the moving average of a list over windows of size k",
         lambda xs, k: [sum(xs[i:i + k]) / k for i in range(len(xs) - k + 1)], ("ints", "small")),
    Task("is_non_decreasing|in_order", "numbers|values: list[int]", "bool",
         "Return True if {0} is sorted in non-decreasing order.", "test if a list of numbers is in ascending order",
         lambda xs: all(a <= b for a, b in pairwise(xs)), "ints"),
    Task("sign_flips|count_sign_changes", "numbers|values: list[int]", "int",
         "Count how often the sign changes between consecutive non-zero numbers in {0}.",
         "count the sign changes between consecutive numbers of a list",
         lambda xs: sum((a < 0) != (b < 0) for a, b in pairwise(x for x in xs if x)), "ints"),
    Task("every_other|alternate_items", "items|values: list[int]", "list[int]",
         "Return the elements of {0} at even indexes.", "take every other element of a list starting at the first",
         lambda xs: xs[::2], "ints"),
    Task("longest_rising_run|increasing_streak", "numbers|values: list[int]", "int",
         "Return the length of the longest run of strictly increasing consecutive numbers in {0}.",
         "return how long the longest strictly increasing stretch of a list is", _longest_run, "ints"),
    Task("pair_up|to_mapping", "keys|names: list[str], values|counts: list[int]", "dict[str, int]",
         "Build a dictionary from {0} and {1}, pairing elements with the same index.",
         "build a dictionary from a list of keys and a list of values",
         lambda ks, vs: dict(zip(ks, vs, strict=False)), ("words", "pos")),
    Task("most_frequent|commonest", "numbers|values: list[int]", "int",
         "Return the most frequent value in {0}; on ties return the one that appears first.",
         "find the most frequent element of a list", lambda xs: Counter(xs).most_common(1)[0][0], "pos"),
    Task("split_parity|evens_and_odds", "numbers|values: list[int]", "tuple[list[int], list[int]]",
         "Return a tuple of two lists: the even numbers of {0} and the odd ones, each in their original order.",
         "separate the even and odd numbers of a list into two lists",
         lambda xs: ([x for x in xs if x % 2 == 0], [x for x in xs if x % 2]), "ints"),
    Task("clamp_values|limit_range", "numbers: list[int], low|lo: int, high|hi: int", "list[int]",
         "Clamp every number in {0} into the range from {1} to {2}.", "clamp every number of a list into a range",
         lambda xs, lo, hi: [min(max(x, lo), hi) for x in xs], "lohi"),
    Task("odd_squares|square_the_odds", "numbers|values: list[int]", "list[int]",
         "Return the squares of the odd numbers in {0}.", "square the odd numbers of a list",
         lambda xs: [x * x for x in xs if x % 2], "ints"),
    Task("missing_number|find_gap", "numbers|values: list[int]", "int",
         "{0} holds the numbers 1 to n with exactly one missing, in any order. Return the missing number.",
         "find the one missing number in a shuffled list of 1 to n",
         lambda xs: (len(xs) + 1) * (len(xs) + 2) // 2 - sum(xs), "missing"),
    Task("running_max|best_so_far", "numbers|values: list[int]", "list[int]",
         "Return a list whose element i is the largest of the first i + 1 numbers of {0}.",
         "compute the running maximum of a list", lambda xs: [max(xs[: i + 1]) for i in range(len(xs))], "ints"),
    Task("merge_ranges|join_intervals", "intervals|spans: list[tuple[int, int]]", "list[tuple[int, int]]",
         "Merge the overlapping (start, end) pairs in {0} and return them sorted by start.",
         "merge the overlapping intervals in a list of pairs", _merge_intervals, "intervals"),
    # dictionaries
    Task("swap_keys_values|invert_mapping", "mapping|table: dict[str, int]", "dict[int, str]",
         "Return a new dictionary with the keys and values of {0} swapped.", "swap the keys and values of a dictionary",
         lambda d: {v: k for k, v in d.items()}, "dict"),
    Task("key_with_max|largest_key", "scores|mapping: dict[str, int]", "str",
         "Return the key of {0} with the largest value.", "find the key with the largest value in a dictionary",
         lambda d: max(d, key=d.get), "dict"),
    Task("add_counts|merge_tallies", "first|a: dict[str, int], second|b: dict[str, int]", "dict[str, int]",
         "Merge {0} and {1}, adding the values of keys that appear in both.",
         "combine two count tables, summing the counts that share a key",
         lambda a, b: {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}, ("dict", "dict")),
    Task("at_least|keep_large_values", "mapping|scores: dict[str, int], minimum|floor: int", "dict[str, int]",
         "Return the items of {0} whose value is at least {1}.",
         "keep only the dictionary entries whose value reaches a minimum",
         lambda d, m: {k: v for k, v in d.items() if v >= m}, ("dict", "int")),
    Task("bucket_by_length|group_by_size", "words|items: list[str]", "dict[int, list[str]]",
         "Group the strings in {0} by their length: map each length to the list of words of that length.",
         "group a list of words by their length", lambda ws: {n: [w for w in ws if len(w) == n] for n in
                                                               sorted({len(w) for w in ws})}, "words"),
    Task("word_frequencies|tally_words", "text|sentence: str", "dict[str, int]",
         "Return a dictionary counting how often each word occurs in {0}.",
         "count how often each word occurs in a text",
         lambda s: dict(Counter(s.split())), "sentence"),
    Task("keys_by_value|rank_keys", "scores|mapping: dict[str, int]", "list[str]",
         "Return the keys of {0} sorted by their values, smallest first.",
         "sort the keys of a dictionary by their values",
         lambda d: sorted(d, key=d.get), "dict"),
    Task("total_of_values|sum_values", "mapping|table: dict[str, int]", "int", "Return the sum of all values in {0}.",
         "add up all the values of a dictionary", lambda d: sum(d.values()), "dict"),
    # math
    Task("digit_total|sum_digits", "number|n: int", "int", "Return the sum of the decimal digits of {0}.",
         "add up the digits of a number", lambda n: sum(map(int, str(n))), "big"),
    Task("is_prime_number|check_prime", "number|n: int", "bool", "Return True if {0} is a prime number.",
         "check whether a number is prime", _is_prime, "int"),
    Task("greatest_divisor|common_factor", "a|x: int, b|y: int", "int",
         "Return the greatest common divisor of {0} and {1} using Euclid's algorithm.",
         "find the greatest common divisor of two numbers with the Euclidean algorithm", math.gcd, ("big", "big")),
    Task("fact|factorial_of", "n|number: int", "int", "Return {0}! (the product of the numbers 1 to {0}).",
         "compute the factorial of a number iteratively", math.factorial, "n"),
    Task("triangle_number|nth_triangle", "n|k: int", "int", "Return the sum 1 + 2 + ... + {0}.",
         "add the numbers from one to n", lambda n: n * (n + 1) // 2, "int"),
    Task("is_square_number|perfect_square", "number|n: int", "bool", "Return True if {0} is a perfect square.",
         "check whether a number is a perfect square", lambda n: math.isqrt(n) ** 2 == n, "int"),
    Task("divisor_count|how_many_divisors", "number|n: int", "int", "Return the number of positive divisors of {0}.",
         "count the divisors of a positive integer", lambda n: len(_divisors(n)), "int"),
    Task("binary_digits|as_binary", "number|n: int", "str",
         "Return the binary representation of {0} as a string without the '0b' prefix.",
         "convert a non-negative integer to a binary string", lambda n: format(n, "b"), "int"),
    Task("parse_binary|binary_value", "bits|digits: str", "int", "Return the integer value of the binary string {0}.",
         "convert a binary string to an integer", lambda s: int(s, 2), "bin"),
    Task("collatz_length|steps_to_one", "n|start: int", "int",
         "Return how many steps the Collatz rule (halve if even, else 3n + 1) takes to bring {0} down to 1.",
         "count the Collatz steps needed to reach one", _collatz, "big"),
    Task("reverse_digits|flip_number", "number|n: int", "int", "Return {0} with its decimal digits reversed.",
         "reverse the digits of a number", lambda n: int(str(n)[::-1]), "big"),
    Task("is_narcissistic|digit_power_sum", "number|n: int", "bool",
         "Return True if {0} equals the sum of its digits each raised to the number of digits.",
         "check whether a number equals the sum of its digits raised to the number of digits",
         lambda n: n == sum(int(d) ** len(str(n)) for d in str(n)), "three"),
    Task("prime_factorization|factorize", "number|n: int", "list[int]",
         "Return the prime factors of {0} in increasing order, with repetition.",
         "list the prime factors of a number with repetition", _factors, "big"),
    Task("least_multiple|lowest_common_multiple", "a|x: int, b|y: int", "int",
         "Return the least common multiple of {0} and {1}.", "find the least common multiple of two numbers",
         lambda a, b: a * b // math.gcd(a, b), ("n", "n")),
    Task("square_sum|sum_of_squares_to", "n|limit: int", "int", "Return 1^2 + 2^2 + ... + {0}^2.",
         "compute 1^2 + 2^2 + ... + n^2", lambda n: n * (n + 1) * (2 * n + 1) // 6, "n"),
    Task("is_power_of_two|power_two", "number|n: int", "bool", "Return True if {0} is a positive power of two.",
         "check whether a number is a power of two", lambda n: n > 0 and n & (n - 1) == 0, "int"),
    Task("first_fibs|fib_sequence", "count|n: int", "list[int]",
         "Return the first {0} numbers of the sequence that starts 0, 1 and adds the previous two.",
         "generate the first n numbers of the sequence where each is the sum of the two before",
         lambda n: [round(((1 + 5 ** .5) / 2) ** i / 5 ** .5) for i in range(n)], "n"),
    Task("to_fahrenheit|celsius_to_f", "celsius|degrees: float", "float",
         "Convert {0} degrees Celsius to Fahrenheit.", "convert a temperature from Celsius to Fahrenheit",
         lambda c: c * 9 / 5 + 32, "celsius"),
    Task("round_to_step|nearest_multiple", "value|x: int, step|base: int", "int",
         "Round {0} to the nearest multiple of {1}, rounding halves up.", "round a number to the nearest multiple of k",
         lambda x, k: (x + k // 2) // k * k, ("int", "small")),
    Task("repeated_digit_sum|digital_root", "number|n: int", "int",
         "Add the digits of {0} repeatedly until one digit is left and return it.",
         "find the single digit left after adding the digits of a number repeatedly",
         lambda n: 0 if n == 0 else 1 + (n - 1) % 9, "big"),
    Task("leap_year|is_leap", "year: int", "bool", "Return True if {0} is a leap year in the Gregorian calendar.",
         "check whether a year is a leap year", lambda y: y % 4 == 0 and (y % 100 != 0 or y % 400 == 0), "year"),
    # parsing
    Task("minutes_since_midnight|clock_minutes", "clock|time: str", "int",
         "{0} is a time written as 'HH:MM'. Return the number of minutes since midnight.",
         "convert a time written as HH:MM into minutes since midnight",
         lambda t: int(t[:2]) * 60 + int(t[3:]), "time"),
    Task("split_date|date_parts", "date|stamp: str", "tuple[int, int, int]",
         "Parse {0}, written as 'YYYY-MM-DD', into a (year, month, day) tuple of integers.",
         "parse a date written as YYYY-MM-DD into a tuple of integers",
         lambda s: tuple(map(int, s.split("-"))), "date"),
    Task("email_domain|domain_of", "address|email: str", "str", "Return the domain part of the e-mail address {0}.",
         "extract the domain from an email address", lambda s: s.split("@")[1], "email"),
    Task("parse_settings|read_pairs", "text|line: str", "dict[str, str]",
         "Parse {0}, a string of 'key=value' pairs separated by ';', into a dictionary of strings.",
         "parse a string of key=value pairs separated by semicolons into a dictionary",
         lambda s: dict(p.split("=") for p in s.split(";")), "kv"),
    Task("add_numbers_in|sum_of_numbers_in_text", "text|sentence: str", "int",
         "Return the sum of all whole numbers that appear in {0}.", "add up all the numbers that appear in a text",
         lambda s: sum(map(int, re.findall(r"\d+", s))), "textnums"),
    Task("hashtags_in|find_hashtags", "post|text: str", "list[str]",
         "Return the hashtags in {0} (words that start with '#'), without the '#'.",
         "extract the hashtags from a social media post", lambda s: re.findall(r"#(\w+)", s), "tags"),
    Task("is_hex_colour|valid_color", "code|value: str", "bool",
         "Return True if {0} is '#' followed by exactly 3 or 6 hexadecimal digits.",
         "check whether a string is a valid hexadecimal color code",
         lambda s: re.fullmatch(r"#([0-9a-fA-F]{3}|[0-9a-fA-F]{6})", s) is not None, "hex"),
    Task("flip_matrix|transpose", "grid|matrix: list[list[int]]", "list[list[int]]",
         "Return the transpose of the square matrix {0}.", "transpose a square matrix given as a list of lists",
         lambda m: [list(r) for r in zip(*m, strict=True)], "matrix"),
    Task("diagonal_total|trace_of", "grid|matrix: list[list[int]]", "int",
         "Return the sum of the main diagonal of the square matrix {0}.",
         "add up the main diagonal of a square matrix", lambda m: sum(m[i][i] for i in range(len(m))),
         "matrix"),
    Task("row_totals|sum_each_row", "grid|matrix: list[list[int]]", "list[int]",
         "Return the sum of each row of {0}.", "compute the sum of each row of a matrix", lambda m: [sum(r) for r in m],
         "matrix"),
)


# --- instances: names, parameters and worked examples of a task -------------------------------------------------

def _choose(alternatives: str, rng: random.Random) -> str:
    return rng.choice(alternatives.split("|"))


def _params(spec: str) -> list[tuple[str, str]]:
    """"a|b: int, c: dict[str, int]" -> [("a|b", "int"), ("c", "dict[str, int]")] (hints hold commas too)."""
    return re.findall(r"([\w|]+): (.+?)(?=, [\w|]+: |$)", spec)


def _task_call(task: Task, rng: random.Random) -> tuple[tuple, object] | None:
    keys = task.args if isinstance(task.args, tuple) else (task.args,)
    params = _params(task.params)
    try:
        args = ARG_MAKERS[keys[0]](rng) if len(keys) == 1 and len(params) > 1 else tuple(
            ARG_MAKERS[k](rng) for k in keys)
        return args, task.fn(*args)
    except (ValueError, IndexError, ZeroDivisionError, KeyError, TypeError):
        return None


def _task_instance(task: Task, rng: random.Random, k: int) -> tuple[str, list[tuple[str, str]], list[str]]:
    """A name, parameters and k worked examples of `task` (computed by running it: they are right)."""
    name = _choose(task.names, rng)
    params = []
    for names, hint in _params(task.params):
        params.append((_choose(names, rng), hint))
    examples = []
    for _ in range(3 * k):
        made = _task_call(task, rng)
        if made is None:
            continue
        args, result = made
        example = f"{name}({', '.join(map(repr, args))})\n{result!r}"
        if len(example) < 240 and example not in examples:
            examples.append(example)
        if len(examples) == k:
            break
    return name, params, examples
