"""Training configs in the flat form of before 0.4 (every key in ``[training]``, a ``[vllm]``
table): refused with one line per key saying where it went.

Not read with a notice: the sections change what some keys mean by their presence (no
``[learner.lora]`` table trains every weight, no ``[engine.vllm]`` table generates with torch),
so a silent translation would have to guess, and the file would keep its old form for ever.
The lines derive from each setting's ``formerly`` (`Setting.formerly`).
"""

from __future__ import annotations

from osmosis_ai.config.schema import walk_keys
from osmosis_ai.config.source import ConfigSource, TOMLTable
from osmosis_ai.errors import ConfigError

__all__ = ["migration_error", "new_place"]

#: Old keys whose new form is a table's presence, not a key.
_TABLE_SWITCHES = {
    "training.engine": (
        "vllm",
        "generate with vLLM by adding an [engine.vllm] table (its keys are the old [vllm] "
        "table's); without one the torch engine generates",
    ),
    "training.credit": (
        "turn",
        "credit per turn is an [algorithm.turn_credit] table (discount, weight); without one "
        "every token gets its rollout's advantage",
    ),
}


def new_place(old: str) -> str | None:
    """Where the flat key ``old`` (``"training.lora_rank"``) went: ``"[learner.lora] rank"``."""
    from osmosis_ai.train.config import TRAIN_SECTIONS

    for top in TRAIN_SECTIONS:
        for section, key in walk_keys(top):
            if key.setting.formerly == old:
                return f"[{section.name}] {key.name}"
    return None


def migration_error(src: ConfigSource, data: TOMLTable) -> ConfigError | None:
    """The error naming each key of ``data`` that moved, one line each; ``None`` when the
    file has none."""
    lines = []
    if isinstance(data.get("vllm"), dict):
        lines.append(f"{_at(src, ('vllm',))}[vllm] is now [engine.vllm]: rename the table")
    training = data.get("training")
    for key, value in training.items() if isinstance(training, dict) else ():
        line = _moved(f"{_at(src, ('training', key))}training.{key}", f"training.{key}", value)
        if line is not None:
            lines.append(line)
    if not lines:
        return None
    return ConfigError(
        f"{src.path}: this config has the flat keys of before 0.4; move each "
        "(docs/train/reference.md has every key):\n" + "\n".join(f"  {line}" for line in lines)
    )


def _at(src: ConfigSource, key: tuple[str, ...]) -> str:
    where = src.where(key)
    return f"{where}: " if where else ""


def _moved(prefix: str, old: str, value: object) -> str | None:
    if old in _TABLE_SWITCHES:
        on, text = _TABLE_SWITCHES[old]
        return f"{prefix} = {value!r}: {text}" if value == on else f"{prefix}: remove it ({text})"
    if old == "training.lora_rank" and value == 0:
        return f"{prefix} = 0: remove it (no [learner.lora] table trains every weight)"
    if old == "training.overlong" and value == "keep":
        return f'{prefix} = "keep": remove it (no [algorithm.overlong] table keeps them)'
    place = new_place(old)
    if place is None:
        return None  # a key that stayed in [training], or an unknown one (refused later)
    return f"{prefix} is now {place}"
