"""Printing benchmark figures as one aligned table with their targets."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Figure", "print_table"]


@dataclass(frozen=True)
class Figure:
    """One measured figure and, when it has one, its target."""

    name: str
    value: float
    unit: str
    target: float | None = None
    lower_is_better: bool = True
    digits: int = 1
    """Decimals printed (a ratio near its target needs more than one)."""

    def verdict(self) -> str:
        if self.target is None:
            return ""
        met = self.value <= self.target if self.lower_is_better else self.value >= self.target
        return "meets target" if met else "MISSES target"

    def target_text(self) -> str:
        if self.target is None:
            return ""
        return f"{'<=' if self.lower_is_better else '>='} {self.target:g} {self.unit}"


def print_table(title: str, figures: list[Figure]) -> None:
    """Print ``figures`` under ``title``: name, value, target and verdict per line."""
    print(f"\n{title}")
    width = max(len(figure.name) for figure in figures)
    for figure in figures:
        value = f"{figure.value:,.{figure.digits}f} {figure.unit}"
        print(
            f"  {figure.name:<{width}}  {value:>14}  {figure.target_text():>14}  {figure.verdict()}"
        )
