"""Print the module map of docs/design.md ("Layers"), made from the tree and its docstrings.

Each package of codec/ and vfs/ with the first line of its docstring, then each of its
modules with the first line of its own.  tests/codec/test_layout.py checks that docs/design.md
holds exactly this; after moving or adding a module, run:

    python scripts/module_map.py --write
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
DESIGN = REPOSITORY / "docs" / "design.md"
BEGIN = "<!-- module map: made by scripts/module_map.py -->\n"
END = "<!-- end of module map -->\n"
WIDTH = 92


def first_line(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(docstring.split("\n\n")[0].split())


def module_map() -> str:
    lines = ["```"]
    for layer in ("vfs", "codec"):
        top = REPOSITORY / layer
        packages = [top, *sorted(p for p in top.iterdir() if (p / "__init__.py").is_file())]
        for package in packages:
            name = package.relative_to(REPOSITORY).as_posix() + "/"
            lines += ["", *_wrapped(name, first_line(package / "__init__.py"), 0)]
            for module in sorted(package.glob("*.py")):
                if module.name != "__init__.py":
                    lines += _wrapped(module.name, first_line(module), 2)
        if layer == "vfs":
            lines += [
                "",
                "-" * 40 + " vfs depends on codec only; codec imports no vfs, pyfuse3, trio",
            ]
    lines.append("```")
    return "\n".join(lines) + "\n"


def _wrapped(name: str, text: str, indent: int) -> list[str]:
    head = " " * indent + name
    body = textwrap.wrap(text, WIDTH - 26) or [""]
    first = f"{head:<24}  {body[0]}" if len(head) < 24 else f"{head}\n{'':<26}{body[0]}"
    return [first.rstrip(), *(f"{'':<26}{line}" for line in body[1:])]


def in_design() -> str:
    text = DESIGN.read_text()
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)]


def main() -> int:
    made = module_map()
    if "--write" in sys.argv:
        text = DESIGN.read_text()
        DESIGN.write_text(text[: text.index(BEGIN) + len(BEGIN)] + made + text[text.index(END) :])
    else:
        print(made, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
