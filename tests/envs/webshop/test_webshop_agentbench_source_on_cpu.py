"""webshop with ``source="agentbench"``: AgentBench's WebShop goals on the user's own WebShop data.

The data is written here in WebShop's original formats (``items_shuffle.json``: a list of
products; ``items_ins_v2.json`` and ``items_human_ins.json``: objects keyed by ASIN), small. What
is expected comes from WebShop's rules written out here, not from the code under test: the human
goals are every human instruction with attributes, product by product in file order (a product
whose ASIN is ``nan``, longer than 10 characters or repeated is skipped), shuffled by
``random.seed(233); random.shuffle(goals)`` as WebShop's ``SimServer`` does; AgentBench's index
``i`` is position ``i``; the instruction is WebShop's text without its final ``.`` plus
``", and price lower than X.00 dollars"`` with X the larger of two of the (up to) four multiples
of 10 above the price. Pyserini and spaCy are not installed here: their adapters are checked
against stand-ins with their interfaces.
"""

from __future__ import annotations

import json
import random
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from webshop_helpers import WEBSHOP_TASK, RawClient, available_actions

from agentrl_ext.env.data_files import DataError
from agentrl_ext.env.protocol import SampleStatus, TaskOutput
from agentrl_ext.testing.env_servers import EnvServers
from envs.webshop.task import WebShopTask


def product(asin: str, name: str, price: str, options: dict[str, list[str]], query: str) -> dict[str, Any]:
    """One product as ``items_shuffle.json`` holds it."""
    return {
        "asin": asin,
        "name": name,
        "full_description": f"The {name.lower()}, made to last.",
        "small_description": [f"{name} for every day"],
        "pricing": price,
        "customization_options": {k: [{"value": v, "image": None} for v in vs] for k, vs in options.items()},
        "category": "beauty",
        "query": query,
        "product_category": "Home › Kitchen › Drinkware",
        "images": ["https://example.invalid/1.jpg"],
        "brand": "dropped by WebShop's clean_product_keys",
    }


PRODUCTS = [
    product(
        "B0BOTTLE01", "Stainless Steel Water Bottle", "$12.99", {"Color": ["Blue", "Red"]}, "water bottle"
    ),
    product("nan", "skipped: asin nan", "$1.00", {}, "x"),
    product("B0HAT00002", "Wool Winter Hat", "$21.50", {"Size": ["Small", "Large"]}, "winter hat"),
    product("B0BOTTLE01", "skipped: repeated asin", "$2.00", {}, "x"),
    product("B0CHAIR003", "Leather Office Chair", "$149.00", {}, "office chair"),
    product("B0MUG00004", "Ceramic Coffee Mug", "$8.00", {"Color": ["White"]}, "coffee mug"),
]
ATTRIBUTES = {
    "B0BOTTLE01": {"attributes": ["stainless steel", "leak proof"], "instruction": "i want a bottle"},
    "B0HAT00002": {"attributes": ["wool"]},
    "B0CHAIR003": {"attributes": ["leather"]},
    "B0MUG00004": {"attributes": ["dishwasher safe"]},
}
HUMAN = {
    "B0BOTTLE01": [
        {
            "instruction": "i need a blue stainless steel bottle.",
            "instruction_attributes": ["stainless steel"],
            "instruction_options": ["blue"],
        },
        {"instruction": "a bottle please", "instruction_attributes": [], "instruction_options": []},
        {
            "instruction": "red leak proof bottle.",
            "instruction_attributes": ["leak proof"],
            "instruction_options": ["red"],
        },
    ],
    "B0HAT00002": [
        {
            "instruction": "large wool hat for winter.",
            "instruction_attributes": ["wool"],
            "instruction_options": ["large"],
        },
        {
            "instruction": "a small wool hat",
            "instruction_attributes": ["wool"],
            "instruction_options": ["small"],
        },
    ],
    "B0CHAIR003": [
        {
            "instruction": "leather chair for my office.",
            "instruction_attributes": ["leather"],
            "instruction_options": [],
        },
    ],
    "B0MUG00004": [
        {
            "instruction": "white dishwasher safe mug.",
            "instruction_attributes": ["dishwasher safe"],
            "instruction_options": ["white"],
        },
        {"instruction": "mug", "instruction_attributes": [], "instruction_options": []},
    ],
}
PRICES = {"B0BOTTLE01": 12.99, "B0HAT00002": 21.50, "B0CHAIR003": 149.0, "B0MUG00004": 8.0}
NAMES = {p["asin"]: p["name"] for p in PRODUCTS if not p["name"].startswith("skipped")}


