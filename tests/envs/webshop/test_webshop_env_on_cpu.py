"""WebShop in-process: the catalogue, goals and split, search, reward rules, pages and actions.

Expected values come from the raw vendored files read here, from WebShop's own reward tests
(princeton-nlp/WebShop ``tests/web-agent-site/engine/test_goal.py``) and from hand-written page
texts.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from pathlib import Path

import pytest
import yaml
from webshop_helpers import raw

from agentrl_ext.env.data_files import DataError
from envs.webshop.catalogue import Catalogue, load_catalogue
from envs.webshop.env import Episode, Page, Shop
from envs.webshop.goals import Goal, goals_by_product, split_goals
from envs.webshop.prompts import TOOLS
from envs.webshop.reward import attribute_matches, option_matches, purchase_reward, type_score
from envs.webshop.task import WebShopTask

# ---------------------------------------------------------------------------- AgentBench-FC


def test_tools_turn_limit_and_concurrency_are_agentbench_fc_on_cpu(webshop_data_dir: Path):
    config = yaml.safe_load((webshop_data_dir / "agentbench/configs/tasks/webshop.yaml").read_text())
    parameters = config["default"]["parameters"]
    assert TOOLS == parameters["tools"]
    assert inspect.signature(WebShopTask).parameters["max_round"].default == parameters["round"] == 20
    assert WebShopTask.concurrency == parameters["concurrency"] == 64


# ---------------------------------------------------------------------------- catalogue


def test_catalogue_is_read_as_webshop_reads_it_on_cpu(catalogue: Catalogue, webshop_data_dir: Path):
    products = raw(webshop_data_dir, "items_shuffle_1000.reconstructed.json")
    attributes = raw(webshop_data_dir, "items_ins_v2_1000.json")
    assert [p.asin for p in catalogue.products] == [p["asin"] for p in products]
    assert sum(p.attributes != ("DUMMY_ATTR",) for p in catalogue.products) == sum(
        "attributes" in attributes.get(p["asin"], {}) for p in products
    )
    first = catalogue.by_asin["B06Y3VLDFB"]  # "$877.8", no options
    assert (first.price_tag, first.pricing, first.options) == ("$877.8", (877.8,), {})
    assert catalogue.prices["B06Y3VLDFB"] == 877.8
    ranged = next(p for p in products if " - " in p["pricing"])
    low, high = (float(x.strip().lstrip("$")) for x in ranged["pricing"].split(" - "))
    product = catalogue.by_asin[ranged["asin"]]
    assert product.price_tag == f"${low} to ${high}" and low <= catalogue.prices[product.asin] <= high
    unpriced = next(p for p in products if not p["pricing"])
    assert catalogue.by_asin[unpriced["asin"]].price_tag == "$100.0"
    with_options = next(
        p for p in products if p["customization_options"] and None not in p["customization_options"].values()
    )
    name, contents = next(iter(with_options["customization_options"].items()))
    none_option = next(
        p for p in products if p["customization_options"] and None in p["customization_options"].values()
    )
    assert len(catalogue.by_asin[none_option["asin"]].options) == sum(
        v is not None for v in none_option["customization_options"].values()
    )
    assert catalogue.by_asin[with_options["asin"]].options[name.lower()] == tuple(
        c["value"].strip().replace("/", " | ").lower() for c in contents
    )
    # a range's price is seeded: the same at every load, another with another seed
    assert load_catalogue(webshop_data_dir).prices == catalogue.prices
    assert load_catalogue(webshop_data_dir, seed=1).prices[product.asin] != catalogue.prices[product.asin]


# ---------------------------------------------------------------------------- goals and split


def test_goals_are_webshops_synthetic_and_human_goals_on_cpu(catalogue: Catalogue, webshop_data_dir: Path):
    products = {p["asin"]: p for p in raw(webshop_data_dir, "items_shuffle_1000.reconstructed.json")}
    attributes = raw(webshop_data_dir, "items_ins_v2_1000.json")
    human = raw(webshop_data_dir, "items_human_ins.subset1000.json")
    combinations = 0
    for asin, entry in attributes.items():
        if entry.get("instruction") and asin in products:
            sizes = [
                len(v) for v in (products[asin]["customization_options"] or {}).values() if v is not None
            ]
            combinations += len(list(itertools.product(*(range(n) for n in sizes))))
    by_product = goals_by_product(catalogue)
    assert sum(len(s) for _, s in by_product.values()) == combinations == 6910
    assert sum(len(h) for h, _ in by_product.values()) == sum(
        bool(i["instruction_attributes"]) for v in human.values() for i in v
    )
    # a synthetic goal with two options, and its price bound (two of the four multiples of 10 above)
    goal = next(g for _, s in by_product.values() for g in s if len(g.goal_options) == 2)
    entry = attributes[goal.asin]
    (k1, v1), (k2, v2) = sorted(goal.goal_options.items())  # type: ignore[union-attr]
    assert goal.instruction_text == (
        f"{entry['instruction']} with {k1}: {v1}, and {k2}: {v2}, and price lower than {goal.price_upper:.2f} dollars"
    )
    price = catalogue.prices[goal.asin]
    assert goal.price_upper in [10.0 * i for i in range(1, 100) if 10.0 * i > price][1:4]
    assert goal.attributes == tuple(entry["instruction_attributes"])
    # a human goal: the instruction without its final '.', plus the price text
    asin, (humans, _) = next((a, g) for a, g in by_product.items() if g[0])
    text = human[asin][0]["instruction"].strip(".")
    assert humans[0].instruction_text.startswith(text) and humans[0].kind == "human"
    assert humans[0].goal_options == tuple(human[asin][0]["instruction_options"])


def test_split_is_deterministic_product_disjoint_and_seeded_on_cpu(catalogue: Catalogue):
    test, train = split_goals(catalogue, "test"), split_goals(catalogue, "train")
    assert split_goals(catalogue, "test") == test and split_goals(catalogue, "train") == train
    by_product = goals_by_product(catalogue)
    test_asins = {g.asin for g in test}
    assert not test_asins & {g.asin for g in train}
    assert len(test_asins) == round(0.2 * len(by_product))
    for asin in test_asins:  # every human goal, at most 3 synthetic ones
        humans, synthetic = by_product[asin]
        mine = [g for g in test if g.asin == asin]
        assert [g for g in mine if g.kind == "human"] == humans
        assert len([g for g in mine if g.kind == "synthetic"]) == min(3, len(synthetic))
    assert len(train) == sum(len(h) + len(s) for a, (h, s) in by_product.items() if a not in test_asins)
    other = split_goals(catalogue, "test", seed=1)
    assert {g.asin for g in other} != test_asins
    with pytest.raises(ValueError, match="unknown WebShop split 'dev'"):
        split_goals(catalogue, "dev")


# ---------------------------------------------------------------------------- search


def test_search_ranks_the_goals_own_product_high_on_cpu(catalogue: Catalogue, shop: Shop):
    goals = split_goals(catalogue, "test")
    ranks = []
    for goal in goals:
        hits = [p.asin for p in shop.search(goal.instruction_text.lower())]
        ranks.append(hits.index(goal.asin) + 1 if goal.asin in hits else None)
        assert len(hits) <= 50
    on_first_page = sum(r is not None and r <= 10 for r in ranks) / len(goals)
    in_results = sum(r is not None for r in ranks) / len(goals)
    assert on_first_page >= 0.8 and in_results >= 0.9, (on_first_page, in_results)
    # its own title finds a product first, almost always
    first = sum(shop.search(p.name.lower())[0].asin == p.asin for p in catalogue.products[:200])
    assert first >= 190, first
    assert shop.search("zzzz qqqq") == []


# ---------------------------------------------------------------------------- reward


def _goal(catalogue: Catalogue, **changes) -> Goal:
    goal = next(g for _, s in goals_by_product(catalogue).values() for g in s)
    return dataclasses.replace(goal, **changes)


def test_reward_rules_match_webshops_own_tests_on_cpu(catalogue: Catalogue):
    product = catalogue.products[0]
    tea = dataclasses.replace(
        product,
        attributes=("tea tree", "essential oil", "natural ingredients"),
        name="",
        bullet_points=(),
        description="",
    )
    goal = _goal(catalogue, attributes=("tea tree", "essential oils", "natural ingredients"))
    assert attribute_matches(tea, goal) == 3
    partial = dataclasses.replace(tea, attributes=("essential oil", "natural ingredients"))
    assert attribute_matches(partial, goal) == 2
    in_texts = dataclasses.replace(
        tea,
        attributes=(),
        bullet_points=("This shampoo has essential oils and smells like lemons",),
        description="Best shampoo on the market, made with natural ingredients",
    )
    assert attribute_matches(in_texts, goal) == 2
    lipton = dataclasses.replace(
        tea,
        attributes=("tea bag", "earl gray", "lipton"),
        name="English tea for breakfast",
        bullet_points=("Soothing aroma", "Calming, great feeling"),
        description="Best tea made by Lipton, great to pair with breakfast",
    )
    assert attribute_matches(lipton, goal) == 0
    options = _goal(catalogue, goal_options=("grey", "XL", "pack of 12"))
    assert option_matches(["pack of 12", "grey", "XL"], options) == 3
    assert option_matches(["pack of 12", "blue", "XL"], options) == 2
    fuzzy = _goal(catalogue, goal_options=("cool powder snow", "XL", "pack of 12"))
    assert option_matches(["pack of 12", "powder snow", "XL"], fuzzy) == 3


def test_type_score_on_cpu(catalogue: Catalogue):
    product = dataclasses.replace(
        catalogue.products[0], query="query 1", product_category="a › b › c", name="Name 1"
    )
    goal = _goal(catalogue, query="query 1", product_category="a › b › c", name="Name 1")
    exact = type_score(product, goal)
    assert (exact.r_type, exact.query_match, exact.category_match, exact.title_score) == (
        1.0,
        True,
        True,
        1.0,
    )
    assert type_score(dataclasses.replace(product, product_category="b › c › a"), goal).category_match
    assert not type_score(dataclasses.replace(product, product_category="d › e › f"), goal).category_match
    assert type_score(dataclasses.replace(product, product_category="a › d › b"), goal).category_match
    assert not type_score(dataclasses.replace(product, product_category="a › a › d"), goal).category_match
    # nothing in common: the reward is 0 whatever else matches
    knob = dataclasses.replace(goal, name="Rusticware 921ORB Kitchen and Bath Cabinet Knob", query="knobs")
    tweezers = dataclasses.replace(
        product,
        name="Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne Remover Portable Makeup Tweezers (Silver)",
        query="tweezers",
        product_category="x › y",
    )
    assert type_score(tweezers, knob).r_type == 0.0


def test_purchase_reward_adds_up_on_cpu(catalogue: Catalogue):
    goal = next(g for g in split_goals(catalogue, "test") if len(g.goal_options) == 2)
    product = catalogue.by_asin[goal.asin]
    price = catalogue.prices[goal.asin]
    n_attributes = len(goal.attributes)
    bare = purchase_reward(product, price, {}, goal)  # no option selected
    assert bare.reward == pytest.approx((n_attributes + 0 + 1) / (n_attributes + 2 + 1))
    too_dear = purchase_reward(product, goal.price_upper + 1, {}, goal)
    assert too_dear.reward == pytest.approx(n_attributes / (n_attributes + 2 + 1)) and not too_dear.r_price


# ---------------------------------------------------------------------------- pages and actions


def _episode(shop: Shop, catalogue: Catalogue) -> tuple[Episode, Goal]:
    goal = next(g for g in split_goals(catalogue, "test") if len(g.goal_options) == 2)
    return Episode(shop, goal), goal


def test_pages_in_simple_text_mode_on_cpu(shop: Shop, catalogue: Catalogue):
    episode, goal = _episode(shop, catalogue)
    instruction = goal.instruction_text
    assert episode.observation == f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search"
    assert episode.available_actions() == {"has_search_bar": True, "clickables": ["search"]}
    product = catalogue.by_asin[goal.asin]
    episode.step(f"search[{product.name}]")
    hits = shop.search(product.name.lower())[:10]
    expected = f"Instruction: [SEP] {instruction} [SEP] Back to Search [SEP] Page 1 (Total results: "
    expected += f"{len(shop.search(product.name.lower()))}) [SEP] Next >"
    expected += "".join(f" [SEP] {p.asin} [SEP] {p.name} [SEP] {p.price_tag}" for p in hits)
    assert episode.observation == expected
    assert episode.available_actions()["clickables"] == ["back to search", "next >"] + [
        p.asin.lower() for p in hits
    ]
    episode.step(f"click[{goal.asin.lower()}]")
    option_texts = "".join(f" [SEP] {name} [SEP] " + " [SEP] ".join(v) for name, v in product.options.items())
    assert episode.observation == (
        f"Instruction: [SEP] {instruction} [SEP] Back to Search [SEP] < Prev{option_texts} [SEP] {product.name}"
        f" [SEP] Price: {product.price_tag} [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews"
        " [SEP] Buy Now"
    )
    values = [v for vs in product.options.values() for v in vs]
    assert episode.available_actions()["clickables"] == [
        "back to search",
        "< prev",
        "description",
        "features",
        "reviews",
        "buy now",
        *dict.fromkeys(values),
    ]
    episode.step("click[Features]")
    bullets = "".join(f" [SEP] {b.strip()}" for b in product.bullet_points if b.strip())
    assert (
        episode.observation == f"Instruction: [SEP] {instruction} [SEP] Back to Search [SEP] < Prev{bullets}"
    )
    episode.step("click[< Prev]")
    assert episode.page is Page.ITEM and episode.asin == goal.asin


def test_actions_navigate_as_webshop_does_on_cpu(shop: Shop, catalogue: Catalogue):
    episode, goal = _episode(shop, catalogue)
    start = episode.observation
    # invalid: nothing happens
    for action in ("click[buy now]", "click[search]", "search[]", "look around", "click[< prev]"):
        assert episode.step(action) == (0.0, False) and episode.observation == start
    episode.step("search[shoes]")
    assert "< prev" not in episode.available_actions()["clickables"]
    episode.step("click[Next >]")
    assert "Page 2 (Total results:" in episode.observation
    assert "< prev" in episode.available_actions()["clickables"]
    episode.step("click[< Prev]")
    assert "Page 1 (Total results:" in episode.observation
    # options are forgotten by "< Prev" from the item page; "Back to Search" forgets everything
    episode.step(f"search[{catalogue.by_asin[goal.asin].name}]")
    episode.step(f"click[{goal.asin}]")
    first_value = goal.option_values[0]
    episode.step(f"click[{first_value}]")
    assert episode.options == {next(iter(sorted(goal.goal_options))): first_value}
    episode.step("search[anything]")  # a search runs from any page
    assert episode.page is Page.RESULTS and episode.options == {}
    episode.step("click[Back to Search]")
    assert episode.observation == start
    # buying ends the episode with the reward
    episode.step(f"search[{catalogue.by_asin[goal.asin].name}]")
    episode.step(f"click[{goal.asin}]")
    for value in goal.option_values:
        episode.step(f"click[{value}]")
    reward, done = episode.step("click[Buy Now]")
    assert done and episode.done and reward == episode.reward.reward  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- settings


def test_missing_data_and_bad_settings_are_named_on_cpu(tmp_path: Path, webshop_data_dir: Path):
    with pytest.raises(
        DataError, match=r"webshop/items_shuffle_1000\.reconstructed\.json\.xz .*agentrl-data install"
    ):
        WebShopTask(data_dir=tmp_path)
    with pytest.raises(ValueError, match="on_invalid_action='ignore'"):
        WebShopTask(data_dir=webshop_data_dir, on_invalid_action="ignore")
    with pytest.raises(ValueError, match="max_round must be >= 1"):
        WebShopTask(data_dir=webshop_data_dir, max_round=0)
    with pytest.raises(ValueError, match="test_fraction must be in"):
        WebShopTask(data_dir=webshop_data_dir, test_fraction=1.5)
    task = WebShopTask(data_dir=webshop_data_dir, split="std", limit=3)
    assert task.split == "test" and task.get_indices() == [0, 1, 2]
    # the offline catalogue is not AgentBench's webshop-std, and its results say so
    overall = task.calculate_overall([])
    assert (overall["benchmark"], overall["invalid_action_rule"]) == ("webshop-offline", "feedback")
