"""``completion``: a bash or zsh completion script, generated from the parser by shtab.

The script is static: completing a word runs no Python, so it is as quick as
the shell. Commands and options complete; ``--db`` and ``--providers-db``
complete file names.
"""

from __future__ import annotations

import argparse

from langgraph_cancel.cli.parser import build_parser

#: Options whose value is a file name (``--db`` takes a URL, most often a file).
FILE_OPTIONS = frozenset({"--db", "--providers-db"})


def script(shell: str) -> str:
    """The completion script for ``shell`` (``bash`` or ``zsh``)."""
    import shtab

    parser = build_parser()
    _mark_files(parser, shtab.FILE)
    text: str = shtab.complete(parser, shell=shell)
    return text


def _mark_files(parser: argparse.ArgumentParser, files: object) -> None:
    for action in parser._actions:
        if FILE_OPTIONS.intersection(action.option_strings):
            action.complete = files  # type: ignore[attr-defined]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _mark_files(sub, files)


def run(args: argparse.Namespace) -> int:
    """``langgraph-cancel completion SHELL``."""
    print(script(args.shell))
    return 0


__all__ = ["FILE_OPTIONS", "run", "script"]
