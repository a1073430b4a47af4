"""Chat prompts: open_chat (writing, roleplay, reasoning, math, coding, extraction, STEM and humanities
requests, in equal shares) and the first chat family (everyday requests over a few topics)."""

from __future__ import annotations

import random

from specpilot.training.corpus.common import _PRONOUNS, DOMAINS, PEOPLE, WEEKDAYS, _distinct

# --- chat: the first family, everyday requests ------------------------------------------------------------------

TOPICS = ("a rainy morning", "learning to cook", "an old lighthouse", "working from home", "a first job interview",
          "city gardens", "a long train journey", "saving money", "a lost umbrella", "public libraries",
          "moving to a new town", "a chess tournament", "the night sky", "volunteering", "a family recipe",
          "electric bicycles", "a school science fair", "time management", "a mountain hike", "street markets")
CHAT_TEMPLATES = (
    "Write a short story about {topic}.",
    "Write a four-line poem about {topic}.",
    "Give me five practical tips about {topic}.",
    "Write a friendly email to a colleague about {topic}.",
    "What are the pros and cons of {topic}? Answer in a short list.",
    "Write an opening paragraph for a blog post on {topic}.",
    "Pretend you are a tour guide and describe {topic} in a few sentences.",
    "Compare {topic} with {other} in one paragraph.",
)


def chat_prompts(n: int, rng: random.Random) -> list[str]:
    """Distinct (template, topic[, other topic]) combinations, sampled without replacement."""
    combos = sorted({t.format(topic=a, other=b) for t in CHAT_TEMPLATES for a in TOPICS for b in TOPICS if a != b})
    return rng.sample(combos, min(n, len(combos)))


# --- open_chat: the eight chat categories -----------------------------------------------------------------------

WRITING_TOPICS = (
    "a neighborhood bakery closing down", "the first snow of the year", "a robot who wants to paint",
    "a grandmother's garden", "a forgotten key", "a small-town football final", "an unexpected letter",
    "a stray dog that follows someone home", "a power cut during a storm", "a village harvest festival",
    "learning a new language as an adult", "a bicycle trip along the coast", "a rooftop garden", "a broken violin",
    "two rival food trucks", "the last day of summer camp", "a message in a bottle", "a shy student giving a speech",
    "a ferry crossing in fog", "a secondhand bookshop", "a family road trip", "a marathon runner's final mile",
    "an inventor's failed experiment", "a kite festival", "a quiet cafe at dawn", "an island with no internet",
    "a lost glove in winter", "a retired astronaut", "a new puppy", "a school play that goes wrong",
    "an old photo album", "a chef opening a first restaurant", "a neighborhood cleanup", "a late-night bus ride",
    "a treehouse", "a snowed-in weekend", "a talent show", "a garden that grows overnight", "a night market",
    "a letter from a pen pal",
) + TOPICS
FORMS = ("short story", "poem", "blog post", "newsletter article", "speech", "diary entry", "letter", "song chorus",
         "opening paragraph of a novel", "short essay", "fable", "short social media post")
AUDIENCES = ("children", "teenagers", "busy parents", "retired people", "first-year university students",
             "new employees", "tourists", "small business owners", "a book club", "primary school teachers")
TONES = ("cheerful", "formal", "humorous", "nostalgic", "persuasive", "calm", "dramatic", "warm", "mysterious")
PRODUCTS_W = ("a reusable coffee cup", "a solar-powered lantern", "a smart plant pot", "noise-cancelling earmuffs for "
              "kids", "a folding electric scooter", "a board game about bees", "a waterproof notebook",
              "a bamboo toothbrush", "a language-learning app", "a weighted blanket", "a bread-making machine",
              "a bike light that charges while you ride")
EVENTS = ("a retirement party", "a school graduation", "the opening of a community garden", "a charity run",
          "a wedding reception", "a company's tenth anniversary", "a science fair award ceremony",
          "a library's reopening", "a sports club's end-of-season dinner")
RECIPIENTS = ("your landlord", "a hiring manager", "your child's teacher", "a customer who complained",
              "a new neighbour", "the city council", "a conference organiser", "your team", "a supplier")
ASKS = ("fix a leaking heater", "move a meeting to next week", "give feedback on a draft", "extend a deadline by "
        "three days", "join a volunteer event", "approve a budget for new laptops", "share the slides from a talk",
        "explain a charge on an invoice", "confirm a delivery date")
NARRATORS = ("a cat", "a ten-year-old", "an old sailor", "a delivery driver", "a street lamp", "a nervous student",
             "a retired teacher", "a houseplant", "a lighthouse")
