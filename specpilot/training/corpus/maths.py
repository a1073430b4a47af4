"""Math prompts: word_problems (grade-school, multi-step), competition_math (LaTeX, the usual competition
subjects) and the first math family (templated arithmetic)."""

from __future__ import annotations

import random

from specpilot.datasets import _MATH_SUFFIX
from specpilot.training.corpus.common import _PRONOUNS, PEOPLE, WEEKDAYS, _distinct, _fill

# --- math: the first family, templated arithmetic ---------------------------------------------------------------

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jo", "Kofi", "Lena", "Mateo",
         "Noor", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq")
ITEMS = ("pencils", "apples", "stamps", "marbles", "books", "cookies", "stickers", "shells", "coins", "cards")
MATH_TEMPLATES = (
    "{name} has {a} {item}. {name} buys {b} packs with {c} {item} in each, then gives away {d}. "
    "How many {item} does {name} have now?",
    "A car travels {a} km in {b} hours. At the same speed, how far does it travel in {c} hours?",
    "Solve for x: {a}x + {b} = {c}.",
    "What is {a}% of {e}?",
    "Find the remainder when {e} is divided by {b}.",
    "Compute the sum of all integers from {b} to {e}.",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "Simplify the fraction {c}/{e}.",
    "If f(x) = {b}x^2 - {a}x + {c}, what is f({d})?",
    "{name} is paid ${a} for each hour worked, {b} hours daily, over {c} days, then spends ${d}. How much is left?",
    "A shop sells {item} at {b} for ${c}. How much do {e} {item} cost?",
    "How many positive divisors does {e} have?",
    "What is the greatest common divisor of {e} and {f}?",
    "The average of {b} numbers is {a}. One more number, {c}, is added. What is the new average?",
)
MATH_SUFFIXES = ("", " Show your reasoning step by step.", " Explain each step, then give the final answer.")


def math_prompts(n: int, rng: random.Random) -> list[str]:
    return _distinct(_math_one, n, rng)


def _math_one(rng: random.Random) -> str:
    values = {"a": rng.randint(2, 60), "b": rng.randint(2, 12), "c": rng.randint(2, 40), "d": rng.randint(1, 9),
              "e": rng.randint(20, 999), "f": rng.randint(20, 999), "name": rng.choice(NAMES),
              "item": rng.choice(ITEMS)}
    return rng.choice(MATH_TEMPLATES).format(**values) + rng.choice(MATH_SUFFIXES)


# --- word_problems: grade-school, multi-step --------------------------------------------------------------------

# (plural item, container, containers)
COUNTABLES = (("pencils", "box", "boxes"), ("apples", "bag", "bags"), ("stickers", "sheet", "sheets"),
              ("eggs", "carton", "cartons"), ("cookies", "tray", "trays"), ("marbles", "jar", "jars"),
              ("cupcakes", "box", "boxes"), ("trading cards", "pack", "packs"), ("beads", "packet", "packets"),
              ("seashells", "bucket", "buckets"), ("tomatoes", "crate", "crates"), ("crayons", "box", "boxes"),
              ("stamps", "album", "albums"), ("candles", "pack", "packs"), ("water bottles", "case", "cases"),
              ("tennis balls", "can", "cans"), ("muffins", "basket", "baskets"), ("buttons", "tin", "tins"),
              ("oranges", "crate", "crates"), ("granola bars", "box", "boxes"), ("toy cars", "set", "sets"),
              ("postcards", "bundle", "bundles"), ("socks", "pack", "packs"), ("light bulbs", "carton", "cartons"))
PRODUCTS = (("notebook", 3), ("T-shirt", 12), ("sandwich", 6), ("movie ticket", 9), ("board game", 24),
            ("desk lamp", 35), ("backpack", 40), ("bike helmet", 30), ("pizza", 14), ("pair of shoes", 55),
            ("jacket", 60), ("video game", 45), ("plant pot", 8), ("water bottle", 11), ("scarf", 18),
            ("puzzle", 16), ("cookbook", 22), ("headphone set", 70), ("soccer ball", 25), ("umbrella", 15))
