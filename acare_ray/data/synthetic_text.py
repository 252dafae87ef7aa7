"""Names and sentence templates of the synthetic agent-search world (see ``synthetic.py``).

Every template of a fact contains that fact's sub-query keywords literally, and the filler
sentences contain none of the keywords, so keyword overlap alone cannot pick the right document.
"""

from __future__ import annotations

import random

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"]
_ONSETS += ["br", "dr", "kr", "tr", "st", "gl", "fl", "th", "sk"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "nd", "rk", "th"]
SUFFIXES = {
    "country": ["ia", "land", "mark", "ora", "esh", "avia", ""],
    "city": ["holm", "burg", "ford", "ana", "ost", "wick", ""],
    "anchor": ["", "", "a", "en"],
    "person": ["", "", "ik", "ova", "sen"],
    "thing": ["", "", "i", "ar"],
}


def make_name(rng: random.Random, kind: str) -> str:
    syllables = rng.choice([2, 2, 2, 3])
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
    suffix = rng.choice(SUFFIXES[kind]) if syllables == 2 else ""
    return (word + rng.choice(_CODAS) + suffix).capitalize()


# Anchor kinds: what many countries share (the question names it), and the one relation that
# singles out one of them (step 1). {a} anchor, {c} country, {x} extra name, {n} number.
ANCHORS = {
    "river": {
        "name": "{} River",
        "sub_query": "{a} source",
        "country_clause": ["in the {a} basin", "on the banks of the {a}", "crossed by the {a}"],
        "city_clause": ["on the {a}", "in the {a} valley", "where the {a} bends north"],
        "question": ["where the {a} rises", "in which the {a} has its source"],
        "plan": "find out in which country the {a} rises",
        "found": ["The {a} rises in {c}.", "The search shows that the {a} has its source in {c}."],
        "gold": [
            "The {a} has its source in the hills of {c}, where several springs meet in a marsh.",
            "Geographers place the source of the {a} in {c}, high on a granite plateau.",
        ],
        "near": [
            "The {a} is an important source of water for farms in {c}.",
            "For the people of {c}, the {a} has long been a source of fish and trade.",
            "Dams in {c} turn the {a} into a source of cheap electricity.",
        ],
        "other": [
            "The {a} is about {n} kilometres long and ends in a wide delta.",
            "Barges carry grain down the {a} for most of the summer.",
        ],
    },
    "range": {
        "name": "{} Mountains",
        "sub_query": "{a} highest peak",
        "country_clause": ["along the {a}", "in the shadow of the {a}", "on the edge of the {a}"],
        "city_clause": [
            "in the foothills of the {a}",
            "below the {a}",
            "near the passes of the {a}",
        ],
        "question": [
            "that is home to the highest peak of the {a}",
            "where the {a} reach their summit",
        ],
        "plan": "find out which country holds the highest peak of the {a}",
        "found": [
            "The highest peak of the {a} is in {c}.",
            "Mount {x}, the top of the {a}, stands in {c}.",
        ],
        "gold": [
            "The highest peak of the {a}, Mount {x}, stands in {c} and was first climbed by shepherds.",
            "Mount {x} in {c} is the highest peak of the {a}, rising above a glacier lake.",
        ],
        "near": [
            "From {c}, hikers can see the highest peak of the {a} on clear days.",
            "Guides in {c} lead tours toward the highest peak of the {a} each summer.",
            "Maps printed in {c} once wrongly showed the highest peak of the {a} on its soil.",
        ],
        "other": [
            "The {a} stretch for some {n} kilometres and are rich in iron ore.",
            "Wolves and lynx still roam the forests of the {a}.",
        ],
    },
    "league": {
        "name": "{} League",
        "sub_query": "{a} headquarters",
        "country_clause": [
            "within the {a} trade zone",
            "inside the {a} customs area",
            "in the {a} free-trade area",
        ],
        "city_clause": [
            "on the {a} trade road",
            "in the {a} customs area",
            "inside the {a} free-trade zone",
        ],
        "question": [
            "that hosts the headquarters of the {a}",
            "where the {a} has its headquarters",
        ],
        "plan": "find out which country hosts the headquarters of the {a}",
        "found": [
            "The {a} has its headquarters in {c}.",
            "The search shows the {a} is based in {c}.",
        ],
        "gold": [
            "The {a} has its headquarters in {c}, in a former customs house.",
            "Since its reform, the {a} keeps its headquarters in {c}.",
        ],
        "near": [
            "{c} has asked several times to host the headquarters of the {a}.",
            "Envoys from {c} report to the {a} headquarters twice a year.",
            "A plan to move the {a} headquarters to {c} was rejected after a long debate.",
        ],
        "other": [
            "The {a} was formed by {n} merchant towns to settle tariff disputes.",
            "Members of the {a} share a common customs code.",
        ],
    },
}