BAD_SENTENCES = (
    "me and him goes to the store yesterday and buyed three apple",
    "their going to the park tomorrow, weather its raining or not",
    "the informations in this reports are not correct and needs checking",
    "she dont like when peoples talks loud in library",
    "we was very exciting about the trip but it were cancelled",
    "each of the students have their own books, which they brings everyday",
    "i seen that movie last week, it was more better than the book",
    "the team have won there last five game in a row",
)
PERSONAS = ("a pirate captain", "a medieval blacksmith", "a museum guide in an art gallery",
            "an astronaut on a space station", "a detective in 1920s London", "a chef in a busy restaurant",
            "a park ranger", "a school librarian", "a personal fitness trainer", "a butler in a grand old house",
            "a radio news presenter", "a time-traveling historian", "a lighthouse keeper", "a wizard's apprentice",
            "a zookeeper", "a car mechanic", "a wedding planner", "a football coach at half-time",
            "a ship's navigator in the 1700s", "a robot learning human customs", "a flight attendant",
            "a street musician", "a farmer at a county fair", "a startup founder pitching to investors",
            "a mountain guide", "a kindergarten teacher", "a beekeeper", "an ice-cream truck driver")
RP_QUESTIONS = ("what the hardest part of your job is", "what a normal morning looks like for you",
                "what advice you would give a beginner", "about the strangest thing that ever happened at work",
                "which tools you could not live without", "how your work has changed over the years")
PROBLEMS = ("staying motivated to exercise", "a noisy neighbour", "choosing between two job offers",
            "saving for a first home", "learning to cook on a budget", "preparing for a job interview",
            "keeping houseplants alive", "organizing a cluttered garage", "planning a surprise party",
            "getting better sleep", "making friends in a new city", "studying for a big exam")
JOB_TITLES = ("junior web developer", "barista", "museum curator", "park ranger", "sales assistant",
              "graphic designer", "warehouse manager", "data analyst", "hotel receptionist")
CITIES = ("Lisbon", "Kyoto", "Edinburgh", "Marrakech", "Vancouver", "Prague", "Buenos Aires", "Istanbul",
          "Melbourne", "Copenhagen", "Hanoi", "Oaxaca", "Seville", "Krakow")
HOLIDAYS = ("the Scottish Highlands", "Costa Rica", "the Greek islands", "northern Norway", "Vietnam",
            "the Portuguese coast", "the Canadian Rockies", "Morocco", "New Zealand's South Island", "Sri Lanka")
FANTASY_PLACES = ("a sunken city", "a forest where the trees whisper", "a desert market at night",
                  "a castle built on a glacier", "an abandoned mine", "a floating island", "a library with no exits")
DEBATE_LINES = ("Homework should be banned because children need to play.",
                "Cities should make all public transport free.", "Everyone should learn to code at school.",
                "Zoos do more harm than good.", "A four-day work week makes people more productive.",
                "Social media has made friendships stronger.")
CODE_TASKS_CHAT = (
    "checks whether a string is a valid IPv4 address", "merges overlapping time intervals",
    "counts how often each word appears in a text", "removes duplicate lines from a file while keeping their order",
    "finds two numbers in a list that add up to a target", "parses a CSV file and prints the average of one column",
    "flattens a nested dictionary into dotted keys", "checks a password against four strength rules",
    "rotates a square matrix by 90 degrees", "groups a list of words into anagram families",
    "returns the k most common elements of a list", "checks whether a filled Sudoku grid is valid",
    "computes the edit distance between two words", "groups a list of dates by month",
    "generates all subsets of a small set", "formats a number of seconds as hours, minutes and seconds",
    "finds the first character that does not repeat in a string", "reverses a singly linked list",
    "evaluates an arithmetic expression with +, -, * and parentheses", "splits a restaurant bill among friends "
    "with a tip", "checks whether the brackets in a string are balanced", "merges two dictionaries of lists",
    "simulates rolling two dice ten thousand times and prints the frequencies", "paginates a list of items",
    "converts a list of records into a formatted text table", "validates a credit card number with the Luhn check",
    "finds the shortest path in a grid maze", "compresses a string with run-length encoding",
    "parses a URL into its scheme, host, path and query", "schedules meetings so that no two overlap",
    "removes comments from a piece of source code", "converts a number into words in English",
    "finds all prime numbers below a limit with a sieve", "computes a running median of a stream of numbers",
    "checks whether two strings are one edit apart", "implements a rate limiter that allows n calls per second",
    "reads a log file and counts requests per hour", "shuffles a deck of cards fairly",
    "validates that a string is a well-formed date", "finds the longest palindromic substring",
)
LANGS = ("Python", "JavaScript", "Java", "C", "Go", "Rust", "TypeScript", "Ruby", "C#", "Kotlin")
SNIPPETS = (
    "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)",
    "def count_words(text):\n    counts = {}\n    for word in text.lower().split():\n"
    "        counts[word] = counts.get(word, 0) + 1\n    return counts",
    "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
    "def chunks(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]",
    "def find_max(numbers):\n    best = numbers[0]\n    for n in numbers[1:]:\n        if n > best:\n"
    "            best = n\n    return best",
    "def dedupe(items):\n    seen = set()\n    out = []\n    for x in items:\n        if x not in seen:\n"
    "            seen.add(x)\n            out.append(x)\n    return out",
    "def read_numbers(path):\n    with open(path) as f:\n        return [int(line) for line in f if line.strip()]",
    "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))",
)
BUGGY = (
    "def average(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values) - 1",
    "def count_vowels(text):\n    count = 0\n    for ch in text:\n        if ch in 'aeiou':\n            count =+ 1\n"
    "    return count",
    "def last_item(items):\n    return items[len(items)]",
    "def factorial(n):\n    result = 0\n    for i in range(1, n + 1):\n        result *= i\n    return result",
    "def contains(items, target):\n    for x in items:\n        if x == target:\n            return True\n"
    "        else:\n            return False",
    "def add_item(item, bucket=[]):\n    bucket.append(item)\n    return bucket",
    "def reverse(s):\n    out = ''\n    for i in range(len(s)):\n        out += s[len(s) - i]\n    return out",
    "def total_price(prices, tax):\n    return sum(prices) * tax / 100",
)
ALGOS = ("binary search", "bubble sort", "merge sort", "breadth-first search on a graph", "building a heap from "
         "a list", "checking membership in a Python set", "inserting at the front of a Python list",
         "quicksort with a random pivot", "Dijkstra's algorithm with a binary heap", "comparing every pair in a list")
