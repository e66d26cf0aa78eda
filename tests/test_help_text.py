"""Every ``gnnserve`` subcommand's ``--help`` says what each option does and shows its defaults.

The parsers are built in-process (no server starts, nothing is loaded): each subcommand's handler runs with
``ArgumentParser.parse_args`` replaced by one that records the parser and stops, so that the parsers the
commands really use are checked, subcommands (``log show``, ``graph load``, ...) included.
"""

from __future__ import annotations

import argparse
import inspect

import pytest

from serve import cli

#: options hidden on purpose (internal to ``serve --processes``)
HIDDEN = {("gnnserve serve", "--process-slot"), ("gnnserve serve", "--process-status")}


class _Built(BaseException):
    """Raised instead of parsing: carries the parser a command built (a BaseException, so that no
    ``except Exception`` of a command swallows it)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _parser_of(command: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    def stop(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
        raise _Built(self)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", stop)
        with pytest.raises(_Built) as built:
            cli.HANDLERS[command](["--help"])
    return built.value.parser


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every parser of its subcommands, depth first."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                out += _all_parsers(sub)
    return out


def _expanded(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text as ``--help`` prints it (``%(default)s`` and the like filled in)."""
    return parser._get_formatter()._expand_help(action)


@pytest.fixture(scope="module")
def parsers() -> dict[str, list[argparse.ArgumentParser]]:
    with pytest.MonkeyPatch.context() as mp:
        return {command: _all_parsers(_parser_of(command, mp)) for command in cli.HANDLERS}


def test_every_command_is_listed_and_has_a_parser(parsers) -> None:
    assert set(cli.COMMANDS) == set(cli.HANDLERS)
    for command, found in parsers.items():
        assert found[0].prog.endswith(command), (command, found[0].prog)


def test_every_option_of_every_subcommand_has_help(parsers) -> None:
    missing = []
    for found in parsers.values():
        for parser in found:
            parser.format_help()  # a stray '%' in a help string fails here
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    continue
                name = action.option_strings[-1] if action.option_strings else action.dest
                if action.help == argparse.SUPPRESS and (parser.prog, name) in HIDDEN:
                    continue
                if not action.help or action.help == argparse.SUPPRESS or not _expanded(parser, action).strip():
                    missing.append(f"{parser.prog} {name}")
    assert not missing, "options without help: " + ", ".join(missing)


def test_every_option_with_a_default_shows_it(parsers) -> None:
    """An option whose default is a value (not None, not off) says so in its help."""
    silent = []
    for found in parsers.values():
        for parser in found:
            for action in parser._actions:
                if (not action.option_strings or action.required or action.help in (None, argparse.SUPPRESS)
                        or action.default in (None, False, [], argparse.SUPPRESS)):
                    continue
                if "default" not in _expanded(parser, action).lower():
                    silent.append(f"{parser.prog} {action.option_strings[-1]}")
    assert not silent, "options that do not show their default: " + ", ".join(silent)


def _help_of(command: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = cli.HANDLERS[command[0]]([*command[1:], "--help"])
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None)
    return " ".join(capsys.readouterr().out.split())


def test_serve_help_shows_the_defaults(capsys) -> None:
    text = _help_of(["serve"], capsys)
    assert "default: 127.0.0.1" in text and "default: 8500" in text
    assert "--compact-log-bytes" in text and "268435456 = 256 MiB" in text
    assert "--read-your-writes-timeout-s" in text and "default: 1.0" in text
    assert "--projection-cache-bytes" in text and "'auto' (the default)" in text and "else 2 GiB" in text


def test_train_help_shows_the_defaults(capsys) -> None:
    text = _help_of(["train"], capsys)
    assert "maximum training epochs (default: 200)" in text
    assert "Adam learning rate (default: 0.01)" in text and "hidden width of each layer (default: 64)" in text


def test_every_dataset_option_describes_the_same_specs(parsers) -> None:
    """Every option taking a dataset spec (kernels.datasets.load_dataset) lists the same forms, every
    synthetic shape included."""
    from kernels.datasets import DATASET_HELP, SYNTHETIC_SHAPES

    spec = cli.DATASET_HELP
    assert spec == DATASET_HELP  # serve.cli's copy (it imports no kernels) and the one models.train reads
    assert "synthetic[:N[:SEED[:SHAPE]]]" in spec and "synthetic:2000000:0:products" in spec
    for shape in SYNTHETIC_SHAPES:
        assert f"'{shape}'" in spec, shape
    seen = []
    for found in parsers.values():
        for parser in found:
            for action in parser._actions:
                if action.dest in ("dataset", "data") and action.option_strings:
                    seen.append(parser.prog)
                    assert spec in " ".join(_expanded(parser, action).split()), parser.prog
    assert {"gnnserve train", "gnnserve features load", "gnnserve graph load", "gnnserve graph verify",
            "gnnserve bench", "gnnserve serve"} <= set(seen), seen


def _option(parsers, prog: str, option: str) -> str:
    for found in parsers.values():
        for parser in found:
            if parser.prog == prog:
                for action in parser._actions:
                    if option in action.option_strings:
                        return " ".join(_expanded(parser, action).split())
    raise AssertionError(f"{prog} has no {option}")


def test_options_a_subcommand_lacks_are_not_named(parsers) -> None:
    assert "--repo" not in _option(parsers, "gnnserve graph verify", "--ppr-cache")
    assert "REPO/_ppr with --repo" in _option(parsers, "gnnserve graph load", "--ppr-cache")
    truncate_redis = _option(parsers, "gnnserve log truncate", "--redis-url")
    assert "show only" not in truncate_redis and "refused" in truncate_redis
    assert "show only" not in _option(parsers, "gnnserve log show", "--redis-url")


def test_log_help_describes_its_subcommands(capsys) -> None:
    text = _help_of(["log"], capsys)
    assert "docstring" not in text
    assert "show list every graph's update log" in text and "truncate drop every record" in text
    assert "gnnserve log truncate --repo REPO --graph cd91 --after 56 --yes" in text


def test_the_sdk_documents_min_graph_version_and_exports_every_error() -> None:
    from clients import errors
    from clients.aio import AsyncGnnClient
    from clients.client import GnnClient

    for method in (GnnClient.predict, GnnClient.predict_new_node, AsyncGnnClient.predict,
                   AsyncGnnClient.predict_new_node):
        assert "min_graph_version" in inspect.signature(method).parameters
        doc = inspect.getdoc(method) or ""
        assert "min_graph_version" in doc and "--read-your-writes-timeout-s" in doc, method.__qualname__
    exported = set(errors.__all__)
    assert {"AbortedError", "FailedPreconditionError"} <= exported
    classes = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, errors.GnnServeError)}
    assert classes <= exported, classes - exported
