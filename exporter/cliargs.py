"""The argument parser of every llm-exporter command: no abbreviations, and an unknown option named,
with the closest valid one, before anything else is checked.

argparse takes any unambiguous prefix of an option by default (`--candidat` is `--candidate`), so a
flag renamed or added later silently changes what an old command line means; and an unknown
option is reported only after the other checks, so `loadtest --demo --concurency 1,8` answered
"argument url: not allowed with argument --demo" and never named the typo. `Parser` turns prefixes
off and looks at every option-looking word first:

    llm-exporter loadtest: unknown option --concurency (did you mean --concurrency?)

with exit status 2, the status of every bad argument (docs/cli.md). exporter/cli.py builds the
top parser with it, and add_subparsers hands it down, so each command's parser is one too.

Every other argparse error (a value of the wrong type, a missing argument, two that exclude each
other) is one line too, `llm-exporter loadtest: argument --prompt-tokens: invalid int value:
'1e308'`, not argparse's usage block before it: a script reading stderr gets the reason, not a
screen of options. A word with a NUL byte (possible only in-process: exec refuses it) is refused
by name rather than reaching open() as a ValueError."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from exporter.termsafe import terminal_safe
from exporter.yamlsafe import shorten

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser with allow_abbrev off (whatever the caller passes) and unknown
    options refused by name before parsing (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", Parser)
        return super().add_subparsers(**kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        if any("\0" in word for word in argv):
            self.error("an argument contains a NUL byte")
        self.refuse_unknown_options(argv)
        return super().parse_known_args(argv, namespace)

    def error(self, message: str) -> NoReturn:
        """One line and exit 2 (argparse prints its usage block first)."""
        self.exit(EXIT_USAGE, f"{self.prog}: {terminal_safe(shorten(message))} ({self.prog} --help lists the "
                              "options)\n")

    def refuse_unknown_options(self, argv: Sequence[str]) -> None:
        """Exit 2 naming the first word of `argv` that looks like an option of this parser (or of the
        subcommand it names) and is none. Values are never mistaken for options: a value that starts
        with a dash is one argparse would refuse too, and a negative number is left alone."""
        commands = self._commands()
        for i, word in enumerate(argv):
            if word == "--":
                return  # what follows is positional
            if not self._looks_like_option(word):
                if commands is None:
                    continue  # a positional or an option's value
                if word in commands:
                    commands[word].refuse_unknown_options(argv[i + 1:])
                return  # a parser with commands: argparse says what is wrong with a bad command
            name = word.split("=", 1)[0] if word.startswith("--") else word
            if name not in self._option_string_actions:
                self.unknown_option(name)

    def unknown_option(self, name: str) -> NoReturn:
        known = sorted(s for s in self._option_string_actions if s.startswith("--") == name.startswith("--"))
        match = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {match[0]}?" if match else f"{self.prog} --help lists them"
        self.exit(EXIT_USAGE, f"{self.prog}: unknown option {terminal_safe(name)} ({hint})\n")

    def _looks_like_option(self, word: str) -> bool:
        if not word.startswith("-") or word == "-":
            return False
        return not (self._negative_number_matcher.match(word) and not self._has_negative_number_optionals)

    def _commands(self) -> dict[str, Parser] | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return {name: parser for name, parser in action.choices.items() if isinstance(parser, Parser)}
        return None


def parsers(root: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`root` and every subcommand's parser under it, depth first (what the tests walk)."""
    out = [root]
    for action in root._actions:
        if isinstance(action, argparse._SubParsersAction):
            for parser in action.choices.values():
                out.extend(parsers(parser))
    return out