BIG_PRODUCTS = ("bicycle", "laptop", "guitar", "tablet", "camera", "sofa", "telescope", "sewing machine",
                "keyboard", "tent")
JOBS = (("babysitting", 12), ("walking dogs", 9), ("tutoring", 20), ("mowing lawns", 15), ("washing cars", 10),
        ("working at a cafe", 14), ("delivering newspapers", 8), ("helping at a bakery", 13))
FOODS = ("pancakes", "muffins", "cookies", "dumplings", "tacos", "bread rolls", "brownies", "waffles")
FRUITS = ("apples", "pears", "peaches", "plums", "oranges", "lemons", "mangoes", "cherries")
PETS = ("dog", "cat", "rabbit", "parrot", "hamster", "guinea pig")
PLANTS = (("tomato plants", "tomatoes"), ("pepper plants", "peppers"), ("strawberry plants", "strawberries"),
          ("bean plants", "beans"), ("cucumber vines", "cucumbers"), ("squash plants", "squashes"))
FRACTIONS = (("half", 2), ("a third", 3), ("a quarter", 4), ("a fifth", 5), ("two thirds", 3),
             ("three quarters", 4), ("two fifths", 5), ("an eighth", 8))
PERCENTS = (5, 10, 12, 15, 20, 25, 30, 40, 50, 60, 75, 80)