DATA_STRUCTURES = ("stack", "queue", "min-heap", "hash map with chaining", "binary search tree", "LRU cache",
                   "circular buffer", "trie", "priority queue", "doubly linked list")
SQL_TASKS = ("the ten customers who spent the most in 2023", "the number of orders per month",
             "every product that has never been ordered", "the average salary per department",
             "the employees who earn more than their manager", "the second highest price",
             "customers who placed orders in two consecutive months")
REGEX_TARGETS = ("UK postcodes", "dates written as DD/MM/YYYY", "hexadecimal colour codes", "e-mail addresses",
                 "times in 24-hour format", "phone numbers like 555-123-4567", "prices such as $4.99")
COMPARISONS = (("a list", "a tuple", "Python"), ("let", "const", "JavaScript"), ("an interface",
               "an abstract class", "Java"), ("a struct", "a class", "C#"), ("a slice", "an array", "Go"),
               ("String", "&str", "Rust"), ("a list", "a generator", "Python"), ("a deep copy", "a shallow copy",
               "Python"), ("== ", "===", "JavaScript"), ("a process", "a thread", "Python"))
SCRIPT_TASKS = ("renames every .jpeg file in a folder to .jpg", "prints the ten largest files under a directory",
                "counts lines of code per file extension in a project", "converts a JSON file of records into CSV",
                "watches a log file and prints the lines that contain ERROR",
                "backs up a folder into a dated zip archive", "finds duplicate files by their checksum")
STEM_TOPICS = (
    "plate tectonics", "the water cycle", "how vaccines train the immune system", "black holes",
    "the greenhouse effect", "how batteries store energy", "DNA replication", "natural selection",
    "the speed of sound", "how rainbows form", "Newton's third law", "friction", "buoyancy", "ocean tides",
    "volcanic eruptions", "how a refrigerator works", "series and parallel circuits", "magnetism",
    "the periodic table", "acids and bases", "radioactive half-life", "the life cycle of a star",
    "how the heart pumps blood", "enzymes", "cell division", "antibiotic resistance", "how GPS finds a position",
    "how wind turbines make electricity", "the Doppler effect", "static electricity", "how airplane wings lift",
    "erosion", "the nitrogen cycle", "how the eye sees color", "sound waves", "entropy",
    "how computers store numbers in binary", "public-key encryption", "the carbon cycle", "earthquakes",
    "how solar panels work", "lightning", "hurricanes", "the phases of the moon", "how bridges carry loads",
    "the human microbiome", "how noise-cancelling headphones work", "viscosity", "nuclear fusion in the sun",
    "how a compass works",
)
DESIGNS = ("a footbridge for a small park", "a rainwater collection system for a school",
           "a food cooler that works without electricity", "a wheelchair ramp for an old building",
           "a bicycle shelter that resists strong wind", "a greenhouse for a cold climate",
           "a water filter for a camping trip", "a small wind turbine for a farm", "a quiet classroom near a highway")
HUMANITIES_TOPICS = (
    "the invention of the printing press", "the fall of the Western Roman Empire", "the Silk Road", "the Renaissance",
    "the Industrial Revolution", "the French Revolution", "Stoic philosophy", "utilitarianism",
    "the idea of a social contract", "the role of myths in ancient cultures", "Shakespeare's tragedies",
    "the rise of the novel", "impressionist painting", "the Harlem Renaissance", "the history of jazz",
    "the Cold War", "the Magna Carta", "the abolition of slavery", "women's suffrage", "the history of money",
    "urbanization", "the ethics of free speech", "nationalism in the nineteenth century", "the Meiji Restoration",
    "the Mughal Empire", "the Aztec city of Tenochtitlan", "the Black Death", "the Enlightenment", "existentialism",
    "the history of the Olympic Games", "propaganda in the twentieth century", "the influence of television on "
    "politics", "minimalism in architecture", "folk tales and their morals", "the first dictionaries",
    "the role of museums", "supply and demand", "the tragedy of the commons", "globalization and local cultures",
    "the history of public schools", "the Great Depression", "the Byzantine Empire", "the Hanseatic League",
    "the Reformation", "the space race",
)
DEBATES = ("Museums should return objects taken during colonial times.", "History is written by the winners.",
           "Art should never be censored.", "Economic growth is the best measure of progress.",
           "Voting should be compulsory.", "A translation can never capture the original.",
           "Cities matter more than nations in the modern world.",
           "Classic novels should still be required reading in schools.")

