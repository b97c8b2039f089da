"""`jobd completion SHELL`: a completion script for bash, zsh or fish, made from the argument
parser (``arguments.build_parser``), never from a list kept by hand: a command or option added
there completes without more.

Each script works the same way: it walks the words typed so far from ``jobd``, stepping into a
subcommand when a word names one of the command reached (``dlq QUEUE list``: QUEUE is not a
subcommand, ``list`` is), and skipping the value of an option that takes one. Then it offers the
options of the command reached (a word that starts with ``-``), its subcommands, an option's
choices, or file names (an option or argument that takes a path)."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field

FILE_METAVARS = frozenset({"PATH", "F", "FILE", "CONFIG"})  # a value that names a file


@dataclass
class Option:
    flags: list[str]
    takes_value: bool  # the next word is its value (an optional value is not assumed)
    choices: list[str]
    files: bool  # its value names a file
    help: str


@dataclass
class Node:
    """A command: its words from ``jobd`` on, its subcommands (name -> node) and options."""

    path: tuple[str, ...]
    help: str = ""
    parser: argparse.ArgumentParser | None = None
    commands: dict[str, Node] = field(default_factory=dict)
    options: list[Option] = field(default_factory=list)
    files: bool = False  # a positional argument names a file
    values: list[str] = field(default_factory=list)  # a positional argument's choices

    def all(self) -> list[Node]:
        """This node and every node under it, depth first."""
        return [self, *(n for child in self.commands.values() for n in child.all())]

    @property
    def key(self) -> str:
        return " ".join(self.path)


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("jobd",), what: str = ""
) -> Node:
    """The command tree of ``parser``; options whose help is suppressed are left out."""
    node = Node(path, what, parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                node.commands[name] = walk(sub, (*path, name), helps.get(name, ""))
        elif action.option_strings and action.help != argparse.SUPPRESS:
            choices = [str(c) for c in action.choices or ()]
            files = str(action.metavar) in FILE_METAVARS
            node.options.append(Option(list(action.option_strings), action.nargs not in (0, "?"),
                                       choices, files, action.help or ""))  # fmt: skip
        elif not action.option_strings:
            node.files |= str(action.metavar) in FILE_METAVARS
            node.values += [str(c) for c in action.choices or ()]
    return node


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    tree = walk(parser)
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](tree)


def q(text: str) -> str:
    """``text`` quoted for bash and zsh (single quotes)."""
    return shlex.quote(text)


def steps(tree: Node, indent: str) -> list[str]:
    """The walker's steps as case arms (bash and zsh) on "AT WORD": into a subcommand (at=…),
    or over an option's value (skip=1)."""
    lines = []
    for node in tree.all():
        for name in node.commands:
            lines.append(f"{indent}{q(node.key + ' ' + name)}) at={q(node.key + ' ' + name)} ;;")
        valued = [f"{node.key} {flag}" for o in node.options if o.takes_value for flag in o.flags]
        if valued:
            lines.append(f"{indent}{'|'.join(map(q, valued))}) skip=1 ;;")
    return lines


def option_values(tree: Node, indent: str, choices: str, files: str) -> list[str]:
    """Case arms on "AT PREVIOUS-WORD" completing an option's value: its choices (``choices``
    with {words} for them, or {one}: them as one word), or file names (``files``)."""
    lines = []
    for node in tree.all():
        for o in node.options:
            arms = "|".join(q(f"{node.key} {flag}") for flag in o.flags)
            if o.choices:
                words = " ".join(map(q, o.choices))
                lines.append(f"{indent}{arms}) {choices.format(words=words, one=q(words))} ;;")
            elif o.files:
                lines.append(f"{indent}{arms}) {files} ;;")
    return lines


def walker(tree: Node, first: str, words: str) -> list[str]:
    """The loop (bash and zsh) over the words before the cursor, from index ``first`` of
    array ``words``: ``at`` the command reached, ``skip`` set when the last one wants a value."""
    end = "COMP_CWORD" if words == "COMP_WORDS" else "CURRENT"
    return [
        f"    for ((i = {first}; i < {end}; i++)); do",
        f"        word=${{{words}[i]}}",
        "        if ((skip)); then skip=0; continue; fi",
        '        case "$at $word" in',
        *steps(tree, "            "),
        "        esac",
        "    done",
    ]