WORD_TEMPLATES = (
    "{name} buys {a} {boxes} of {item}, and each {box} holds {e} {item}. {He} gives {x} {item} to each of {his} "
    "{d} friends and keeps the rest. How many {item} does {name} keep?",
    "{name} has ${big}. {He} spends {pct}% of it on a {prod} and then ${f} on lunch. How much money does {he} have "
    "left?",
    "A {prod} costs ${price}. During a sale the price is cut by {pct}%. {name} buys {a} of them on sale and pays "
    "${f} for delivery. How much does {he} pay in total?",
    "{name} earns ${wage} an hour {job}. Last week {he} worked {hours} hours on Monday, {a} hours on Wednesday and "
    "{b} hours on Saturday. {He} saves {frac} of what {he} earned. How much money does {he} save?",
    "{name} reads {f} pages of a {big}-page book on the first day and twice as many pages on the second day. On "
    "the third day {he} reads {frac} of the pages that are left. How many pages does {he} read on the third day?",
    "A train leaves the station at {start} and travels at {speed} km per hour for {hours} hours. It stops for "
    "{mins} minutes and then travels another {k} km at the same speed. How many kilometers does it travel in "
    "total, and at what time does it arrive?",
    "{name2} is {f} years old. {name} is {a} years older than {name2}, and {name3} is half as old as {name}. What "
    "is the sum of their three ages?",
    "A farmer has {h} hens. Each hen lays {c} eggs a week. The farmer sells the eggs for ${dozen} a dozen. How "
    "much money does the farmer make in {weeks} weeks?",
    "{name}'s {pet} eats {a} cups of food a day. A bag of food holds {big} cups and costs ${price}. How much does "
    "{name} spend on food in a year of 365 days if {he} can only buy whole bags?",
    "A school has {big} students. {pct}% of them take the bus, {frac} of the rest walk, and the others are driven "
    "by their parents. How many students are driven to school?",
    "{name} wants to buy a {bigprod} that costs ${big}. {He} already has ${h} and saves ${f} every week. How many "
    "weeks will it take {him} to have enough money?",
    "A recipe for {e} {food} uses {a} cups of flour and {b} eggs. {name} wants to make {emult} {food} for a "
    "party. How many cups of flour and how many eggs does {he} need?",
    "{name} runs {a} km every weekday and {f} km on Saturdays. {He} rests on Sundays. How many kilometers does "
    "{he} run in {weeks} weeks?",
    "In a class of {fm} students, {frac} are girls. {pct}% of the boys play soccer. How many boys in the class do "
    "not play soccer?",
    "{name} bought {a} shirts at ${f} each and {b} pairs of pants at ${g} each. {He} paid with {bills} $100 bills. "
    "How much change did {he} get?",
    "A water tank holds {bigr} liters and is {frac} full. A pump adds {f} liters per minute. How many minutes will "
    "it take to fill the tank?",
    "{name} has {h} {item}. {name2} has {a} more {item} than {name}, and {name3} has half as many as {name2}. How "
    "many {item} do the three of them have together?",
    "A store sells {item} for ${cost} each, or a {box} of {e} for ${boxprice}. How much does {name} save by "
    "buying {a} {boxes} instead of the same number of single {item}?",
    "{name} drives {k} miles to visit {name2} and then drives back home. {His} car uses one gallon of gas every "
    "{mpg} miles, and gas costs ${gas} per gallon. How much does the round trip cost in gas?",
    "At {start} the temperature was {temp} degrees. It rose {a} degrees every hour for {hours} hours and then fell "
    "{f} degrees by the evening. What was the temperature in the evening?",
    "{name} plants {c} rows of {plant} with {e} plants in each row. {pct}% of the plants do not survive, and each "
    "surviving plant gives {b} {produce}. How many {produce} does {name} harvest?",
    "A bakery bakes {big} {food} on Saturday. It sells {frac} of them in the morning and {f} in the afternoon. The "
    "rest are given to a shelter. How many {food} go to the shelter?",
    "{name} puts ${a} in a jar on the first day, ${a2} on the second day, ${a4} on the third day, and keeps "
    "doubling the amount each day. How much money is in the jar after {days} days?",
    "A movie starts at {start} and lasts {len_h} hours and {mins} minutes. After the movie, {name} spends {mins2} "
    "minutes eating dinner. At what time does {he} finish dinner?",
    "{name} scored {s1}, {s2} and {s3} on {his} first three tests. What score does {he} need on the fourth test to "
    "have an average of {avg}?",
    "There are {big} people at a concert. Tickets cost ${g} for adults and ${f} for children. If {pct}% of the "
    "people are children, how much money was collected from tickets?",
    "A phone plan costs ${f} a month plus ${cost} for each gigabyte of data. {name} used {a} gigabytes in January "
    "and {b} gigabytes in February. How much did {he} pay for the two months?",
    "{name} walks dogs for ${a} per dog per walk. {He} walks {b} dogs twice a day, {days} days a week. How much "
    "does {he} earn in {weeks} weeks?",
    "A library had {big} books. It bought {h} new books and gave away {f} old ones. Then {pct}% of all the books "
    "were checked out. How many books were still on the shelves?",
    "{name} and {name2} share ${share} in the ratio {r1}:{r2}. {name} then spends {frac} of {his} share on a "
    "{prod}. How much money does {name} have left?",
    "A pool is {pool} meters long. {name} swims {c} laps, where one lap is there and back, and {name2} swims {k}0 "
    "meters. Who swims farther, and by how many meters?",
    "{name} orders {a} pizzas cut into 8 slices each. {He} eats {x} slices, {his} {d} friends eat {y} slices each, "
    "and the rest are saved for later. How many slices are saved?",
    "A cyclist rides at {speed2} km per hour for {mins} minutes and then at {speed3} km per hour for {mins2} "
    "minutes. How many kilometers does the cyclist ride in total?",
    "{name} is filling bags with {item}. Each bag holds {e} {item}, and {he} has {big} {item}. How many bags can "
    "{he} fill completely, and how many {item} are left over?",
    "A {prod} costs ${price} before tax. {name} has a coupon for ${x} off the price, and the sales tax of {tax}% is "
    "added after the coupon. How much does {name} pay?",
    "{name} sleeps every night from {bed} p.m. until {wake} a.m. How many hours of sleep does {he} get in "
    "{weeks} weeks?",
    "A rectangular garden is {g} meters long and {f} meters wide. A path {x} meters wide runs around the outside "
    "of the garden. What is the area of the path?",
    "{name} has a collection of {fm} {item}. {He} sells {frac} of them for ${cost} each and gives {a} to {name2}. "
    "How much money did {he} make, and how many {item} does {he} have left?",
    "{name} can paint a fence panel in {mins} minutes, and {name2} can paint one in {mins2} minutes. Working at the "
    "same time, how many panels can they paint together in {hours} hours?",
    "{name}'s monthly salary is ${salary}. {He} spends {rent}% of it on rent, {pct2}% on food and ${f}0 on "
    "transport, and saves the rest. How much does {he} save in a year?",
    "A car rental costs ${g} per day plus ${cost} per mile. {name} rents a car for {days} days and drives {big} "
    "miles. How much does the rental cost in total?",
    "{name} bought a {bigprod} for ${big} and sold it a year later for {pct}% less. {He} used the money to buy "
    "{item} at ${f} each. How many {item} could {he} buy?",
    "A classroom has {a} shelves. Each shelf holds {e} {boxes}, and each {box} has {f} {item}. The teacher shares "
    "all the {item} equally among {kids} students. How many {item} does each student get?",
    "{name} practices the piano for {mins} minutes on weekdays and {mins2} minutes on each weekend day. How many "
    "hours does {he} practice in {weeks} weeks?",
    "An orchard has {c} rows of {e} trees. Each tree gives {h} {fruit}, and {pct}% of them are too small to sell. "
    "The rest are packed in boxes of {pack}. How many full boxes are there?",
    "{name} had {big} followers online. The number grew by {pct}% in the first month and by {pct2}% in the second "
    "month. How many followers does {he} have now?",
    "A printer prints {f} pages per minute. {name} needs {a} copies of a {h}-page report, and the printer stops "
    "for {mins0} minutes to add paper. How many minutes does the whole job take?",
    "{name} buys {a} kilograms of {fruit} at ${cost} per kilogram and {b} kilograms of {fruit2} at ${cost2} per "
    "kilogram. {He} pays with a ${note} bill. How much change does {he} get?",
    "{name} has {fm} {item}. {name2} has {frac} as many as {name}, and {name3} has {x} fewer than {name2}. How many "
    "{item} do they have altogether?",
    "A bus can carry {cap} passengers. {big} students and {c} teachers are going on a school trip. How many buses "
    "are needed, and how many seats are left empty?",
    "{name} works {hours} hours a day, {days} days a week, and is paid ${wage} an hour. {He} gets a raise of "
    "{pct}%. How much more does {he} earn in {weeks} weeks after the raise than before it?",
    "On {day}, {name} sold {h} tickets. On each of the next {b} days {he} sold {a} more tickets than the day "
    "before. How many tickets did {he} sell over all those days?",
    "A box of {e} {food} costs ${price}. {name} needs {k} {food} for a school event and has ${big}. After buying "
    "enough boxes, how much money does {he} have left?",
    "{name} filled {a} jugs with {b} liters of juice each. {He} poured the juice into glasses that hold 250 "
    "milliliters. How many glasses did {he} fill?",
    "A factory makes {big} {item} an hour. It runs for {hours} hours a day, and {pct}% of the {item} fail the "
    "quality check. How many good {item} does it make in {days} days?",
)


