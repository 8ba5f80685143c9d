"""Config files: settings declared once as dataclass fields (`setting`), read from TOML with
``--set`` flags and line-numbered errors, and written back as the scaffold, the docs' tables
and a run's resolved config."""

from osmosis_ai.config.schema import (
    Key,
    Section,
    Setting,
    markdown_table,
    parse_section,
    scaffold_toml,
    section_of,
    setting,
    settings_toml,
    subsection,
    toml_value,
)
from osmosis_ai.config.source import ConfigSource, TOMLTable, did_you_mean, read_config

__all__ = [
    "ConfigSource",
    "Key",
    "Section",
    "Setting",
    "TOMLTable",
    "did_you_mean",
    "markdown_table",
    "parse_section",
    "read_config",
    "scaffold_toml",
    "section_of",
    "setting",
    "settings_toml",
    "subsection",
    "toml_value",
]
