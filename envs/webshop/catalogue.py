"""The 1000-product WebShop catalogue from the data directory.

Files (under ``<data dir>/webshop/``; see the data README §3):

| file | what | upstream name |
|---|---|---|
| ``items_shuffle_1000.reconstructed.json.xz`` | the 1000 products, upstream order and raw form | ``items_shuffle_1000.json`` (``DEFAULT_FILE_PATH``) |
| ``items_ins_v2_1000.json.xz`` | attributes and synthetic instructions by ASIN | ``items_ins_v2_1000.json`` (``DEFAULT_ATTR_PATH``) |
| ``items_human_ins.subset1000.json.xz`` | the human instructions of these products (13) | ``items_human_ins.json`` (``HUMAN_ATTR_PATH``) |

Products are read as WebShop's ``load_products`` reads them (princeton-nlp/WebShop @ 64fa2a5,
``web_agent_site/engine/engine.py``): ASINs that are ``nan``, longer than 10 characters or repeated
are skipped; the price string becomes a list of one or two floats (``[100.0]`` when empty) and the
tag shown on pages (``$a`` or ``$a to $b``); option names are lower-cased and option values
stripped, lower-cased, ``/`` replaced by `` | ``; products without attributes get
``['DUMMY_ATTR']``; there are no reviews, so every rating is ``N.A.``.

One difference, on purpose: WebShop draws the price of a product with a price range with the
process-global ``random.uniform`` (a new price at every start); here it is drawn from a generator
seeded by the catalogue seed and the ASIN, so a goal's price bound and reward are reproducible.
"""

from __future__ import annotations

import json
import lzma
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from agentrl_ext.env.data_files import DataError, require

PRODUCTS_FILE = "webshop/items_shuffle_1000.reconstructed.json.xz"
ATTRIBUTES_FILE = "webshop/items_ins_v2_1000.json.xz"
HUMAN_INSTRUCTIONS_FILE = "webshop/items_human_ins.subset1000.json.xz"
NO_ATTRIBUTES = ("DUMMY_ATTR",)
DEFAULT_PRICE = 100.0


@dataclass(frozen=True)
class Product:
    """One product as the simulator and the reward see it."""

    asin: str
    name: str
    """The product title (``Title`` = ``name`` upstream)."""
    description: str
    bullet_points: tuple[str, ...]
    pricing: tuple[float, ...]
    """One price, or the low and high end of a range."""
    price_tag: str
    """The price as pages show it: ``$19.99`` or ``$19.99 to $27.99``."""
    options: dict[str, tuple[str, ...]]
    """Option name -> values, in page order (e.g. ``{"size": ("small", ...), "color": (...)}``)."""
    attributes: tuple[str, ...]
    category: str
    query: str
    """The search query the product was scraped for (lower-cased)."""
    product_category: str
    """Amazon's category path, ``a › b › c``."""
    synthetic_instruction: str | None
    synthetic_attributes: tuple[str, ...]
    human_instructions: tuple[dict[str, Any], ...]
    rating: str = "N.A."

    @property
    def search_text(self) -> str:
        """The text WebShop indexes for search (``convert_product_file_format.py``: title,
        description, first bullet point and the options, lower-cased)."""
        options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.name, self.description, first_bullet, options]).lower()


def _read_json_xz(relative: str, data_dir: str | Path | None) -> Any:
    path = require(relative, data_dir)
    with lzma.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def parse_pricing(raw: str | None, where: str) -> tuple[tuple[float, ...], str]:
    """(prices, tag) of a price string as ``load_products`` reads it: ``$a`` or ``$a - $b``."""
    if not raw:
        return (DEFAULT_PRICE,), f"${DEFAULT_PRICE}"
    try:
        prices = [float(Decimal(re.sub(r"[^\d.]", "", piece))) for piece in raw.split("$")[1:]]
    except ArithmeticError as exc:
        raise DataError(f"{where}: price {raw!r} is not '$a' or '$a - $b'") from exc
    if not prices:
        raise DataError(f"{where}: price {raw!r} is not '$a' or '$a - $b'")
    if len(prices) == 1:
        return (prices[0],), f"${prices[0]}"
    return (prices[0], prices[1]), f"${prices[0]} to ${prices[1]}"


def _options(raw: Any) -> dict[str, tuple[str, ...]]:
    options: dict[str, tuple[str, ...]] = {}
    if not raw:  # "" or {} in the raw file
        return options
    for name, contents in raw.items():
        if contents is None:
            continue
        options[name.lower()] = tuple(
            content["value"].strip().replace("/", " | ").lower() for content in contents
        )
    return options


