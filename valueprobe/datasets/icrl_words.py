"""The word tables of the ICRL family's semantic rules: (rule id, what the rule says, its words,
phrase templates that place one of them). :mod:`valueprobe.datasets.icrl_rules` turns each row
into a `Rule` whose checker looks for any of the words.

>>> from valueprobe.datasets.icrl_words import SEMANTIC_RULES
>>> SEMANTIC_RULES[0][:2]
('mentions_animal', 'the rewrite mentions an animal')
"""

from __future__ import annotations

__all__ = ["SEMANTIC_RULES"]

# Templates put "the" or a consonant-initial adjective before {w}, so the article is always right.

# fmt: off
SEMANTIC_RULES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("mentions_animal", "the rewrite mentions an animal",
     ("dog", "cat", "horse", "rabbit", "fox", "owl", "goat", "deer", "squirrel", "parrot", "tortoise", "hedgehog", "donkey", "badger", "otter"),
     ("while a curious {w} watched", "as a small {w} wandered past", "with a sleepy {w} nearby")),
    ("mentions_color", "the rewrite mentions a colour",
     ("red", "blue", "green", "yellow", "purple", "orange", "pink", "violet", "crimson", "turquoise", "scarlet", "indigo"),
     ("under the {w} banner", "beside the {w} door", "near the {w} sign")),
    ("mentions_food", "the rewrite mentions a dish or food",
     ("soup", "bread", "pancakes", "pasta", "rice", "cheese", "sandwiches", "pizza", "noodles", "dumplings", "porridge", "omelette"),
     ("over a plate of {w}", "while sharing some {w}", "after a quick meal of {w}")),
    ("mentions_weather", "the rewrite mentions the weather",
     ("rain", "snow", "fog", "thunder", "hail", "sunshine", "drizzle", "sleet", "wind", "frost"),
     ("despite the {w}", "in spite of the {w}", "during the {w}")),
    ("mentions_instrument", "the rewrite mentions a musical instrument",
     ("piano", "violin", "guitar", "trumpet", "drum", "cello", "flute", "harp", "saxophone", "clarinet", "banjo", "accordion"),
     ("while someone played the {w}", "to the sound of a distant {w}", "beside a dusty {w}")),
    ("mentions_water", "the rewrite mentions a body of water",
     ("river", "lake", "ocean", "pond", "stream", "sea", "bay", "lagoon", "creek", "waterfall"),
     ("not far from the {w}", "beside the {w}", "on the way to the {w}")),
    ("mentions_tool", "the rewrite mentions a tool",
     ("hammer", "screwdriver", "wrench", "saw", "chisel", "drill", "shovel", "rake", "pliers", "ladder"),
     ("with a borrowed {w}", "using a rusty {w}", "holding a heavy {w}")),
    ("mentions_fruit", "the rewrite mentions a fruit",
     ("apple", "banana", "pear", "peach", "plum", "mango", "cherry", "lemon", "grape", "melon", "kiwi", "apricot"),
     ("while eating a fresh {w}", "with a ripe {w} in hand", "next to a bowl of {w} slices")),
    ("mentions_weekday", "the rewrite mentions a day of the week",
     ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
     ("on {w}", "last {w}", "early on {w}")),
    ("mentions_month", "the rewrite mentions a month",
     ("January", "February", "March", "April", "June", "July", "August", "September", "October", "November", "December"),
     ("in {w}", "last {w}", "early in {w}")),
    ("mentions_sky", "the rewrite mentions something in the sky or space",
     ("moon", "sun", "star", "planet", "comet", "galaxy", "meteor", "rainbow", "cloud", "constellation"),
     ("beneath the {w}", "under a bright {w}", "while the {w} was visible")),
    ("mentions_plant", "the rewrite mentions a tree or flower",
     ("oak", "willow", "rose", "tulip", "daisy", "maple", "pine", "lily", "birch", "sunflower", "lavender", "cactus"),
     ("beside a tall {w}", "near a blooming {w}", "under the {w}")),
    ("mentions_clothing", "the rewrite mentions an item of clothing",
     ("hat", "scarf", "jacket", "coat", "sweater", "boots", "gloves", "dress", "shirt", "sandals", "raincoat", "tie"),
     ("in a borrowed {w}", "wearing a new {w}", "with a faded {w}")),
    ("mentions_sport", "the rewrite mentions a sport",
     ("football", "tennis", "basketball", "cricket", "hockey", "golf", "rugby", "baseball", "volleyball", "swimming", "cycling", "badminton"),
     ("right after the {w} match", "before the {w} final", "during a {w} tournament")),
    ("mentions_family", "the rewrite mentions a family member",
     ("mother", "father", "sister", "brother", "grandmother", "grandfather", "aunt", "uncle", "cousin", "nephew", "niece", "daughter"),
     ("while her {w} watched", "with his {w} beside him", "to the delight of her {w}")),
    ("mentions_country", "the rewrite mentions a country",
     ("France", "Japan", "Brazil", "Canada", "Kenya", "Norway", "Mexico", "Egypt", "India", "Peru", "Italy", "Vietnam"),
     ("just like in {w}", "as they do in {w}", "for visitors from {w}")),
    ("mentions_profession", "the rewrite mentions an occupation not already in the sentence",
     ("plumber", "dentist", "firefighter", "librarian", "electrician", "astronaut", "veterinarian", "accountant", "florist", "locksmith"),
     ("while a bored {w} watched", "as a local {w} explained", "with help from a friendly {w}")),
    ("mentions_body_part", "the rewrite mentions a part of the body",
     ("hand", "knee", "elbow", "shoulder", "ankle", "nose", "forehead", "thumb", "wrist", "chin"),
     ("with a sore {w}", "despite a bruised {w}", "holding a hurt {w}")),
    ("mentions_furniture", "the rewrite mentions a piece of furniture",
     ("chair", "sofa", "table", "wardrobe", "bookshelf", "bench", "stool", "dresser", "armchair", "cupboard"),
     ("beside a wooden {w}", "next to the {w}", "near a battered {w}")),
    ("mentions_season", "the rewrite mentions a season",
     ("spring", "summer", "autumn", "winter"),
     ("in the {w}", "last {w}", "early in the {w}")),
    ("mentions_material", "the rewrite mentions a metal or gemstone",
     ("gold", "silver", "copper", "iron", "bronze", "diamond", "ruby", "emerald", "sapphire", "pearl"),
     ("beside the {w} statue", "holding the {w} coin", "near the {w} gate")),
)
# fmt: on
