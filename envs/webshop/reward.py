"""WebShop's purchase reward: attribute, option, price and product-type matching, in [0, 1].

The rules of WebShop's ``get_reward`` (princeton-nlp/WebShop @ 64fa2a5,
``web_agent_site/engine/goal.py``)::

    reward = r_type * (attributes matched + goal options matched + [price <= bound])
                    / (goal attributes + goal options + 1)

- **attributes**: a goal attribute matches when one of the product's attributes has a fuzzy
  ``token_set_ratio`` above 85, or when it is a substring of the title, the bullet points or the
  description (lower-cased);
- **options**: each goal option matches when one of the selected option values does (colours
  first normalised to the first colour word they contain, then ``token_set_ratio`` above 85). A
  synthetic goal's options are (name, value) pairs, compared as WebShop compares them: the pair's
  text ``('color', 'black')`` against the selected value;
- **price**: the product's price is at most the goal's bound;
- **type** ``r_type``: 1 when the query, two categories or the title words match; 0.5 when none
  does; 0.1 when under a tenth of the goal title's words are in the product's title; 0 when none.

Substitutes (the only differences):

- ``token_set_ratio`` is RapidFuzz's, with thefuzz's processing (``str()``, characters 128-255
  dropped, RapidFuzz's default processing, score rounded): what ``thefuzz`` >= 0.20 computes.
- The title words of the type score: WebShop keeps the nouns and proper nouns that spaCy's
  ``en_core_web_lg`` tags in each title; here every alphabetic word of two or more letters that
  is not an English stop word (plain token matching, no model). The goal's own product always
  scores 1; another product can get a different title score than with spaCy (adjectives and
  verbs count here), which changes ``r_type`` only where the query and category also differ.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from .catalogue import Product
from .goals import Goal

FUZZY_THRESHOLD = 85
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue",
    "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper",
    "coral", "cranberry", "cream", "crystal", "dark", "denim", "eggplant", "elephant", "espresso",
    "fuchsia", "gold", "granite", "grape", "graphite", "grass", "gray", "green", "grey", "heather",
    "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac", "lime",
    "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom",
    "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum",
    "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
    "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger",
    "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip
"""WebShop's colour words (``normalize.py``), in its order: the first one found wins."""
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how if in into is it its itself just me
    more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when where which while who whom
    why will with you your yours yourself yourselves""".split()
)
_WORD = re.compile(r"[a-z]+")
_NOT_LATIN1 = {i: None for i in range(128, 256)}


def token_set_ratio(a: Any, b: Any) -> int:
    """``thefuzz.fuzz.token_set_ratio(a, b)`` (force_ascii, full_process), on RapidFuzz."""
    first = default_process(str(a).translate(_NOT_LATIN1))
    second = default_process(str(b).translate(_NOT_LATIN1))
    return int(round(fuzz.token_set_ratio(first, second)))


def normalize_color(option: Any) -> Any:
    """The first colour word contained in ``option`` (substring for text, element for a pair), else ``option``."""
    for color in COLOR_SET:
        if color in option:
            return color
    return option


def title_words(title: str) -> list[str]:
    """The words of a title the type score compares (see the module docstring), in order."""
    return [w for w in _WORD.findall(title.lower()) if len(w) > 1 and w not in STOP_WORDS]


SPACY_MODEL = "en_core_web_lg"
"""The spaCy model AgentBench's WebShop loads (its ``webshop.patch`` of ``engine/goal.py``)."""
NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")


def spacy_title_nouns(model: str = SPACY_MODEL) -> Callable[[str], list[str]]:
    """WebShop's title words: the lower-cased tokens spaCy's ``model`` tags as nouns or proper
    nouns. Needs spaCy and the model, which this project does not install."""
    try:
        import spacy

        nlp = spacy.load(model)
    except (ImportError, OSError) as exc:
        raise ValueError(
            f"title_nouns='spacy' needs spaCy and its {model} model (pip install spacy && "
            f"python -m spacy download {model}): {exc}; or use title_nouns='tokens'"
        ) from None

    def nouns(title: str) -> list[str]:
        return [token.text.lower() for token in nlp(title) if token.pos_ in NOUN_TAGS]

    return nouns


@dataclass(frozen=True)
class TypeScore:
    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


def type_score(product: Product, goal: Goal, words: Callable[[str], list[str]] = title_words) -> TypeScore:
    """Whether the purchased product is the kind of product the goal asks for; ``words``: the
    title words compared (:func:`title_words`, or WebShop's spaCy nouns: :func:`spacy_title_nouns`)."""
    query_match = product.query == goal.query
    bought = {x.strip() for x in product.product_category.split("›")}
    wanted = {x.strip() for x in goal.product_category.split("›")}
    category_match = len(bought & wanted) >= 2
    desired = words(goal.name)
    if desired:
        title_score = len(set(words(product.name)) & set(desired)) / len(desired)
    else:
        title_score = 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeScore(r_type, query_match, category_match, title_score)


def attribute_matches(product: Product, goal: Goal) -> int:
    """How many goal attributes the product has (fuzzy among its attributes, or in its texts)."""
    texts = (product.name.lower(), " ".join(product.bullet_points).lower(), product.description.lower())
    matches = 0
    for wanted in goal.attributes:
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in product.attributes):
            matches += 1
        elif any(wanted in text for text in texts):
            matches += 1
    return matches


def option_matches(selected: list[str], goal: Goal) -> int:
    """How many goal options one of the selected option values matches."""
    wanted_options: list[Any] = (
        list(goal.goal_options.items()) if isinstance(goal.goal_options, dict) else list(goal.goal_options)
    )
    chosen = [normalize_color(o) for o in selected]
    matches = 0
    for wanted in (normalize_color(o) for o in wanted_options):
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in chosen):
            matches += 1
    return matches


@dataclass(frozen=True)
class Reward:
    """The reward of a purchase and its parts (WebShop's ``verbose`` info)."""

    reward: float
    r_type: float
    r_att: float
    r_option: float | None
    r_price: bool
    query_match: bool
    category_match: bool
    title_score: float

    def metrics(self) -> dict[str, float]:
        """The parts as numbers (``r_option`` left out for goals without options)."""
        out = {
            "r_type": self.r_type,
            "r_att": self.r_att,
            "r_price": float(self.r_price),
            "title_score": self.title_score,
        }
        if self.r_option is not None:
            out["r_option"] = self.r_option
        return out


def purchase_reward(
    product: Product,
    price: float,
    selected: dict[str, str],
    goal: Goal,
    words: Callable[[str], list[str]] = title_words,
) -> Reward:
    """The reward for buying ``product`` at ``price`` with options ``selected`` for ``goal``."""
    kind = type_score(product, goal, words)
    r_price = price <= goal.price_upper
    n_attributes = attribute_matches(product, goal)
    n_options = option_matches(list(selected.values()), goal)
    total = len(goal.attributes) + len(goal.goal_options) + 1
    reward = (n_attributes + n_options + int(r_price)) / total * kind.r_type
    return Reward(
        reward=reward,
        r_type=kind.r_type,
        r_att=n_attributes / len(goal.attributes) if goal.attributes else 0.0,
        r_option=n_options / len(goal.goal_options) if goal.goal_options else None,
        r_price=r_price,
        query_match=kind.query_match,
        category_match=kind.category_match,
        title_score=kind.title_score,
    )