WRITING = (
    "Write a {form} about {topic} for {audience}.",
    "Write a short story about {topic}, told from the point of view of {narrator}.",
    "Write a {tone} poem of {lines} lines about {topic}.",
    "Draft a polite email to {recipient} asking them to {ask}.",
    "Write a product description of about {words} words for {product}.",
    "Write a short speech for {event}. Keep it {tone} and under {words} words.",
    'Fix the grammar and spelling in this sentence and explain each correction: "{bad}"',
    "Write a {tone} introduction for a blog post about {topic}, with a catchy title.",
    "Write the opening scene of a play about {topic}, with two characters and stage directions.",
    "Write a letter to your future self about {topic}.",
    "Write a slogan and a 30-second radio advertisement for {product}.",
    "Write a diary entry by {narrator} about {topic}.",
    "Give me three different first sentences for a story about {topic}, each in a different style.",
)
ROLEPLAY = (
    "You are {persona}. A visitor asks you {rpq}. Answer in character.",
    "Pretend to be {persona} and explain {stem} to {audience}.",
    "Act as {persona}. I need advice on {problem}. What do you suggest?",
    "Stay in character as {persona} and describe your typical day in a few paragraphs.",
    "You are interviewing candidates for a {job} position. Ask me your first question, wait for my answer, "
    "and then continue.",
    "Role-play a customer service agent talking to a customer whose {product_short} arrived broken. Write the "
    "agent's first reply.",
    "Play the role of a tour guide in {city}. Describe a one-day walking route and what we will see.",
    "You are a travel agent. A family of {k} wants a {days}-day holiday in {holiday} with a budget of ${budget}. "
    "Suggest a plan.",
    "Be the narrator of a fantasy adventure. Describe the opening scene in {fplace} and ask me what I do next.",
    "Imagine you are {persona} writing a short letter home after your first week on the job.",
    'Take the role of a debate coach. Give me feedback on this opening line: "{debate_line}"',
    "You are {persona}, and I am a journalist. Tell me why you chose this life.",
    "Act as a friendly museum robot that speaks in short sentences. Greet a group of {audience} and introduce an "
    "exhibit about {stem}.",
)
MATH_CHAT = (
    "What is the probability of getting at least one six when rolling a fair die {k} times? Explain.",
    "A rectangle has a perimeter of {per} cm and a length of {len} cm. What is its area?",
    "Solve the system of equations x + y = {s} and x - y = {d}. Show the steps.",
    "Is {num} a prime number? Explain how you would check.",
    "If I invest ${money} at {rate}% interest compounded yearly, how much will I have after {years} years?",
    "What is the sum of the interior angles of a polygon with {sides} sides, and why?",
    "Convert {num} from base 10 to base {base} and explain the method.",
    "Find the derivative of f(x) = {a}x^3 - {b}x^2 + {c}x and evaluate it at x = {d}.",
    "A jacket is discounted by {p}% and then by another {q}%. What is the total discount as one percentage?",
    "How many different {k}-letter codes can be made from the letters A to {letter} if no letter repeats?",
    "Explain how to find the median of the numbers {numbers}, and compute it.",
    "The ratio of cats to dogs at a shelter is {a}:{b}. If there are {ratio_total} animals, how many are cats?",
    "What is the least common multiple of {a} and {num2}, and how does it help when adding fractions?",
    "A cone has a radius of {r} cm and a height of {h} cm. What is its volume?",
)
CODING = (
    "Write a {lang} function that {code_task}.",
    "Explain what this Python code does, line by line:\n\n```python\n{snippet}\n```",
    "This function has a bug. Find it, explain it and fix it:\n\n```python\n{buggy}\n```",
    "What is the time and space complexity of {algo}? Explain briefly.",
    "Implement a {ds} in {lang} with its main operations and a short usage example.",
    "Write a SQL query that returns {sql} from a table named `{table}`. Describe the columns you assume.",
    "Write a regular expression that matches {regex}, and give three strings that match and two that do not.",
    "How would you make this function faster or cleaner?\n\n```python\n{snippet}\n```",
    "Write pytest unit tests for a function that {code_task}.",
    "What is the difference between {c1} and {c2} in {c_lang}? Give a short example.",
    "Write a {lang} program that reads numbers from standard input, one per line, and prints their {stat}.",
    "Translate this Python function to {lang2}:\n\n```python\n{snippet}\n```",
    "Write a command-line script in Python that {script}.",
)
STEM = (
    "Explain {stem} to a high school student.",
    "What is {stem}, and why does it matter in everyday life?",
    "Give three real-world examples of {stem}.",
    "What are common misconceptions about {stem}?",
    "Explain {stem} with an everyday analogy.",
    "How could a teacher demonstrate {stem} with a simple classroom experiment?",
    "Summarize {stem} in five bullet points.",
    "Compare {stem} and {stem2}. What, if anything, do they have in common?",
    "Write three quiz questions about {stem}, with answers.",
    "What questions about {stem} are scientists still trying to answer?",
    "Which quantities or equations describe {stem}? Explain what each symbol means.",
    "An engineer is designing {design}. What factors should they consider, and what are the trade-offs?",
    "How did scientists first discover or measure {stem}?",
)
HUMANITIES = (
    "Write a short essay on {hum}.",
    "What were the main causes and consequences of {hum}?",
    "Explain the main ideas behind {hum} in simple terms.",
    "Give arguments for and against this statement: {debate}",
    "How does {hum} still influence the world today?",
    "Compare {hum} with {hum2}.",
    "Recommend four books or films that help someone understand {hum}, with one sentence on each.",
    "What can ordinary people today learn from {hum}?",
    "Outline three lessons that teach {hum} to {audience}.",
    "Write five discussion questions about {hum} for a study group.",
    "Write a short dialogue in which a historian explains {hum} to a curious student.",
    "What are the most common myths or misunderstandings about {hum}?",
    "In about 200 words, explain why {hum} matters to {audience}.",
)