def _people(rng: random.Random, k: int) -> dict:
    values = {}
    for i, (name, g) in enumerate(rng.sample(PEOPLE, k)):
        suffix = "" if i == 0 else str(i + 1)
        he, him, his, He, His = _PRONOUNS[g]
        values.update({f"name{suffix}": name, f"he{suffix}": he, f"him{suffix}": him, f"his{suffix}": his,
                       f"He{suffix}": He, f"His{suffix}": His})
    return values


def _money(x: float) -> str:
    return f"{x:.2f}" if x != int(x) else str(int(x))


def _word_values(rng: random.Random) -> dict:
    r = rng.randint
    item, box, boxes = rng.choice(COUNTABLES)
    prod, price = rng.choice(PRODUCTS)
    job, wage = rng.choice(JOBS)
    frac, den = rng.choice(FRACTIONS)
    plant, produce = rng.choice(PLANTS)
    fruit, fruit2 = rng.sample(FRUITS, 2)
    a, b, e, f, g = r(2, 9), r(2, 9), r(4, 12), r(10, 30), r(10, 30)
    r1, r2 = rng.sample(range(1, 8), 2)
    cost = rng.choice((0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 3.5))
    hour = r(6, 11)
    return {
        **_people(rng, 3), "item": item, "box": box, "boxes": boxes, "prod": prod, "price": price + r(0, 5),
        "bigprod": rng.choice(BIG_PRODUCTS), "job": job, "wage": wage + r(0, 4), "frac": frac, "fm": den * r(4, 15),
        "plant": plant, "produce": produce, "fruit": fruit, "fruit2": fruit2, "food": rng.choice(FOODS),
        "pet": rng.choice(PETS), "day": rng.choice(WEEKDAYS), "a": a, "b": b, "c": r(3, 9), "d": r(2, 5), "e": e,
        "f": f, "g": g, "h": r(20, 99), "k": r(40, 300), "x": r(1, 3), "y": r(1, 3), "big": r(12, 95) * 10,
        "bigr": r(20, 90) * 10 * den, "pct": rng.choice(PERCENTS), "pct2": rng.choice(PERCENTS[:6]),
        "rent": r(20, 40), "tax": rng.choice((5, 6, 7, 8, 10)), "hours": r(2, 8), "len_h": r(1, 2),
        "mins": rng.choice((15, 20, 25, 30, 35, 40, 45, 50)), "mins2": rng.choice((10, 15, 20, 30, 40, 45)),
        "mins0": r(2, 9), "start": f"{hour}:{rng.choice(('00', '15', '30', '45'))} a.m.", "bed": r(8, 11),
        "wake": r(5, 8), "days": r(3, 7), "weeks": r(2, 8), "speed": rng.choice((40, 50, 60, 72, 80, 90, 120)),
        "speed2": rng.choice((12, 15, 18, 20, 24)), "speed3": rng.choice((10, 16, 21, 25, 30)),
        "emult": e * r(2, 5), "bills": (a * f + b * g) // 100 + 1, "cost": _money(cost),
        "boxprice": _money(round(cost * e * rng.choice((0.6, 0.75, 0.8, 0.9)), 2)), "cost2": _money(cost + r(1, 4)),
        "mpg": rng.choice((20, 24, 25, 30, 32, 35, 40)), "gas": _money(rng.choice((3, 3.5, 4, 4.25, 4.5))),
        "temp": r(40, 75), "dozen": r(3, 7), "a2": 2 * a, "a4": 4 * a, "s1": r(70, 98), "s2": r(65, 98),
        "s3": r(70, 99), "avg": r(80, 90), "share": (r1 + r2) * r(10, 60), "r1": r1, "r2": r2,
        "pool": rng.choice((25, 50)), "salary": r(25, 80) * 100, "kids": rng.choice((6, 8, 10, 12, 15, 20, 24, 30)),
        "pack": rng.choice((6, 8, 10, 12, 20, 24)), "note": rng.choice((20, 50, 100)),
        "cap": rng.choice((30, 40, 45, 50, 52, 60)),
    }