def _product(
    raw: dict[str, Any], attributes: dict[str, Any], human: dict[str, Any], source: str = PRODUCTS_FILE
) -> Product:
    asin = raw["asin"]
    where = f"{source} product {asin}"
    pricing, tag = parse_pricing(raw.get("pricing"), where)
    bullets = raw["small_description"]
    entry = attributes.get(asin, {})
    return Product(
        asin=asin,
        name=raw["name"],
        description=raw["full_description"],
        bullet_points=tuple(bullets) if isinstance(bullets, list) else (str(bullets),),
        pricing=pricing,
        price_tag=tag,
        options=_options(raw.get("customization_options")),
        attributes=tuple(entry["attributes"]) if "attributes" in entry else NO_ATTRIBUTES,
        category=raw["category"],
        query=raw["query"].lower().strip(),
        product_category=raw["product_category"],
        synthetic_instruction=entry.get("instruction"),
        synthetic_attributes=tuple(entry.get("instruction_attributes") or ()),
        human_instructions=tuple(human.get(asin, ())),
    )


@dataclass(frozen=True)
class Catalogue:
    """The products in catalogue order, by ASIN, and their prices."""

    products: tuple[Product, ...]
    by_asin: dict[str, Product]
    prices: dict[str, float]
    """The price the reward compares with a goal's bound (a range's price is drawn, seeded)."""


def product_price(product: Product, seed: int) -> float:
    """A product's price: its only price, or one drawn uniformly from its range (seeded by ASIN)."""
    if len(product.pricing) == 1:
        return product.pricing[0]
    return random.Random(f"webshop-price:{seed}:{product.asin}").uniform(*product.pricing[:2])


def load_catalogue(data_dir: str | Path | None = None, seed: int = 0) -> Catalogue:
    """Read and check the three catalogue files; DataError names a missing or corrupt one."""
    raw_products = _read_json_xz(PRODUCTS_FILE, data_dir)
    attributes = _read_json_xz(ATTRIBUTES_FILE, data_dir)
    human = _read_json_xz(HUMAN_INSTRUCTIONS_FILE, data_dir)
    return build_catalogue(raw_products, attributes, human, seed, PRODUCTS_FILE)


WEBSHOP_FILES = ("items_shuffle.json", "items_ins_v2.json", "items_human_ins.json")
"""WebShop's full data files (``web_agent_site/utils.py`` as AgentBench patches it: the whole
catalogue, its attributes, the human instructions), in WebShop's ``data/`` folder."""


def load_webshop_catalogue(webshop_data: str | Path, seed: int = 0) -> Catalogue:
    """The catalogue from the user's own copy of WebShop's full data (:data:`WEBSHOP_FILES`, plain
    JSON as WebShop's ``setup.sh -d all`` downloads them into ``data/``), read as ``load_products``
    reads them; DataError names a missing or unreadable file."""
    folder = Path(webshop_data).expanduser()
    loaded = []
    for name in WEBSHOP_FILES:
        path = folder / name
        if not path.is_file():
            raise DataError(
                f"WebShop data file {path} is missing: source='agentbench' needs WebShop's full data "
                f"({', '.join(WEBSHOP_FILES)}) in webshop_data={str(folder)!r}, as WebShop's "
                "'setup.sh -d all' downloads them (several GB; not available offline)"
            )
        try:
            with path.open(encoding="utf-8") as handle:
                loaded.append(json.load(handle))
        except (OSError, ValueError) as exc:
            raise DataError(f"WebShop data file {path} cannot be read as JSON: {exc}") from exc
    raw_products, attributes, human = loaded
    if not isinstance(raw_products, list) or not isinstance(attributes, dict) or not isinstance(human, dict):
        raise DataError(
            f"WebShop data in {folder}: expected a list of products in {WEBSHOP_FILES[0]} and objects "
            f"keyed by ASIN in {WEBSHOP_FILES[1]} and {WEBSHOP_FILES[2]} (WebShop's formats)"
        )
    return build_catalogue(raw_products, attributes, human, seed, str(folder / WEBSHOP_FILES[0]))


def build_catalogue(
    raw_products: list[dict[str, Any]],
    attributes: dict[str, Any],
    human: dict[str, Any],
    seed: int = 0,
    source: str = PRODUCTS_FILE,
) -> Catalogue:
    """The catalogue of WebShop's raw product list, attributes and human instructions."""
    products: list[Product] = []
    seen: set[str] = set()
    for raw in raw_products:
        asin = raw.get("asin")
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        try:
            products.append(_product(raw, attributes, human, source))
        except (KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"{source}: malformed product {asin} ({type(exc).__name__}: {exc})") from exc
    by_asin = {p.asin: p for p in products}
    return Catalogue(tuple(products), by_asin, {p.asin: product_price(p, seed) for p in products})