def _chat_values(rng: random.Random) -> dict:
    r = rng.randint
    stem, stem2 = rng.sample(STEM_TOPICS, 2)
    hum, hum2 = rng.sample(HUMANITIES_TOPICS, 2)
    c1, c2, c_lang = rng.choice(COMPARISONS)
    lang, lang2 = rng.sample(LANGS, 2)
    a, b = r(2, 9), r(2, 9)
    length = r(3, 20)
    return {
        "form": rng.choice(FORMS), "topic": rng.choice(WRITING_TOPICS), "audience": rng.choice(AUDIENCES),
        "narrator": rng.choice(NARRATORS), "tone": rng.choice(TONES), "lines": rng.choice((4, 6, 8, 12, 14)),
        "recipient": rng.choice(RECIPIENTS), "ask": rng.choice(ASKS), "words": rng.choice((50, 80, 100, 150, 200)),
        "product": rng.choice(PRODUCTS_W), "event": rng.choice(EVENTS), "bad": rng.choice(BAD_SENTENCES),
        "persona": rng.choice(PERSONAS), "rpq": rng.choice(RP_QUESTIONS), "stem": stem, "stem2": stem2,
        "problem": rng.choice(PROBLEMS), "job": rng.choice(JOB_TITLES), "city": rng.choice(CITIES),
        "product_short": rng.choice(("blender", "lamp", "phone case", "bookshelf", "kettle", "tent")),
        "k": r(3, 6), "days": r(4, 14), "holiday": rng.choice(HOLIDAYS), "budget": r(20, 90) * 100,
        "fplace": rng.choice(FANTASY_PLACES), "debate_line": rng.choice(DEBATE_LINES),
        "per": 2 * (length + r(2, 15)), "len": length, "s": r(10, 40), "d": 2 * r(1, 5),
        "num": r(50, 999), "num2": r(10, 40), "money": r(10, 100) * 100, "rate": rng.choice((2, 3, 4, 5, 6)),
        "years": r(2, 10), "sides": r(5, 12), "base": rng.choice((2, 3, 5, 8, 16)), "a": a, "b": b, "c": r(1, 9),
        "p": rng.choice((10, 20, 25, 30)), "q": rng.choice((10, 15, 20, 50)), "letter": rng.choice("FGHJKM"),
        "numbers": ", ".join(str(r(1, 60)) for _ in range(r(5, 8))), "ratio_total": (a + b) * r(3, 12),
        "r": r(2, 9), "h": r(3, 15), "lang": lang, "lang2": lang2, "code_task": rng.choice(CODE_TASKS_CHAT),
        "snippet": rng.choice(SNIPPETS), "buggy": rng.choice(BUGGY), "algo": rng.choice(ALGOS),
        "ds": rng.choice(DATA_STRUCTURES), "sql": rng.choice(SQL_TASKS),
        "table": rng.choice(("orders", "customers", "employees", "products", "sales")),
        "regex": rng.choice(REGEX_TARGETS), "c1": c1, "c2": c2, "c_lang": c_lang,
        "stat": rng.choice(("sum and average", "median", "largest and smallest values", "standard deviation")),
        "script": rng.choice(SCRIPT_TASKS), "design": rng.choice(DESIGNS), "hum": hum, "hum2": hum2,
        "debate": rng.choice(DEBATES),
    }


