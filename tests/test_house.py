"""The house rules a newcomer relies on (issue 34): short functions, files that fit in a read, and no
code below the Lightning layer that reaches into a LightningModule (the import contract in
.importlinter covers the imports; this covers what an import cannot show)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "spec_drafters"
BELOW_LIGHTNING = [p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in ("lightning", "cli")]


def test_no_function_is_longer_than_60_lines():
    long = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_source_file_is_longer_than_450_lines():
    big = {
        str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450
    }
    assert not big, big


def test_nothing_below_lightning_reads_a_lightning_modules_attributes():
    """hparams, trainer, log and the module's ``built`` setup exist on a LightningModule only: code
    below lightning/ that reads them takes one by duck typing, which the import contract cannot see."""
    lightning_only = {"hparams", "trainer", "built", "global_step", "global_rank", "log_dict"}
    found = []
    for path in BELOW_LIGHTNING:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in lightning_only:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}")
    assert not found, found


def test_no_test_imports_a_benchmark_or_study_script():
    """benchmarks/ and experiments/ are scripts: what a test needs of them lives in the package
    (spec_drafters/studies), and a test that runs one runs it as a program (a subprocess)."""
    root = SRC.parent.parent
    scripts = {p.stem for folder in ("benchmarks", "experiments") for p in (root / folder).glob("*.py")}
    found = []
    for path in sorted((root / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in scripts]
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module",
                "run_path",
            ):  # importlib.import_module("ablation"), runpy.run_path("benchmarks/x.py") in this process
                found.append(f"{path.name}: {ast.unparse(node)}")
    assert not found, f"tests importing benchmark or study scripts: {found}"


def test_every_script_defines_everything_before_it_runs():
    """A function defined below a script's ``if __name__ == "__main__":`` does not exist yet when the
    script runs (experiments/twins.py once named one there and could not finish a run)."""
    root = SRC.parent.parent
    late = []
    for path in sorted([*(root / "benchmarks").glob("*.py"), *(root / "experiments").glob("*.py")]):
        body = ast.parse(path.read_text()).body
        guard = next(
            (i for i, n in enumerate(body) if isinstance(n, ast.If) and "__main__" in ast.unparse(n)), None
        )
        if guard is not None:
            late += [
                f"{path.name}: {n.name}"
                for n in body[guard:]
                if isinstance(n, ast.FunctionDef | ast.ClassDef)
            ]
    assert not late, f"defined after the script runs: {late}"
