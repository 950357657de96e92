#!/usr/bin/env python3
"""Write what is derived from the daemons' settings declarations: the settings tables of
docs/configuration.md and the variable names the misspelling warning knows
(hangwatch_common/declared_names.py).

    .venv/bin/python scripts/settings-docs.py            # rewrite them
    .venv/bin/python scripts/settings-docs.py --check    # exit 1 if either differs (tests/test_settings_declared.py)

Never edit the outputs by hand: declare the setting (agent/settings.py, monitor/web/settings.py,
monitor/ingest/limits.py, monitor/relay/cli.py) and run this.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.settings import AgentSettings  # noqa: E402
from hangwatch_common.settings import env_names, markdown_rows  # noqa: E402
from monitor.relay.cli import RelaySettings  # noqa: E402
from monitor.web.settings import Settings  # noqa: E402

# program -> its settings, in the order docs/configuration.md shows them.
DAEMONS = {"hangwatch-monitor": Settings, "hangwatch-relay": RelaySettings, "hangwatch-agent": AgentSettings}
DOC = ROOT / "docs" / "configuration.md"
NAMES = ROOT / "hangwatch_common" / "declared_names.py"
BEGIN = "<!-- settings: written by scripts/settings-docs.py from the declarations; edit those, not this table -->"
END = "<!-- /settings -->"


def tables() -> str:
    parts = []
    for program, cls in DAEMONS.items():
        parts += [f"### `{program}`", "", "| option | variable | file key | default | what it does |",
                  "|---|---|---|---|---|",
                  *markdown_rows(cls), ""]
    return "\n".join(parts)


def doc(text: str) -> str:
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{DOC.relative_to(ROOT)}: no {BEGIN!r} ... {END!r} block")
    return f"{head}{BEGIN}\n{tables()}\n{END}{tail}"


def names() -> str:
    lines = ['# Written by scripts/settings-docs.py from the daemons\' settings declarations -- edit those, not this file.',
             '"""The HANGWATCH_* variables the daemons\' settings declare, one set per program (env_names.py)."""', ""]
    for program, cls in DAEMONS.items():
        constant = program.removeprefix("hangwatch-").upper()
        lines += [f"{constant} = frozenset({{", *(f'    "{name}",' for name in sorted(env_names(cls))), "})"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if an output differs from what would be written")
    args = parser.parse_args()
    stale = []
    for path, make in ((DOC, lambda: doc(DOC.read_text())), (NAMES, names)):
        text = make()
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"out of date: {', '.join(map(str, stale))}; run scripts/settings-docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