# reasoning: small puzzles whose facts must agree, so each is a function
def _r_heights(rng):
    a, b, c, d = (p[0] for p in rng.sample(PEOPLE, 4))
    return (f"{a} is taller than {b}. {c} is shorter than {b} but taller than {d}. Who is the tallest and who is the "
            f"shortest of the four? Explain your reasoning.")


def _r_family(rng):
    (a, ga), (b, gb), (c, _) = rng.sample(PEOPLE, 3)
    parent = "mother" if ga == "f" else "father"
    sibling = "sister" if gb == "f" else "brother"
    return f"{a} is the {parent} of {b}, and {b} is the {sibling} of {c}. How is {a} related to {c}? Explain."


def _r_syllogism(rng):
    x, y, z = rng.sample(("artists", "runners", "teachers", "chess players", "musicians", "gardeners", "bakers",
                          "early risers"), 3)
    q = rng.choice(("some", "all", "no"))
    return f"All {x} are {y}, and {q} {y} are {z}. Can we conclude that some {x} are {z}? Explain why or why not."


def _r_sequence(rng):
    start, step = rng.randint(1, 9), rng.randint(2, 6)
    kind = rng.randrange(3)
    seq = ([start + step * i for i in range(5)] if kind == 0 else [start * step ** i for i in range(5)] if kind == 1
           else [start + i * i for i in range(5)])
    return f"What number comes next in the sequence {', '.join(map(str, seq))}, ...? Explain the pattern."


def _r_days(rng):
    return (f"If today is {rng.choice(WEEKDAYS)}, what day of the week will it be in {rng.randint(10, 400)} days? "
            f"Explain how you worked it out.")


def _r_odd_one(rng):
    groups = (("apple", "pear", "plum", "cherry"), ("violin", "cello", "harp", "guitar"),
              ("Mars", "Venus", "Jupiter", "Saturn"), ("oak", "maple", "birch", "pine"),
              ("square", "triangle", "hexagon", "pentagon"), ("copper", "iron", "silver", "zinc"))
    base, other = rng.sample(groups, 2)
    items = [*rng.sample(base, 3), rng.choice(other)]
    rng.shuffle(items)
    return f"Which item is the odd one out in this list: {', '.join(items)}? Explain your choice."


def _r_knights(rng):
    a, b = (p[0] for p in rng.sample(PEOPLE, 2))
    claim = rng.choice((f"{b} is a knave.", "We are both knaves.", f"{b} and I are the same kind.",
                        "At least one of us is a knave."))
    return (f"On an island, knights always tell the truth and knaves always lie. {a} says: \"{claim}\" {b} says "
            f"nothing. What can you tell about {a} and {b}?")


def _r_handshakes(rng):
    n = rng.randint(5, 30)
    return f"At a party, each of {n} guests shakes hands with every other guest exactly once. How many handshakes " \
           f"are there? Explain."


def _r_machines(rng):
    m, w, t = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 12)
    return (f"If {m} machines make {w} toys in {t} minutes, how long would {2 * m} machines take to make {4 * w} "
            f"toys? Explain.")


def _r_walk(rng):
    name = rng.choice(PEOPLE)[0]
    n1, e1, s1 = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 9)
    return (f"{name} walks {n1} km north, then {e1} km east, then {s1} km south. How far is {name} from the "
            f"starting point, and in which general direction?")


def _r_seating(rng):
    a, b, c, d = (p[0] for p in rng.sample(PEOPLE, 4))
    return (f"Four friends sit in a row of four chairs. {a} sits at one end. {b} sits next to {a}. {c} does not sit "
            f"next to {b}. Where does {d} sit? List every possible arrangement.")


def _r_clock(rng):
    h, m = rng.randint(1, 12), rng.choice((0, 10, 15, 20, 30, 40, 45, 50))
    return f"What is the smaller angle between the hour hand and the minute hand of a clock at {h}:{m:02d}? Explain."


def _r_cost(rng):
    total, diff = rng.randint(11, 30), rng.randint(2, 9)
    item = rng.choice((("notebook", "pen"), ("sandwich", "drink"), ("hat", "scarf")))
    return (f"A {item[0]} and a {item[1]} cost ${total} together. The {item[0]} costs ${diff} more than the "
            f"{item[1]}. How much does the {item[1]} cost? Check your answer.")


def _r_ages(rng):
    a, b = (p[0] for p in rng.sample(PEOPLE, 2))
    x, k = rng.randint(3, 12), rng.randint(2, 4)
    return (f"{a} is {k} times as old as {b}. In {x} years, {a} will be twice as old as {b}. How old are they now? "
            f"Show your reasoning.")


def _r_coins(rng):
    n = rng.choice((8, 9, 12, 27))
    return (f"You have {n} coins that look identical, but one is lighter than the others. Using a balance scale, "
            f"what is the smallest number of weighings that always finds the light coin? Explain the strategy.")


REASONING = (_r_heights, _r_family, _r_syllogism, _r_sequence, _r_days, _r_odd_one, _r_knights, _r_handshakes,
             _r_machines, _r_walk, _r_seating, _r_clock, _r_cost, _r_ages, _r_coins)


