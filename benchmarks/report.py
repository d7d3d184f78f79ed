"""The benchmarks' common ending: print the result table and write it to --output."""

from pathlib import Path


def emit(lines: list[str], output: Path | None) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    if output:
        output.write_text(text)


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines: the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]