def bash(tree: Node) -> str:
    lines = [
        "# bash completion for jobd: generated from its argument parser by `jobd completion bash`.",
        "# Load it with: source <(jobd completion bash)",
        "_jobd() {",
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} at=jobd",
        "    local word i skip=0 options='' commands='' files=0",
        *walker(tree, "1", "COMP_WORDS"),
        "    COMPREPLY=()",
        "    if ((skip)); then",
        '        case "$at $prev" in',
        *option_values(tree, "            ", 'COMPREPLY=($(compgen -W {one} -- "$cur"))',
                       'COMPREPLY=($(compgen -f -- "$cur"))'),
        "        esac",
        "        return 0",
        "    fi",
        '    case "$at" in',
    ]  # fmt: skip
    for node in tree.all():
        flags = " ".join(f for o in node.options for f in o.flags)
        words = " ".join([*node.commands, *node.values])
        lines.append(f"        {q(node.key)}) options={q(flags)}; commands={q(words)}; "
                     f"files={int(node.files)} ;;")  # fmt: skip
    lines += [
        "    esac",
        "    if [[ $cur == -* ]]; then",
        '        COMPREPLY=($(compgen -W "$options" -- "$cur"))',
        "    elif [[ -n $commands ]]; then",
        '        COMPREPLY=($(compgen -W "$commands" -- "$cur"))',
        "    elif ((files)); then",
        '        COMPREPLY=($(compgen -f -- "$cur"))',
        "    fi",
        "}",
        "complete -F _jobd jobd",
    ]
    return "\n".join(lines) + "\n"


def _described(items: list[tuple[str, str]]) -> str:
    """A zsh array of NAME:DESCRIPTION, for _describe (a colon in a name escaped)."""
    return " ".join(q(f"{name.replace(':', chr(92) + ':')}:{what}") for name, what in items)


def zsh(tree: Node) -> str:
    lines = [
        "#compdef jobd",
        "# zsh completion for jobd: generated from its argument parser by `jobd completion zsh`.",
        "# Load it with: source <(jobd completion zsh) (after compinit), or save it as _jobd in",
        "# a directory of $fpath.",
        "_jobd() {",
        "    local cur=${words[CURRENT]} prev=${words[CURRENT-1]} at=jobd word i",
        "    local -i skip=0 files=0",
        "    local -a options commands",
        *walker(tree, "2", "words"),
        "    if ((skip)); then",
        '        case "$at $prev" in',
        *option_values(tree, "            ", "compadd -- {words}", "_files"),
        "        esac",
        "        return",
        "    fi",
        '    case "$at" in',
    ]
    for node in tree.all():
        opts = [(f, o.help) for o in node.options for f in o.flags]
        cmds = [(n, c.help) for n, c in node.commands.items()] + [(v, "") for v in node.values]
        lines.append(f"        {q(node.key)}) options=({_described(opts)}); "
                     f"commands=({_described(cmds)}); files={int(node.files)} ;;")  # fmt: skip
    lines += [
        "    esac",
        "    if [[ $cur == -* ]]; then",
        "        _describe -t options option options",
        "    elif (( ${#commands} )); then",
        "        _describe -t commands command commands",
        "    elif ((files)); then",
        "        _files",
        "    fi",
        "}",
        'if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then _jobd "$@"; '
        "else compdef _jobd jobd; fi",
    ]
    return "\n".join(lines) + "\n"


def fq(text: str) -> str:
    """``text`` quoted for fish (single quotes: only \\ and ' escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish(tree: Node) -> str:
    lines = [
        "# fish completion for jobd: generated from its argument parser by `jobd completion fish`.",
        "# Load it with: jobd completion fish | source",
        "function __jobd_at --description 'whether the words typed reach jobd command $argv[1]'",
        "    set -l at jobd",
        "    set -l skip 0",
        "    for word in (commandline -opc)[2..-1]",
        "        if test $skip = 1",
        "            set skip 0",
        "            continue",
        "        end",
        '        switch "$at $word"',
    ]
    for node in tree.all():
        for name in node.commands:
            lines += [f"            case {fq(node.key + ' ' + name)}",
                      f"                set at {fq(node.key + ' ' + name)}"]  # fmt: skip
        valued = [f"{node.key} {flag}" for o in node.options if o.takes_value for flag in o.flags]
        if valued:
            lines += [f"            case {' '.join(map(fq, valued))}", "                set skip 1"]
    lines += ["        end", "    end", '    test "$at" = "$argv[1]"', "end", "complete -c jobd -f"]
    for node in tree.all():
        at = f"-n {fq('__jobd_at ' + q(node.key))}"
        for name, child in node.commands.items():
            lines.append(f"complete -c jobd {at} -a {fq(name)} -d {fq(child.help)}")
        for value in node.values:
            lines.append(f"complete -c jobd {at} -a {fq(value)}")
        if node.files:
            lines.append(f"complete -c jobd {at} -F")
        lines += [f"complete -c jobd {at} {_fish_option(o)}" for o in node.options]
    return "\n".join(lines) + "\n"


def _fish_option(o: Option) -> str:
    names = [f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}" for f in o.flags]
    value = ""
    if o.takes_value:
        value = " -r -F" if o.files else " -x"
        value += f" -a {fq(' '.join(o.choices))}" if o.choices else ""
    return f"{' '.join(names)}{value} -d {fq(o.help)}"