# extraction: a generated passage plus an instruction about it
BRANDS = ("Nimbus", "Orca", "Pinecrest", "Lumo", "Kestrel", "Vanta", "Brisa", "Tundra", "Halcyon", "Quill")
GOODS = ("headphones", "blender", "backpack", "desk chair", "e-reader", "kettle", "rain jacket", "fitness watch")
OPINIONS = ("works perfectly and the battery lasts for days", "broke after two weeks and support never replied",
            "looks great but is heavier than I expected", "is good value, although the instructions are confusing",
            "is the best purchase I made this year", "arrived late and one part was missing",
            "does the job, nothing more", "is comfortable, but the color faded quickly")
COMPANIES = ("Brightwave Foods", "Northpeak Tools", "Silverline Travel", "Greenleaf Energy", "Bluestone Media",
             "Harbor Lane Books", "Quickstep Shoes", "Redmaple Software", "Sunfield Dairy", "Ironbridge Logistics")
TOWNS = ("Millbrook", "Eastvale", "Port Alder", "Cedar Falls", "Westhaven", "Lakeside", "Stonebridge", "Riverton")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def _p_reviews(rng):
    items = rng.sample([(b, g) for b in BRANDS for g in GOODS], 3)
    return "\n".join(f"Review {i + 1}: The {b} {g} ({rng.randint(1, 5)}/5) {rng.choice(OPINIONS)}."
                     for i, (b, g) in enumerate(items))


def _p_sales(rng):
    year = rng.randint(2015, 2024)
    lines = []
    for company in rng.sample(COMPANIES, rng.randint(3, 4)):
        revenue = rng.randint(20, 900)
        lines.append(f"{company}, led by {rng.choice(PEOPLE)[0]} {rng.choice(('Lee', 'Okafor', 'Novak', 'Silva'))}, "
                     f"reported revenue of ${revenue} million and a profit of ${rng.randint(1, revenue // 4 + 1)} "
                     f"million in {year}.")
    return " ".join(lines)


def _p_news(rng):
    (a, _), (b, _) = rng.sample(PEOPLE, 2)
    town = rng.choice(TOWNS)
    facility = rng.choice(("library", "swimming pool", "footbridge", "community kitchen", "skate park", "museum"))
    return (f"On {rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(2010, 2025)}, the town of {town} opened its "
            f"new {facility}. Mayor {a} said the project cost ${rng.randint(2, 40)} million and took "
            f"{rng.randint(8, 30)} months to build. About {rng.randint(2, 90) * 100} residents came to the opening, "
            f"including {b}, who had campaigned for it since {rng.randint(1995, 2009)}. The {facility} will be open "
            f"{rng.randint(5, 7)} days a week.")


def _p_email(rng):
    (a, _), (b, _), (c, _) = rng.sample(PEOPLE, 3)
    day, day2 = rng.sample(WEEKDAYS[:5], 2)
    return (f"Hi team,\n\nThe {rng.choice(('planning', 'budget', 'design', 'quarterly'))} meeting has moved to {day} "
            f"at {rng.randint(9, 16)}:{rng.choice(('00', '30'))} in room {rng.randint(100, 450)}. {a} will present "
            f"the survey results, and {b} will bring {rng.randint(5, 20)} printed copies of the plan. Please send "
            f"your updates to {c.lower()}@{rng.choice(DOMAINS)} by {day2}.\n\nThanks,\n{c}")


def _p_weather(rng):
    return "\n".join(f"{city}: high {(hi := rng.randint(5, 35))} C, low {hi - rng.randint(3, 15)} C, rain "
                     f"{rng.randint(0, 40)} mm" for city in rng.sample(CITIES, rng.randint(4, 5)))


def _p_bio(rng):
    name, g = rng.choice(PEOPLE)
    he, _, his, He, _ = _PRONOUNS[g]
    born = rng.randint(1940, 1990)
    return (f"{name} {rng.choice(('Moreau', 'Tanaka', 'Adeyemi', 'Kowalski', 'Haddad'))} was born in "
            f"{rng.choice(TOWNS)} in {born}. {He} studied {rng.choice(('chemistry', 'architecture', 'economics'))} "
            f"and in {born + rng.randint(22, 30)} founded {rng.choice(COMPANIES)}, which now employs "
            f"{rng.randint(40, 900)} people in {rng.randint(2, 12)} countries. In {born + rng.randint(31, 40)} {he} "
            f"won a national award for {his} work on {rng.choice(('recycling', 'rural transport', 'school meals'))}.")


def _p_recipe(rng):
    dish = rng.choice(("pancakes", "a vegetable pie", "banana bread", "a lentil soup", "oat cookies"))
    return (f"To make {dish} for {rng.randint(2, 6)} people, mix {rng.randint(1, 5) * 50} grams of flour with "
            f"{rng.randint(1, 6) * 50} ml of milk and {rng.randint(1, 4)} eggs. Add a pinch of salt and "
            f"{rng.randint(1, 8) * 25} grams of {rng.choice(('butter', 'sugar', 'cheese', 'chopped nuts'))}. Cook "
            f"at {rng.choice((160, 180, 200))} C for {rng.randint(2, 9) * 5} minutes.")


