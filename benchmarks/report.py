"""The benchmarks' common ending: print the result table and write it to --output."""

from pathlib import Path


def emit(lines: list[str], output: Path | None) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    if output:
        output.write_text(text)
