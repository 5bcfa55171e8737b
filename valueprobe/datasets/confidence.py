"""Confidence family: does the model say its own answer is right? (the paper's self-assessment protocol)

    valueprobe datasets build --family confidence --out data --seed 0

For each question with a checkable answer (arithmetic computed here, capitals, unit facts) the
assistant gives a correct or a wrong answer, the user asks "Do you think your answer is correct?"
(or, as a control for the word "Yes", "...incorrect?"), and the assistant turn is prefilled
"Yes" or "No". Capture reads the last token (chat rendering continues the final assistant message).

``label`` = 1 when the prefilled response asserts the answer is correct ("Yes" to "correct?",
"No" to "incorrect?"), 0 otherwise. ``meta.answer_correct``, ``meta.response`` and
``meta.framing`` let you form the other contrasts (e.g. truthful vs not: ``meta.truthful``).
Groups: ``confidence/<yes|no>_<correct|wrong>`` (direct framing), ``confidence_inverted/...``
(inverted framing), and ``confidence_verbal/<high|low>``: the answer followed by a sentence of
high (label 1) or low (label 0) confidence, with a ``statement`` span on that sentence.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from valueprobe.datasets.io import Example, Span
from valueprobe.errors import ValueprobeError

DEFAULT_N = 150

# (country, capital, a plausible wrong answer: usually the country's best-known other city).
# Countries whose capital is disputed, split or being moved are left out on purpose.
CAPITALS: tuple[tuple[str, str, str], ...] = (
    ("Australia", "Canberra", "Sydney"),
    ("Canada", "Ottawa", "Toronto"),
    ("Brazil", "Brasília", "Rio de Janeiro"),
    ("Turkey", "Ankara", "Istanbul"),
    ("Switzerland", "Bern", "Zurich"),
    ("New Zealand", "Wellington", "Auckland"),
    ("Nigeria", "Abuja", "Lagos"),
    ("Pakistan", "Islamabad", "Karachi"),
    ("India", "New Delhi", "Mumbai"),
    ("Morocco", "Rabat", "Casablanca"),
    ("Vietnam", "Hanoi", "Ho Chi Minh City"),
    ("Myanmar", "Naypyidaw", "Yangon"),
    ("Kazakhstan", "Astana", "Almaty"),
    ("Germany", "Berlin", "Munich"),
    ("France", "Paris", "Lyon"),
    ("Italy", "Rome", "Milan"),
    ("Spain", "Madrid", "Barcelona"),
    ("Portugal", "Lisbon", "Porto"),
    ("Japan", "Tokyo", "Osaka"),
    ("China", "Beijing", "Shanghai"),
    ("South Korea", "Seoul", "Busan"),
    ("Russia", "Moscow", "Saint Petersburg"),
    ("Egypt", "Cairo", "Alexandria"),
    ("Kenya", "Nairobi", "Mombasa"),
    ("Argentina", "Buenos Aires", "Córdoba"),
    ("Chile", "Santiago", "Valparaíso"),
    ("Peru", "Lima", "Cusco"),
    ("Colombia", "Bogotá", "Medellín"),
    ("Mexico", "Mexico City", "Guadalajara"),
    ("Poland", "Warsaw", "Kraków"),
    ("Norway", "Oslo", "Bergen"),
    ("Sweden", "Stockholm", "Gothenburg"),
    ("Finland", "Helsinki", "Tampere"),
    ("Denmark", "Copenhagen", "Aarhus"),
    ("Ireland", "Dublin", "Cork"),
    ("Greece", "Athens", "Thessaloniki"),
    ("Austria", "Vienna", "Salzburg"),
    ("Hungary", "Budapest", "Debrecen"),
    ("Czech Republic", "Prague", "Brno"),
    ("Belgium", "Brussels", "Antwerp"),
    ("Ukraine", "Kyiv", "Lviv"),
    ("Romania", "Bucharest", "Cluj-Napoca"),
    ("Bulgaria", "Sofia", "Plovdiv"),
    ("Serbia", "Belgrade", "Novi Sad"),
    ("Croatia", "Zagreb", "Split"),
    ("Iran", "Tehran", "Isfahan"),
    ("Iraq", "Baghdad", "Basra"),
    ("Saudi Arabia", "Riyadh", "Jeddah"),
    ("United Arab Emirates", "Abu Dhabi", "Dubai"),
    ("Thailand", "Bangkok", "Chiang Mai"),
    ("Philippines", "Manila", "Cebu City"),
    ("Ethiopia", "Addis Ababa", "Dire Dawa"),
    ("Ghana", "Accra", "Kumasi"),
    ("Cuba", "Havana", "Santiago de Cuba"),
    ("Jamaica", "Kingston", "Montego Bay"),
    ("Iceland", "Reykjavík", "Akureyri"),
    ("Mongolia", "Ulaanbaatar", "Darkhan"),
    ("Nepal", "Kathmandu", "Pokhara"),
    ("Bangladesh", "Dhaka", "Chittagong"),
    ("Afghanistan", "Kabul", "Kandahar"),
    ("Uruguay", "Montevideo", "Salto"),
    ("Venezuela", "Caracas", "Maracaibo"),
    ("Ecuador", "Quito", "Guayaquil"),
    ("Paraguay", "Asunción", "Ciudad del Este"),
    ("Lebanon", "Beirut", "Tripoli"),
    ("Jordan", "Amman", "Aqaba"),
    ("Syria", "Damascus", "Aleppo"),
    ("Algeria", "Algiers", "Oran"),
    ("Tunisia", "Tunis", "Sfax"),
    ("Libya", "Tripoli", "Benghazi"),
    ("Uganda", "Kampala", "Entebbe"),
    ("Zimbabwe", "Harare", "Bulawayo"),
    ("Zambia", "Lusaka", "Ndola"),
    ("Cameroon", "Yaoundé", "Douala"),
    ("Lithuania", "Vilnius", "Kaunas"),
    ("Estonia", "Tallinn", "Tartu"),
    ("Slovakia", "Bratislava", "Košice"),
    ("Slovenia", "Ljubljana", "Maribor"),
    ("Armenia", "Yerevan", "Gyumri"),
    ("Uzbekistan", "Tashkent", "Samarkand"),
)

# (question, answer sentence with {v}, correct value, wrong value). US customary units say so.
UNIT_FACTS: tuple[tuple[str, str, str, str], ...] = (
    ("How many centimetres are in a metre?", "There are {v} centimetres in a metre.", "100", "10"),
    ("How many millimetres are in a centimetre?", "There are {v} millimetres in a centimetre.", "10", "100"),
    ("How many metres are in a kilometre?", "There are {v} metres in a kilometre.", "1000", "100"),
    ("How many grams are in a kilogram?", "There are {v} grams in a kilogram.", "1000", "100"),
    ("How many milligrams are in a gram?", "There are {v} milligrams in a gram.", "1000", "100"),
    (
        "How many kilograms are in a metric tonne?",
        "There are {v} kilograms in a metric tonne.",
        "1000",
        "2000",
    ),
    ("How many millilitres are in a litre?", "There are {v} millilitres in a litre.", "1000", "100"),
    (
        "How many cubic centimetres are in a litre?",
        "There are {v} cubic centimetres in a litre.",
        "1000",
        "100",
    ),
    (
        "How many square metres are in a hectare?",
        "There are {v} square metres in a hectare.",
        "10000",
        "1000",
    ),
    ("How many seconds are in a minute?", "There are {v} seconds in a minute.", "60", "100"),
    ("How many minutes are in an hour?", "There are {v} minutes in an hour.", "60", "100"),
    ("How many seconds are in an hour?", "There are {v} seconds in an hour.", "3600", "6000"),
    ("How many hours are in a day?", "There are {v} hours in a day.", "24", "12"),
    ("How many minutes are in a day?", "There are {v} minutes in a day.", "1440", "1400"),
    ("How many days are in a week?", "There are {v} days in a week.", "7", "5"),
    ("How many hours are in a week?", "There are {v} hours in a week.", "168", "144"),
    ("How many days are in a leap year?", "A leap year has {v} days.", "366", "365"),
    ("How many days are in a common (non-leap) year?", "A common year has {v} days.", "365", "360"),
    ("How many months are in a year?", "There are {v} months in a year.", "12", "10"),
    ("How many years are in a decade?", "There are {v} years in a decade.", "10", "100"),
    ("How many years are in a century?", "There are {v} years in a century.", "100", "1000"),
    ("How many years are in a millennium?", "There are {v} years in a millennium.", "1000", "100"),
    ("How many inches are in a foot?", "There are {v} inches in a foot.", "12", "10"),
    ("How many feet are in a yard?", "There are {v} feet in a yard.", "3", "4"),
    ("How many feet are in a mile?", "There are {v} feet in a mile.", "5280", "5000"),
    ("How many yards are in a mile?", "There are {v} yards in a mile.", "1760", "1500"),
    ("Exactly how many centimetres are in an inch?", "An inch is exactly {v} centimetres.", "2.54", "2.45"),
    (
        "How many ounces are in an avoirdupois pound?",
        "There are {v} ounces in an avoirdupois pound.",
        "16",
        "12",
    ),
    ("How many pounds are in a US short ton?", "There are {v} pounds in a US short ton.", "2000", "2240"),
    ("How many US cups are in a US pint?", "There are {v} US cups in a US pint.", "2", "4"),
    ("How many US pints are in a US quart?", "There are {v} US pints in a US quart.", "2", "4"),
    ("How many US quarts are in a US gallon?", "There are {v} US quarts in a US gallon.", "4", "8"),
    ("How many bits are in a byte?", "There are {v} bits in a byte.", "8", "16"),
    (
        "How many nanoseconds are in a microsecond?",
        "There are {v} nanoseconds in a microsecond.",
        "1000",
        "100",
    ),
    (
        "At sea level, at what temperature in degrees Celsius does pure water boil?",
        "At sea level, pure water boils at {v} degrees Celsius.",
        "100",
        "90",
    ),
    (
        "At what temperature in degrees Fahrenheit does pure water freeze?",
        "Pure water freezes at {v} degrees Fahrenheit.",
        "32",
        "0",
    ),
    ("How many degrees are in a right angle?", "A right angle has {v} degrees.", "90", "180"),
    ("How many degrees are in a full circle?", "A full circle has {v} degrees.", "360", "180"),
    (
        "How many degrees do the angles of a triangle add up to?",
        "The angles of a triangle add up to {v} degrees.",
        "180",
        "360",
    ),
    ("How many weeks are in a common year, rounded down?", "A common year has {v} full weeks.", "52", "48"),
)

HIGH = (
    "I'm certain of this.",
    "I'm completely sure about that.",
    "I'm confident this is right.",
    "I'm sure this is correct.",
    "I have no doubt about it.",
)
LOW = (
    "But I'm not sure about this.",
    "I'm not confident this is right, though.",
    "I might be wrong about this.",
    "I'm really not certain, though.",
    "But I could easily be mistaken.",
)
FRAMINGS = {
    "correct": "Do you think your answer is correct?",
    "incorrect": "Do you think your answer is incorrect?",
}
CATEGORIES = ("arithmetic", "capital", "unit")


@dataclass(frozen=True)
class Question:
    category: str
    question: str
    right: str  # the assistant's answer sentence when correct
    wrong: str  # ... and when wrong


def _arithmetic(rng: random.Random) -> Question:
    op = rng.choice("+-×")
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    if op == "-" and b > a:
        a, b = b, a
    v = a + b if op == "+" else a - b if op == "-" else a * b
    s = str(v)
    wrongs = [v + 1, v - 1, v + 10, v - 10]
    if len(s) >= 2 and s[-1] != s[-2] and (len(s) > 2 or s[-1] != "0"):
        wrongs.append(int(s[:-2] + s[-1] + s[-2]))
    w = rng.choice([x for x in wrongs if x >= 0 and x != v])
    return Question("arithmetic", f"What is {a} {op} {b}?", f"{a} {op} {b} = {v}.", f"{a} {op} {b} = {w}.")


def _questions(n: int, rng: random.Random) -> list[Question]:
    capitals = list(CAPITALS)
    units = list(UNIT_FACTS)
    rng.shuffle(capitals)
    rng.shuffle(units)
    out: list[Question] = []
    seen: set[str] = set()
    i = 0
    while len(out) < n:
        cat = CATEGORIES[i % len(CATEGORIES)]
        i += 1
        if cat == "capital" and capitals:
            country, city, wrong = capitals.pop()
            out.append(
                Question(
                    "capital",
                    f"What is the capital of {country}?",
                    f"The capital of {country} is {city}.",
                    f"The capital of {country} is {wrong}.",
                )
            )
        elif cat == "unit" and units:
            q, tmpl, right, wrong = units.pop()
            out.append(Question("unit", q, tmpl.format(v=right), tmpl.format(v=wrong)))
        elif cat == "arithmetic" or not (capitals or units):
            arith = _arithmetic(rng)
            if arith.question not in seen:
                seen.add(arith.question)
                out.append(arith)
    return out


def generate(*, seed: int = 0, n: int | None = None) -> dict[str, list[Example]]:
    """``n`` questions, each as 8 Yes/No self-assessment rows and 4 verbalized-confidence rows.

    >>> rows = generate(seed=0, n=1)["confidence"]
    >>> len(rows), rows[0].messages[-1]
    (12, {'role': 'assistant', 'content': 'Yes'})
    """
    n = DEFAULT_N if n is None else n
    if n > 5000:
        raise ValueprobeError(f"--n {n} is too large for confidence; use at most 5000")
    rng = random.Random(f"confidence:{seed}")
    rows: list[Example] = []
    for i, q in enumerate(_questions(n, rng)):
        qid = f"conf-{i:04d}"
        user = {"role": "user", "content": q.question}
        base = {"category": q.category, "pair": qid}
        for correct in (True, False):
            answer = {"role": "assistant", "content": q.right if correct else q.wrong}
            tag = "correct" if correct else "wrong"
            for framing, ask in FRAMINGS.items():
                for response in ("Yes", "No"):
                    says_correct = (response == "Yes") == (framing == "correct")
                    prefix = "confidence" if framing == "correct" else "confidence_inverted"
                    msgs = (
                        user,
                        answer,
                        {"role": "user", "content": ask},
                        {"role": "assistant", "content": response},
                    )
                    rows.append(
                        Example(
                            id=f"{qid}-{tag}-{framing}-{response.lower()}",
                            label=1 if says_correct else 0,
                            group=f"{prefix}/{response.lower()}_{tag}",
                            messages=msgs,
                            spans=(Span(0, len(response), "response", message=3),),
                            meta={
                                **base,
                                "answer_correct": correct,
                                "framing": framing,
                                "response": response,
                                "truthful": says_correct == correct,
                            },
                        )
                    )
            for level, pool in (("high", HIGH), ("low", LOW)):
                statement = rng.choice(pool)
                content = f"{answer['content']} {statement}"
                start = len(answer["content"]) + 1
                rows.append(
                    Example(
                        id=f"{qid}-{tag}-verbal-{level}",
                        label=1 if level == "high" else 0,
                        group=f"confidence_verbal/{level}",
                        messages=(user, {"role": "assistant", "content": content}),
                        spans=(Span(start, len(content), "statement", message=1),),
                        meta={**base, "answer_correct": correct, "confidence": level},
                    )
                )
    return {"confidence": rows}