def expected_goals() -> list[tuple[str, str, tuple[str, ...]]]:
    """(ASIN, instruction without '.', options) in AgentBench's index order (WebShop's rule)."""
    goals = [
        (asin, entry["instruction"].strip("."), tuple(entry["instruction_options"]))
        for asin in ("B0BOTTLE01", "B0HAT00002", "B0CHAIR003", "B0MUG00004")  # file order, skips out
        for entry in HUMAN[asin]
        if entry["instruction_attributes"]
    ]
    state = random.getstate()
    try:
        random.seed(233)
        random.shuffle(goals)
    finally:
        random.setstate(state)
    return goals


@pytest.fixture(scope="module")
def webshop_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("webshop-data")
    for name, content in (
        ("items_shuffle.json", PRODUCTS),
        ("items_ins_v2.json", ATTRIBUTES),
        ("items_human_ins.json", HUMAN),
    ):
        (folder / name).write_text(json.dumps(content))
    return folder


def test_goals_are_agentbenchs_human_goals_in_its_index_order_on_cpu(webshop_data: Path):
    task = WebShopTask(source="agentbench", webshop_data=str(webshop_data), split="std")
    expected = expected_goals()
    assert len(expected) == 6 and task.get_indices() == list(range(6))  # std is 0..199: all six
    for index, (asin, instruction, options) in enumerate(expected):
        goal = task.goal(index)
        assert (goal.asin, goal.kind, tuple(goal.goal_options)) == (asin, "human", options)
        text = goal.instruction_text
        assert text.startswith(instruction + ", and price lower than "), text
        bound = float(re.fullmatch(r".*, and price lower than (\d+\.\d\d) dollars", text)[1])
        above = [10.0 * i for i in range(1, 100) if 10.0 * i > PRICES[asin]][:4]
        assert bound in above[1:] and goal.price_upper == bound, (text, above)
    # the skipped products are not in the catalogue; the others keep their file order
    assert [p.asin for p in task.shop.catalogue.products] == list(NAMES)
    # dev (200..279) and env_train (1000..11999) need WebShop's full data
    with pytest.raises(ValueError, match=r"wants goals 1000\.\.11999, but .* gives 6 human goals"):
        WebShopTask(source="agentbench", webshop_data=str(webshop_data), split="train")