def _word_one(rng: random.Random) -> str:
    text = rng.choice(WORD_TEMPLATES).format(**_word_values(rng))
    return text + _MATH_SUFFIX if rng.random() < 0.5 else text


def word_problems(n: int, rng: random.Random) -> list[str]:
    """Grade-school word problems of 2-5 steps; half in the benchmark's format (the boxed-answer suffix)."""
    return _distinct(_word_one, n, rng)


# --- competition_math: LaTeX problems over the usual competition subjects ---------------------------------------

def _poly(coeffs: list[int], var: str = "x") -> str:
    """LaTeX of a polynomial from its coefficients, highest degree first: [1, -3, 2] -> x^2 - 3x + 2."""
    terms = []
    for power, c in zip(range(len(coeffs) - 1, -1, -1), coeffs, strict=True):
        if c == 0:
            continue
        mono = "" if power == 0 else var if power == 1 else f"{var}^{{{power}}}" if power > 9 else f"{var}^{power}"
        body = str(abs(c)) if abs(c) != 1 or power == 0 else ""
        terms.append(("-" if c < 0 else "+", body + mono))
    if not terms:
        return "0"
    sign, first = terms[0]
    return ("-" if sign == "-" else "") + first + "".join(f" {s} {t}" for s, t in terms[1:])