def _p_timetable(rng):
    towns = rng.sample(TOWNS, 3)
    rows = []
    for _ in range(4):
        dep = rng.randint(6, 20)
        rows.append(f"{towns[0]} {dep:02d}:{rng.choice(('05', '20', '40'))} -> {rng.choice(towns[1:])} "
                    f"{dep + rng.randint(1, 3):02d}:{rng.choice(('10', '35', '50'))}, {rng.randint(1, 2)} changes")
    return "\n".join(rows)


EXTRACTION = (
    (_p_reviews, "Read these product reviews and return a JSON list with the product, its star rating and whether "
                 "the review is positive, negative or mixed."),
    (_p_reviews, "Which product in the reviews below has the lowest rating, and what is the main complaint?"),
    (_p_sales, "From the text below, extract each company's name, revenue and profit, and say which company had "
               "the highest profit margin."),
    (_p_sales, "Put the figures from this report into a Markdown table with the columns Company, Revenue and "
               "Profit."),
    (_p_news, "List every person, place, date and amount of money mentioned in this news item."),
    (_p_news, "Summarize this article in one sentence, then give three keywords."),
    (_p_email, "Extract the meeting day, time and room, and every action item with the person responsible, from "
               "this email."),
    (_p_weather, "Using the data below, which city had the largest difference between its high and low "
                 "temperature? Show the differences."),
    (_p_weather, "Convert the temperatures below to Fahrenheit and return the result as CSV."),
    (_p_bio, "Make a timeline (year: event) from this short biography."),
    (_p_bio, "Answer using only the text: where was this person born, what did they study, and how many people "
             "does their company employ?"),
    (_p_recipe, "List the ingredients and their quantities from this recipe as bullet points, then scale them for "
                "ten people."),
    (_p_timetable, "Based on this timetable, which connection arrives earliest, and which has the fewest "
                   "changes?"),
    (_p_news, "Find every number in the text and say what it refers to."),
)


def _extraction_one(rng: random.Random) -> str:
    passage, instruction = rng.choice(EXTRACTION)
    text = passage(rng)
    return f"{text}\n\n{instruction}" if rng.random() < 0.25 else f"{instruction}\n\n{text}"


CHAT_CATEGORIES: dict[str, tuple] = {
    "writing": WRITING, "roleplay": ROLEPLAY, "reasoning": REASONING, "math": MATH_CHAT, "coding": CODING,
    "extraction": EXTRACTION, "stem": STEM, "humanities": HUMANITIES,
}
CHAT_TOPICS = WRITING_TOPICS + STEM_TOPICS + HUMANITIES_TOPICS + PERSONAS + tuple(CODE_TASKS_CHAT)


# Extra requirements people add to a request: variety for the categories with few topics (half stay plain).
CHAT_EXTRAS = {
    "writing": ("",) * 6 + (" Keep it under 200 words.", " Give it a title.", " Use simple words.",
                            " Avoid cliches.", " Make the ending surprising.", " Use British spelling."),
    "roleplay": ("",) * 6 + (" Keep your reply short.", " Stay in character the whole time.",
                             " Use a few words typical of the role.", " Be funny but helpful."),
    "math": ("",) * 6 + (" Show each step.", " Explain it simply.", " Check the answer at the end."),
    "coding": ("",) * 8 + (" Include type hints.", " Add comments.", " Keep it under 20 lines.",
                           " Explain the time complexity.", " Do not use external libraries.",
                           " Handle invalid input.", " Add a docstring.", " Include a short example of its use."),
    "stem": ("",) * 8 + (" Keep it under 150 words.", " Use simple language.", " Include one example.",
                         " Answer in three short paragraphs.", " End with a one-sentence summary.",
                         " Use an analogy a child would understand.", " Mention one common mistake.",
                         " Include a simple diagram description."),
    "humanities": ("",) * 8 + (" Keep it under 250 words.", " Give specific examples.", " Write for a general "
                               "reader.", " Mention at least two points of view.", " Include a short conclusion.",
                               " Use headings.", " Name a few key dates.", " Avoid jargon."),
}


def _chat_one(rng: random.Random) -> str:
    category = rng.choice(tuple(CHAT_CATEGORIES))
    if category == "reasoning":
        return rng.choice(REASONING)(rng)
    if category == "extraction":
        return _extraction_one(rng)
    text = rng.choice(CHAT_CATEGORIES[category]).format(**_chat_values(rng))
    return text + rng.choice(CHAT_EXTRAS[category])


def open_chat(n: int, rng: random.Random) -> list[str]:
    """Chat requests spread evenly over the eight categories of an open-ended chat benchmark."""
    return _distinct(_chat_one, n, rng)
