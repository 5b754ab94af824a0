"""Helpers of the webshop tests: the raw files read on their own, and a raw AgentRL protocol client."""

from __future__ import annotations

import ast
import json
import lzma
import re
from pathlib import Path
from typing import Any

import httpx

from agentrl_ext.testing.raw_protocol import RawClient as ProtocolClient
from agentrl_ext.testing.raw_protocol import tool_call as call

WEBSHOP_TASK = "agentrl_ext.envs.webshop.task:WebShopTask"


def raw(data_dir: Path, name: str) -> Any:
    """A vendored WebShop file (``webshop/<name>.xz``), decompressed and parsed here."""
    with lzma.open(data_dir / "webshop" / f"{name}.xz", "rt", encoding="utf-8") as handle:
        return json.load(handle)


# WebShop's colour words (web_agent_site/engine/normalize.py), for the known quirk below.
COLOURS = """alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown
burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac
copper coral cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape
graphite grass gray green grey heather indigo ivory ivy khaki lavender lemon leopard light lilac lime
magenta maroon mauve merlot midnight mint mocha multicolor mushroom mustard natural navy nude olive
orange peach pewter pink plum purple rainbow red rose royal rust sand sapphire seashell silver skull
slate steel stone stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine
yellow""".split()


def colour_glued(value: str) -> bool:
    """WebShop reduces a selected option value to the first colour word it contains and compares
    that with the words of the goal's ``(name, value)`` pair: when that colour is only part of a
    word of the value (``black2626``, ``graywash``), even the goal's own option does not match."""
    colour = next((c for c in COLOURS if c in value), None)
    if colour is None or value == colour:
        return False
    words = re.sub(r"[^0-9a-z]+", " ", value.encode("ascii", "ignore").decode().lower()).split()
    return colour not in words


class RawClient(ProtocolClient):
    """The raw AgentRL protocol client (``agentrl_ext.testing.raw_protocol``) with webshop's tools."""

    def __init__(self, api: str, task: str = "webshop") -> None:
        super().__init__(api, task, timeout_s=60)

    def cancel(self, session_id: str) -> httpx.Response:
        response = super().cancel(session_id)
        assert response.status_code == 200, response.text
        return response

    def search(self, session_id: str, keywords: str) -> dict[str, Any]:
        return self.step(session_id, call("search_action", {"keywords": keywords}))

    def click(self, session_id: str, value: str) -> dict[str, Any]:
        return self.step(session_id, call("click_action", {"value": value}))


def available_actions(answer: dict[str, Any]) -> dict[str, Any]:
    """The ``Available Actions`` dict at the end of the latest observation message."""
    return ast.literal_eval(answer["messages"][-1]["content"].rsplit("Available Actions:\n", 1)[1])