ANGLES = (30, 45, 60, 120, 135, 150, 210, 225, 240, 300, 315, 330)
LETTER_WORDS = ("BANANA", "PEPPER", "BALLOON", "COOKBOOK", "STATS", "TOMATO", "LETTER", "SUCCESS", "GIRAFFE",
                "PIZZAZZ", "COFFEE", "RACECAR", "ALFALFA", "TATTOO", "BOOKKEEPER", "MAMMAL", "PAPAYA", "CANCEL")
TRIPLES = ((3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29), (9, 40, 41))
SQUAREFREE = (2, 3, 5, 6, 7, 10, 11, 13, 14, 15)
COMP_TEMPLATES = (
    # algebra
    r"What is the sum of all values of $x$ that satisfy $<quad> = 0$?",
    r"Solve for $x$: $\frac{<a>x - <b>}{<c>} = <d>$. Express your answer as a common fraction.",
    r"A line passes through the points $(<x1>, <y1>)$ and $(<x2>, <y2>)$. If its equation is written as "
    r"$y = mx + b$, what is $m + b$?",
    r"If $<a>^{x + <c>} = <apow>$, what is the value of $x$?",
    r"Find the distance between the points $(<x1>, <y1>)$ and $(<x2>, <y2>)$. Give your answer in simplest radical "
    r"form.",
    r"What is the largest integer $n$ for which $<a>n + <b> < <N>$?",
    r"Write $\sqrt{<sq>} + \sqrt{<sq2>}$ in simplest radical form.",
    r"The sum of two numbers is $<S>$ and their difference is $<D>$. What is the product of the two numbers?",
    r"For which positive value of $k$ does $x^2 + kx + <m2> = 0$ have exactly one real solution?",
    r"Let $h(t) = <a>t + <b>$ and $k(t) = t^2 - <c>$. Find $h(k(<d>)) - k(h(1))$.",
    r"What is the domain of $f(x) = \sqrt{<N> - <a>x}$? Write your answer in interval notation.",
    r"Evaluate $\left(\frac{<a>}{<b>}\right)^{<k>} \cdot \left(\frac{<b>}{<a>}\right)^{<k1>}$.",
    # number theory
    r"What is the remainder when $<a>^{<n>}$ is divided by $<p>$?",
    r"How many positive divisors does $<N2>$ have, and what is their sum?",
    r"Find the greatest common divisor of $<N>$ and $<N2>$, and then their least common multiple.",
    r"What is the least common multiple of $<a>$, $<n>$, and $<b2>$?",
    r"Write the base-ten number $<num>$ in base $<base>$.",
    r"What is the sum of the digits when $<num>_{10}$ is written in base $<base>$?",
    r"Find the smallest positive integer $n$ with $n \equiv <q1> \pmod{<m1>}$ and $n \equiv <q2> \pmod{<mod2>}$.",
    r"What is the units digit of $<a>^{<big>} + <b>^{<n>}$?",
    r"How many three-digit positive integers are multiples of both $<a>$ and $<b>$?",
    r"What is the sum of all prime numbers between $<n>$ and $<N>$ that end in the digit $<odd>$?",
    # counting and probability
    r"Evaluate $\binom{<nn>}{<kk>} + \binom{<nn>}{<kk1>}$.",
    r"How many seatings of $<people>$ people at a round table keep two particular people apart? Rotations of a "
    r"seating count as the same seating.",
    r"A bag holds $<red>$ red marbles and $<blue>$ blue marbles. Two marbles are drawn at random without "
    r"replacement. What is the probability that both are red? Express your answer as a common fraction.",
    r"How many distinct arrangements of the letters in the word <WORD> are there?",
    r"Two fair $<sides>$-sided dice are rolled. What is the probability that the sum of the two numbers is $<t>$?",
    r"A committee of $<kk>$ people is chosen from $<women>$ women and $<men>$ men. How many committees contain at "
    r"least one woman?",
    r"How many positive integers less than $<N>$ are multiples of $<a>$ but not of $<b>$?",
    r"A fair coin is flipped $<flips>$ times. What is the probability of getting exactly $<kk>$ heads? Express "
    r"your answer as a common fraction.",
    r"How many $<kk>$-digit positive integers have digits that are all odd and strictly increasing?",
    # geometry
    r"A right triangle has legs of lengths $<l1>$ and $<l2>$. What is the length of the altitude to the "
    r"hypotenuse?",
    r"The area of a circle is $<r2>\pi$ square units. What is its circumference, in terms of $\pi$?",
    r"In triangle $ABC$, $\angle A = <A>^\circ$ and $\angle B$ is $<D>^\circ$ larger than $\angle A$. What is "
    r"the measure of $\angle C$, in degrees?",
    r"A cylinder has radius $<r>$ and height $<h>$. What is its total surface area? Express your answer in terms "
    r"of $\pi$.",
    r"What is the measure, in degrees, of one interior angle of a regular polygon with $<sides>$ sides?",
    r"A rectangle has a diagonal of length $<l3>$ and one side of length $<l1>$. What is its area?",
    r"A sphere has surface area $<s4>\pi$. What is its volume? Express your answer in terms of $\pi$.",
    r"Two similar triangles have areas in the ratio $<a2>:<b2>$. The smaller triangle has a perimeter of "
    r"$<per>$. What is the perimeter of the larger triangle?",
    # precalculus
    r"Compute $\sin <ang>^\circ + \cos <ang2>^\circ$.",
    r"Convert the point $(<x1>, <y1>)$ from rectangular to polar coordinates, with $r > 0$ and "
    r"$0 \le \theta < 2\pi$.",
    r"Find the determinant of $\begin{pmatrix} <a> & <x1> \\ <y1> & <b> \end{pmatrix}$.",
    r"Compute $\begin{pmatrix} <v1> \\ <v2> \\ <v3> \end{pmatrix} \cdot \begin{pmatrix} <v4> \\ <v5> \\ <v6> "
    r"\end{pmatrix}$.",
    r"What is the period of $y = <a>\sin(<k>x) + <b>$?",
    r"Simplify $(<a> + <b>i)(<c> - <d>i)$, where $i^2 = -1$.",
    r"Find $|<a2> - <b2>i|$ and the argument of $<a2> - <b2>i$ in radians.",
    r"Find the matrix $\mathbf{M}$ such that $\mathbf{M} \begin{pmatrix} 1 \\ 0 \end{pmatrix} = \begin{pmatrix} "
    r"<a> \\ <x1> \end{pmatrix}$ and $\mathbf{M} \begin{pmatrix} 0 \\ 1 \end{pmatrix} = \begin{pmatrix} <y1> \\ <b> "
    r"\end{pmatrix}$, and compute $\mathbf{M}^2$.",
    # intermediate algebra
    r"Find the remainder when $<cubic>$ is divided by $x - <d>$.",
    r"Let $r$ and $s$ be the roots of $<quad> = 0$. Find $r^2 + s^2$.",
    r"Find the sum of the infinite geometric series $<g1> + \frac{<g1>}{<k>} + \frac{<g1>}{<k2>} + \cdots$.",
    r"Solve $|<a>x - <b>| \le <c>$. Write the answer in interval notation.",
    r"What is the minimum value of $<vertex>$ over all real numbers $x$?",
    r"Find all real $x$ with $\log_{<base>} x + \log_{<base>} (x - <d>) = \log_{<base>} <logv>$.",
    r"The first term of an arithmetic sequence is $<a>$ and the $<k1>$th term is $<t>$. What is the $<nn>$th "
    r"term?",
    r"Find all real solutions of $x^4 - <s2>x^2 + <p2> = 0$.",
    # prealgebra
    r"What is $\frac{<a>}{<b>} + \frac{<c>}{<e>}$? Express your answer in simplest form.",
    r"Round $<dec>$ to the nearest hundredth, then multiply the result by $<a>$.",
    r"What is $<p1>\%$ of $<pct2>\%$ of $<N>$?",
    r"The mean of five numbers is $<n>$. Four of the numbers are $<v1>$, $<n>$, $<N3>$ and $<a>$. What is the fifth "
    r"number?",
)


