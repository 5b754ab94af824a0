"""WebShop goals for the 1000-product catalogue, and their deterministic train/test split.

Two kinds, made as WebShop's ``get_synthetic_goals`` / ``get_human_goals`` make them
(princeton-nlp/WebShop @ 64fa2a5, ``web_agent_site/engine/goal.py``):

- **synthetic**: every product with an instruction in ``items_ins_v2_1000`` (415) gives one goal
  per combination of its option values (option names sorted): ``"<instruction> with color: red,
  and size: large, and price lower than 40.00 dollars"``; its attributes are the instruction's
  attributes, its goal options the combination (a dict). 6,910 goals.
- **human**: the human instructions of these products (``items_human_ins``, 13 with attributes):
  ``"<instruction without its final '.'>, and price lower than 40.00 dollars"``, goal options the
  instruction's option list.

The price bound is WebShop's: two of the (up to) four multiples of 10 above the product's price
are drawn and the larger is the bound; no bound (1,000,000, no price text) when fewer than two
exist. WebShop draws it from the process-global random state; here from a generator seeded by
``seed`` and the goal, so a goal is the same text at every start.

**Split** (ours; WebShop has no split for the 1000-product mode): the products that have goals
are shuffled with ``random.Random(seed)``; the first ``test_fraction`` of them are test products.
``test`` holds, per test product, its human goals and up to ``test_goals_per_product`` of its
synthetic goals (drawn, seeded), so that products with hundreds of option combinations do not
fill the test set; ``train`` holds every goal of the other products. No product is in both. Each
split is shuffled with the seed; a sample index is a position in its split.

AgentBench's indices (``webshop-std`` 0-199, ``webshop-env_train`` 1000-11999) are positions in
WebShop's shuffled list of 12,087 *human* goals over the full catalogue (1.18M products); those
goals name products that are not in the 1000-product catalogue (only the 13 above are), so those
indices cannot be served from the vendored data and ours are not comparable with them. Given the
user's own copy of WebShop's full data, :func:`agentbench_goals` makes AgentBench's list
(``WebShopTask(source="agentbench")``).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Literal

from .catalogue import Catalogue, Product

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_BOUND = 1_000_000.0
SPLITS = ("train", "test")

GoalOptions = dict[str, str] | tuple[str, ...]


@dataclass(frozen=True)
class Goal:
    """What the shopper asks for: the instruction and what the reward compares the purchase with."""

    asin: str
    """The product the goal was made from."""
    kind: Literal["synthetic", "human"]
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: GoalOptions
    """Synthetic goals: option name -> value; human goals: a list of option values."""
    price_upper: float
    name: str
    query: str
    category: str
    product_category: str

    @property
    def option_values(self) -> tuple[str, ...]:
        """The option values to select when buying the goal's own product."""
        if isinstance(self.goal_options, dict):
            return tuple(self.goal_options.values())
        return tuple(self.goal_options)


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """(bound, text) for a product of ``price``, as WebShop draws it."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) >= 2:
        _, upper = sorted(rng.sample(above, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return NO_PRICE_BOUND, ""


def synthetic_goals(product: Product, price: float, seed: int) -> list[Goal]:
    """One goal per combination of the product's option values (none without an instruction)."""
    if product.synthetic_instruction is None:
        return []
    upper, price_text = price_bound(price, random.Random(f"webshop-goal:{seed}:{product.asin}"))
    names = sorted(product.options)
    goals = []
    for combination in itertools.product(*(product.options[name] for name in names)):
        chosen = dict(zip(names, combination, strict=True))
        option_text = ", and ".join(f"{k}: {v}" for k, v in chosen.items())
        option_text = " with " + option_text if option_text else ""
        goals.append(
            Goal(
                asin=product.asin,
                kind="synthetic",
                instruction_text=f"{product.synthetic_instruction}{option_text}{price_text}",
                attributes=product.synthetic_attributes,
                goal_options=chosen,
                price_upper=upper,
                name=product.name,
                query=product.query,
                category=product.category,
                product_category=product.product_category,
            )
        )
    return goals