def test_label_says_what_stands_in_for_lucene_and_spacy_on_cpu(webshop_data: Path, monkeypatch):
    task = WebShopTask(source="agentbench", webshop_data=str(webshop_data), split="std")
    overall = task.calculate_overall(
        [TaskOutput(index=0, status=SampleStatus.COMPLETED, result={"reward": 1.0})]
    )
    assert overall["benchmark"] == "webshop-full-std-bm25-nospacy"
    assert overall["invalid_action_rule"] == "feedback"
    # WebShop's own search and type score, through stand-ins of pyserini's and spaCy's interfaces
    index_dir = webshop_data / "indexes"
    index_dir.mkdir(exist_ok=True)
    searched: list[tuple[str, int]] = []

    class Hit:
        def __init__(self, docid: str) -> None:
            self.docid = docid

    class Doc:
        def __init__(self, raw: str) -> None:
            self._raw = raw

        def raw(self) -> str:
            return self._raw

    class LuceneSearcher:
        def __init__(self, path: str) -> None:
            assert path == str(index_dir)

        def search(self, query: str, k: int = 10) -> list[Hit]:
            searched.append((query, k))
            return [Hit("d1"), Hit("d2"), Hit("d3")]  # an ASIN outside the catalogue is dropped

        def doc(self, docid: str) -> Doc:
            asin = {"d1": "B0MUG00004", "d2": "B0NOTHERE9", "d3": "B0HAT00002"}[docid]
            return Doc(json.dumps({"id": asin, "contents": "..."}))

    class Token:
        def __init__(self, text: str, pos: str) -> None:
            self.text, self.pos_ = text, pos

    def load(model: str) -> Any:
        assert model == "en_core_web_lg"  # AgentBench's patch of WebShop's goal.py
        return lambda text: [Token(w, "NOUN" if w[0].isupper() else "ADJ") for w in text.split()]

    lucene = types.ModuleType("pyserini.search.lucene")
    lucene.LuceneSearcher = LuceneSearcher  # type: ignore[attr-defined]
    spacy = types.ModuleType("spacy")
    spacy.load = load  # type: ignore[attr-defined]
    for name, module in (
        ("pyserini", types.ModuleType("pyserini")),
        ("pyserini.search", types.ModuleType("pyserini.search")),
        ("pyserini.search.lucene", lucene),
        ("spacy", spacy),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    exact = WebShopTask(
        source="agentbench",
        webshop_data=str(webshop_data),
        split="std",
        search="lucene",
        lucene_index=str(index_dir),
        title_nouns="spacy",
    )
    assert exact.calculate_overall([])["benchmark"] == "webshop-std"
    assert [p.asin for p in exact.shop.search("coffee mug")] == ["B0MUG00004", "B0HAT00002"]
    assert searched == [("coffee mug", 50)]  # WebShop's SEARCH_RETURN_N
    assert exact.shop.title_words("Ceramic Coffee mug") == ["ceramic", "coffee"]  # the nouns, lower-cased
    lucene_only = WebShopTask(
        source="agentbench", webshop_data=str(webshop_data), search="lucene", lucene_index=str(index_dir)
    )
    assert lucene_only.calculate_overall([])["benchmark"] == "webshop-full-std-nospacy"


def test_missing_data_and_tools_are_named_on_cpu(tmp_path: Path, webshop_data: Path):
    with pytest.raises(ValueError, match="needs webshop_data"):
        WebShopTask(source="agentbench")
    with pytest.raises(DataError, match=r"items_shuffle\.json is missing.*setup\.sh -d all"):
        WebShopTask(source="agentbench", webshop_data=str(tmp_path))
    with pytest.raises(ValueError, match="expected one of"):
        WebShopTask(source="agentbench", webshop_data=str(webshop_data), split="nonsense")
    with pytest.raises(ValueError, match="needs lucene_index"):
        WebShopTask(source="agentbench", webshop_data=str(webshop_data), search="lucene")
    with pytest.raises(ValueError, match="is not a folder"):
        WebShopTask(
            source="agentbench",
            webshop_data=str(webshop_data),
            search="lucene",
            lucene_index=str(tmp_path / "none"),
        )
    if "pyserini" not in sys.modules:
        (tmp_path / "index").mkdir()
        with pytest.raises(ValueError, match="needs pyserini"):
            WebShopTask(
                source="agentbench",
                webshop_data=str(webshop_data),
                search="lucene",
                lucene_index=str(tmp_path / "index"),
            )


def test_a_worker_serves_agentbenchs_indices_and_the_goals_own_product_scores_1_on_cpu(
    tmp_path: Path, webshop_data: Path
):
    kwargs = {"source": "agentbench", "webshop_data": str(webshop_data), "split": "std"}
    expected = expected_goals()
    with EnvServers(tmp_path) as servers:
        controller = servers.controller()
        servers.worker(controller, WEBSHOP_TASK, name="webshop", task_kwargs=kwargs)
        servers.wait_routable(controller, "webshop", timeout_s=120)
        client = RawClient(controller.api)
        for index, (asin, instruction, options) in enumerate(expected):
            session, opening = client.start(index)
            assert (
                f"Instruction: [SEP] {instruction}, and price lower than" in opening["messages"][1]["content"]
            )
            results = client.search(session, NAMES[asin])
            assert asin.lower() in available_actions(results)["clickables"], results
            client.click(session, asin.lower())
            for value in options:
                client.click(session, value)
            done = client.click(session, "Buy Now")
            # the goal's own product, its options, under the bound: WebShop's reward is 1
            assert (done["status"], done["reward"]) == ("completed", 1.0), (index, done)
        # a wrong product: the chair for a goal that is not the chair's
        wrong = next(i for i, (asin, _, _) in enumerate(expected) if asin != "B0CHAIR003")
        session, _ = client.start(wrong)
        client.search(session, NAMES["B0CHAIR003"])
        client.click(session, "b0chair003")
        done = client.click(session, "Buy Now")
        assert done["status"] == "completed" and done["reward"] < 1.0, done