# Facts about a country ({c}, clause {k}) and about its capital ({y} city, {c} country, clause
# {k}). "sub_query" words appear in every template of the fact; {v} is the answer.
COUNTRY_FACTS = {
    "capital": {
        "sub_query": "capital city",
        "ask": "the capital of",
        "templates": [
            "{v} is the capital city of {c}, a country {k}.",
            "The capital city of {c}, a country {k}, is {v}.",
            "{c} lies {k}; its capital city, {v}, is also its largest port.",
        ],
    },
    "currency": {
        "sub_query": "official currency",
        "ask": "the official currency of",
        "templates": [
            "{c}, a country {k}, uses the {v} as its official currency.",
            "The official currency of {c}, which lies {k}, is the {v}.",
            "In {c}, {k}, the {v} has been the official currency since the old coins were withdrawn.",
        ],
    },
    "language": {
        "sub_query": "official language",
        "ask": "the official language of",
        "templates": [
            "The official language of {c}, a country {k}, is {v}.",
            "{c} lies {k}, and {v} is its official language.",
            "Schools in {c}, {k}, teach in {v}, the official language.",
        ],
    },
}
CITY_FACTS = {
    "population": {
        "sub_query": "city population",
        "ask": "the population of",
        "templates": [
            "{y}, the capital of {c}, is a city {k} with a population of {v}.",
            "The population of {y}, a city {k} and capital of {c}, is about {v}.",
            "With a population of {v}, {y} is the busiest city of {c} and lies {k}.",
        ],
    },
    "founded": {
        "sub_query": "city founded year",
        "ask": "the year of founding of",
        "templates": [
            "{y}, the capital of {c}, was founded in the year {v} as a city {k}.",
            "Chronicles say the city of {y}, {k}, was founded in the year {v}; it is now the capital of {c}.",
            "The city {y} lies {k}; it was founded in the year {v} and later became the capital of {c}.",
        ],
    },
    "mayor": {
        "sub_query": "city mayor",
        "ask": "the mayor of",
        "templates": [
            "The mayor of {y}, the capital city of {c} {k}, is {v}.",
            "{v} serves as mayor of {y}, a city {k} and the capital of {c}.",
            "{y} lies {k}; the city elected {v} as mayor at the last vote, {c} media report.",
        ],
    },
}
QUESTIONS = {
    ("capital",): "What is the capital of the country {q}?",
    ("currency",): "Which currency is used in the country {q}?",
    ("language",): "What language is spoken officially in the country {q}?",
    ("capital", "population"): "How many people live in the capital of the country {q}?",
    ("capital", "founded"): "In which year was the capital of the country {q} founded?",
    ("capital", "mayor"): "Who is the mayor of the capital of the country {q}?",
}
FILLERS = [
    "Its economy rests on {w} and {w2}.",
    "Winters there are long, and the summers are short and bright.",
    "Tourism has grown steadily over the last two decades.",
    "Much of the land is covered by {t}.",
    "Historians still argue about the origin of its flag, a red bird on a green field.",
    "Its football club reached the regional final twice but never won it.",
    "Heavy rains in spring often flood the lower streets near the market.",
    "The old town is known for its painted wooden houses.",
    "A railway built by foreign engineers links the coast with the interior.",
    "Local cooks are proud of a stew made with {f}.",
]
WARES = ["timber", "wool", "barley", "salt", "copper", "amber", "flax", "olives", "rye", "tin"]
FOODS = ["lentils", "smoked eel", "mutton", "wild mushrooms", "chestnuts", "goat cheese"]
TERRAIN = ["pine forest", "open steppe", "terraced vineyards", "peat bogs", "limestone hills"]