def human_goals(product: Product, price: float, seed: int) -> list[Goal]:
    """The product's human instructions that name attributes (WebShop skips the others)."""
    goals = []
    for number, entry in enumerate(product.human_instructions):
        attributes = tuple(entry.get("instruction_attributes") or ())
        if not attributes:
            continue
        rng = random.Random(f"webshop-human-goal:{seed}:{product.asin}:{number}")
        upper, price_text = price_bound(price, rng)
        goals.append(
            Goal(
                asin=product.asin,
                kind="human",
                instruction_text=entry["instruction"].strip(".") + price_text,
                attributes=attributes,
                goal_options=tuple(entry.get("instruction_options") or ()),
                price_upper=upper,
                name=product.name,
                query=product.query,
                category=product.category,
                product_category=product.product_category,
            )
        )
    return goals


def goals_by_product(catalogue: Catalogue, seed: int = 0) -> dict[str, tuple[list[Goal], list[Goal]]]:
    """ASIN -> (human goals, synthetic goals), for the products that have any, in catalogue order."""
    out: dict[str, tuple[list[Goal], list[Goal]]] = {}
    for product in catalogue.products:
        price = catalogue.prices[product.asin]
        human = human_goals(product, price, seed)
        synthetic = synthetic_goals(product, price, seed)
        if human or synthetic:
            out[product.asin] = (human, synthetic)
    return out


AGENTBENCH_GOAL_SEED = 233
"""WebShop's ``SimServer`` shuffles its goals with ``random.seed(233)`` (same list, same order)."""
AGENTBENCH_SPLITS = {"std": range(0, 200), "dev": range(200, 280), "env_train": range(1000, 12000)}
"""AgentBench's WebShop index ranges (``configs/tasks/webshop.yaml``: ``webshop-std`` 0-199,
``webshop-dev`` 200-279, ``webshop-env_train`` 1000-11999)."""


def agentbench_goals(catalogue: Catalogue, seed: int = 0) -> list[Goal]:
    """WebShop's human goals in the order AgentBench indexes them (``human_goals=True``): every
    human instruction with attributes, product by product in catalogue order, then shuffled as
    ``SimServer`` shuffles them; AgentBench's sample index ``i`` is position ``i``."""
    goals = [
        goal
        for product in catalogue.products
        for goal in human_goals(product, catalogue.prices[product.asin], seed)
    ]
    random.Random(AGENTBENCH_GOAL_SEED).shuffle(goals)
    return goals


def split_goals(
    catalogue: Catalogue,
    split: str,
    seed: int = 0,
    test_fraction: float = 0.2,
    test_goals_per_product: int = 3,
) -> list[Goal]:
    """The goals of ``split`` (``train`` or ``test``; see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"unknown WebShop split {split!r}; expected one of {SPLITS}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"WebShop test_fraction must be in (0, 1), got {test_fraction!r}")
    if test_goals_per_product < 1:
        raise ValueError(f"WebShop test_goals_per_product must be >= 1, got {test_goals_per_product!r}")
    by_product = goals_by_product(catalogue, seed)
    asins = list(by_product)
    random.Random(f"webshop-split:{seed}").shuffle(asins)
    n_test = round(len(asins) * test_fraction)
    test_asins = set(asins[:n_test])
    goals: list[Goal] = []
    for asin, (human, synthetic) in by_product.items():
        if split == "train" and asin not in test_asins:
            goals += human + synthetic
        elif split == "test" and asin in test_asins:
            rng = random.Random(f"webshop-test-goals:{seed}:{asin}")
            keep = sorted(rng.sample(range(len(synthetic)), min(test_goals_per_product, len(synthetic))))
            goals += human + [synthetic[i] for i in keep]
    random.Random(f"webshop-order:{seed}:{split}").shuffle(goals)
    return goals