def _comp_values(rng: random.Random) -> dict:
    r = rng.randint
    a, b, c, d, e = (r(2, 9) for _ in range(5))
    r1, r2 = rng.sample([i for i in range(-9, 10) if i], 2)
    k = r(2, 6)
    m1, m2 = rng.choice(((3, 5), (4, 7), (5, 8), (7, 9), (3, 11), (8, 9), (5, 11), (7, 12)))
    l1, l2, l3 = (s * r(1, 3) for s in rng.choice(TRIPLES))
    h_, t_ = r(-5, 5), r(1, 20)
    nn = r(6, 15)
    kk = r(2, 5)
    root1, root2 = rng.sample(range(1, 7), 2)
    rad = r(1, 9)
    per = (rad * r(2, 5))
    return {
        "a": a, "b": b, "c": c, "d": d, "e": e, "k": k, "k1": k + r(1, 3), "k2": k * k, "n": r(11, 99),
        "N": r(100, 999), "N2": r(100, 999), "N3": r(10, 60), "big": r(100, 2024), "p": rng.choice((7, 11, 13, 17)),
        "quad": _poly([1, -(r1 + r2), r1 * r2]), "apow": a ** (r(1, 4) + c), "x1": r(-9, 9), "y1": r(-9, 9),
        "x2": r(-9, 9), "y2": r(-9, 9), "sq": rng.choice(SQUAREFREE) * r(2, 12) ** 2,
        "sq2": rng.choice(SQUAREFREE) * r(2, 9) ** 2, "S": r(10, 60),
        "D": 2 * r(1, 8), "m2": r(2, 12) ** 2, "b2": r(10, 40), "num": r(20, 999), "base": r(2, 9), "q1": r(1, m1 - 1),
        "q2": r(1, m2 - 1), "m1": m1, "mod2": m2, "odd": rng.choice((1, 3, 7, 9)), "nn": nn, "kk": kk, "kk1": kk + 1,
        "people": r(5, 9), "red": r(3, 9), "blue": r(3, 9), "WORD": rng.choice(LETTER_WORDS),
        "sides": rng.choice((5, 6, 8, 9, 10, 12, 15, 18, 20)), "t": r(4, 11), "women": r(3, 7), "men": r(3, 8),
        "flips": r(5, 10), "l1": l1, "l2": l2, "l3": l3, "r2": r(2, 12) ** 2, "A": r(20, 70), "r": r(2, 9),
        "h": r(2, 12), "s4": 4 * rad * rad, "a2": a * a, "per": per, "ang": rng.choice(ANGLES),
        "ang2": rng.choice(ANGLES), "v1": r(-5, 9), "v2": r(-5, 9), "v3": r(-5, 9), "v4": r(-5, 9), "v5": r(-5, 9),
        "v6": r(-5, 9), "cubic": _poly([1, -a, b, -c]), "g1": a * k * k, "vertex": _poly([1, -2 * h_, h_ * h_ + t_]),
        "logv": d * r(1, 4) + r(0, 3), "s2": root1 ** 2 + root2 ** 2, "p2": root1 ** 2 * root2 ** 2,
        "dec": f"{r(1, 99)}.{r(100, 999)}", "p1": rng.choice((10, 20, 25, 40, 50, 75)),
        "pct2": rng.choice((10, 20, 30, 50, 60, 80)),
    }


def _comp_one(rng: random.Random) -> str:
    values = _comp_values(rng)
    template = rng.choice(COMP_TEMPLATES)
    # two templates need values tied to others
    if "similar triangles" in template:
        values["b2"] = (values["a"] + rng.randint(1, 4)) ** 2
    if "arithmetic sequence" in template:
        values["t"] = values["a"] + (values["k1"] - 1) * rng.randint(2, 7)
    text = _fill(template, values)
    return text + _MATH_SUFFIX if rng.random() < 0.8 else text


def competition_math(n: int, rng: random.Random) -> list[str]:
    """Competition-style problems in LaTeX with random numbers; most in the benchmark's boxed-answer format."""
    return _distinct(_comp_one, n, rng)
