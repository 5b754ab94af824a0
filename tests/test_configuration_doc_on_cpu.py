"""docs/configuration.md is generated from the config dataclasses and kept in sync with them."""

from __future__ import annotations

from agentrl_ext.config import configuration_markdown, describe_keys
from agentrl_ext.testing.env_servers import REPO


def test_configuration_doc_matches_the_dataclasses_on_cpu():
    doc = (REPO / "docs" / "configuration.md").read_text()
    assert doc == configuration_markdown(), "regenerate: python -m agentrl_ext.config > docs/configuration.md"
    for key, default, _meaning in describe_keys():
        assert f"| `{key}` | `{default}` |" in doc
