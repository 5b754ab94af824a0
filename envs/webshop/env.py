"""WebShop's text environment (1000-product mode): pages, clickables, actions, observations.

The behaviour of WebShop's ``WebAgentTextEnv`` with ``observation_mode="text"`` (the *simple*
mode; princeton-nlp/WebShop @ 64fa2a5, ``web_agent_site/envs/web_agent_text_env.py``), as
AgentBench runs it, without the Flask templates and the HTML round trip:

- pages: start (search box), search results (10 a page of the top 50, ``Next >`` always shown,
  ``< Prev`` from page 2), item (options, ``Description``, ``Features``, ``Reviews``,
  ``Buy Now``), the description / features / reviews views, and done;
- the observation is the page's visible texts joined by `` [SEP] `` (what WebShop gets by
  rendering the page's HTML and keeping BeautifulSoup's visible strings); option selections do
  not show in this mode;
- the available actions are ``{'has_search_bar': bool, 'clickables': [...]}``: the buttons
  (lower-cased), then the product ASINs (lower-cased), then the option values of the page;
- an action is ``search[keywords]`` or ``click[value]``, parsed with WebShop's pattern and
  lower-cased. A search runs from any page. A click on a value that is not clickable on the
  page (or on ``search``) does nothing: same page, reward 0, not done;
- ``Back to Search`` forgets the search, the product and the options; ``< Prev`` on an item
  page goes back to its results page and forgets the selected options; ``Buy Now`` ends the
  episode with the reward of :mod:`.reward` for the product, its price and the selected options.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .catalogue import Catalogue, Product
from .goals import Goal
from .reward import Reward, purchase_reward, title_words
from .search import ProductSearch, Searcher

PRODUCT_WINDOW = 10
END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
"""The item's views; ``Attributes`` is never offered (WebShop's ``show_attrs=False``)."""
_ACTION = re.compile(r"(.+)\[(.+)\]")


def parse_action(action: str) -> tuple[str, str | None]:
    """``search[x]`` -> ("search", "x"); text without brackets -> (text, None) (WebShop's pattern)."""
    match = _ACTION.match(action)
    if match is None:
        return action, None
    return match.group(1), match.group(2)


def simple_text(texts: list[str]) -> str:
    """Visible strings joined by `` [SEP] `` as WebShop's simple mode does.

    An empty value makes no HTML text node and no segment; a whitespace-only one with a line break
    is what BeautifulSoup reports as ``"\\n"``, which WebShop skips; any other is stripped.
    """
    parts = []
    for text in texts:
        if not text or (not text.strip() and "\n" in text):
            continue
        parts.append(text.strip())
    return " [SEP] ".join(parts)


class Page(Enum):
    START = "start"
    RESULTS = "search_results"
    ITEM = "item_page"
    SUB = "item_sub_page"
    DONE = "done"


@dataclass(frozen=True)
class Clickable:
    """What a clickable value is on the current page."""

    kind: str
    """``button``, ``product`` or ``option``."""
    option_name: str | None = None


class Shop:
    """What all episodes share: the catalogue, its search engine (default: BM25 over the texts
    WebShop indexes, :class:`.search.ProductSearch`) and the title words of the type score
    (default: :func:`.reward.title_words`)."""

    def __init__(
        self,
        catalogue: Catalogue,
        search_engine: Searcher | None = None,
        title_words: Callable[[str], list[str]] = title_words,
    ) -> None:
        self.catalogue = catalogue
        self.search_engine: Searcher = search_engine or ProductSearch(
            [p.search_text for p in catalogue.products]
        )
        self.title_words = title_words

    def search(self, keywords: str) -> list[Product]:
        """The top hits for ``keywords`` (WebShop keeps 50)."""
        products = self.catalogue.products
        return [products[i] for i in self.search_engine.search(keywords)]


@dataclass
class Episode:
    """One shopper's session on the shop, for one goal."""

    shop: Shop
    goal: Goal
    page: Page = Page.START
    keywords: str | None = None
    results: list[Product] = field(default_factory=list)
    page_number: int = 1
    asin: str | None = None
    sub_page: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    reward: Reward | None = None
    counts: dict[str, int] = field(default_factory=lambda: {"search": 0, "click": 0, "invalid": 0})

    @property
    def done(self) -> bool:
        return self.page is Page.DONE

    @property
    def product(self) -> Product:
        assert self.asin is not None, "no product page is open"
        return self.shop.catalogue.by_asin[self.asin]

    # ------------------------------------------------------------------ what the agent sees

    def _header(self) -> list[str]:
        return ["Instruction:", self.goal.instruction_text, BACK_TO_SEARCH]

    def _texts(self) -> list[str]:
        if self.page is Page.START:
            return ["WebShop", "Instruction:", self.goal.instruction_text, "Search"]
        if self.page is Page.RESULTS:
            texts = [*self._header(), f"Page {self.page_number} (Total results: {len(self.results)})"]
            texts += [PREV_PAGE, NEXT_PAGE] if self.page_number > 1 else [NEXT_PAGE]
            for product in self._page_products():
                texts += [product.asin, product.name, product.price_tag]
            return texts
        if self.page is Page.ITEM:
            product = self.product
            texts = [*self._header(), PREV_PAGE]
            for name, values in product.options.items():
                texts += [name, *values]
            texts += [product.name, f"Price: {product.price_tag}", f"Rating: {product.rating}"]
            return [*texts, *SUB_PAGES[:3], END_BUTTON]
        if self.page is Page.SUB:
            product = self.product
            texts = [*self._header(), PREV_PAGE]
            if self.sub_page == "Description":
                texts.append(product.description)
            elif self.sub_page == "Features":
                texts += [f" {point}" for point in product.bullet_points]
            elif self.sub_page == "Attributes":
                texts += [f" {a}" for a in product.attributes]
                texts += [product.category, product.query, product.product_category]
            return texts  # Reviews: the 1000-product mode has none
        assert self.reward is not None
        return ["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", str(self.reward.reward)]

    @property
    def observation(self) -> str:
        """The current page in WebShop's simple text mode."""
        return simple_text(self._texts())

    def clickables(self) -> dict[str, Clickable]:
        """Clickable value -> what it is, in WebShop's order (a later duplicate wins, as there)."""
        buttons: list[str] = []
        if self.page is Page.START:
            buttons = ["Search"]
        elif self.page is Page.RESULTS:
            buttons = [BACK_TO_SEARCH, *([PREV_PAGE] if self.page_number > 1 else []), NEXT_PAGE]
        elif self.page is Page.ITEM:
            buttons = [BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES[:3], END_BUTTON]
        elif self.page is Page.SUB:
            buttons = [BACK_TO_SEARCH, PREV_PAGE]
        out = {b.lower(): Clickable("button") for b in buttons}
        if self.page is Page.RESULTS:
            out.update({p.asin.lower(): Clickable("product") for p in self._page_products()})
        if self.page is Page.ITEM:
            for name, values in self.product.options.items():
                out.update({value: Clickable("option", name) for value in values})
        return out

    def available_actions(self) -> dict[str, Any]:
        """``{'has_search_bar': ..., 'clickables': [...]}`` as AgentBench shows it."""
        return {"has_search_bar": self.page is Page.START, "clickables": list(self.clickables())}

    def _page_products(self) -> list[Product]:
        start = (self.page_number - 1) * PRODUCT_WINDOW
        return self.results[max(start, 0) : start + PRODUCT_WINDOW]

    # ------------------------------------------------------------------ actions

    def step(self, action: str) -> tuple[float, bool]:
        """Run ``search[...]`` or ``click[...]``; returns (reward, done). Invalid: nothing happens."""
        name, argument = parse_action(action)
        if argument is not None:
            argument = argument.lower()
        if self.done:
            self.counts["invalid"] += 1
            return 0.0, True
        if name == "search" and argument:
            self.counts["search"] += 1
            self._show_results(argument, 1)
            return 0.0, False
        clickables = self.clickables()
        if name == "click" and argument is not None and argument in clickables and argument != "search":
            self.counts["click"] += 1
            return self._click(argument, clickables[argument])
        self.counts["invalid"] += 1
        return 0.0, False

    def _show_results(self, keywords: str, page_number: int) -> None:
        if keywords != self.keywords or self.page is Page.START:
            self.results = self.shop.search(keywords)
        self.keywords, self.page_number = keywords, page_number
        self.page, self.asin, self.options, self.sub_page = Page.RESULTS, None, {}, None

    def _click(self, value: str, clickable: Clickable) -> tuple[float, bool]:
        if value == END_BUTTON.lower():
            return self._buy(), True
        if value == BACK_TO_SEARCH.lower():
            self.page, self.keywords, self.results = Page.START, None, []
            self.page_number, self.asin, self.options, self.sub_page = 1, None, {}, None
        elif value == NEXT_PAGE.lower() and self.page is Page.RESULTS:
            self._show_results(self.keywords or "", self.page_number + 1)
        elif value == PREV_PAGE.lower() and self.page is Page.RESULTS:
            self._show_results(self.keywords or "", self.page_number - 1)
        elif value == PREV_PAGE.lower() and self.page is Page.SUB:
            self.page, self.sub_page = Page.ITEM, None
        elif value == PREV_PAGE.lower() and self.page is Page.ITEM:
            self._show_results(self.keywords or "", self.page_number)
        elif value in (s.lower() for s in SUB_PAGES):
            self.page, self.sub_page = Page.SUB, next(s for s in SUB_PAGES if s.lower() == value)
        else:
            if clickable.kind == "product":
                self.asin = value.upper()
            elif clickable.kind == "option":
                assert clickable.option_name is not None
                self.options[clickable.option_name] = value
            self.page, self.sub_page = Page.ITEM, None
        return 0.0, False

    def _buy(self) -> float:
        product = self.product
        price = self.shop.catalogue.prices[product.asin]
        self.reward = purchase_reward(product, price, self.options, self.goal, self.shop.title_words)
        self.page = Page.DONE
        return self.reward.reward
