#!/usr/bin/env python3
"""Checks what the docs say against the repository (python3, standard library only).

    python3 scripts/check_docs.py              # check the docs of this repository
    python3 scripts/check_docs.py --self-test  # show that the checks catch what they should

1. Paths. README.md, docs/*.md, benchmarks/README.md, tests/scenarios/README.md and
   examples/**/README.md name repository paths: in code spans, links, code blocks and
   prose. Every token that looks like one (it holds a '/' and ends in a file extension or
   in '/') must exist. A short path (`eventstore/pages.rs`, `tests/layers.rs`,
   `semantics/`) may be relative to the doc's own folder, the repository root, docs/,
   scripts/, benchmarks/, tests/, tests/scenarios/, python/, or a crate: crates/*/,
   crates/*/src/, crates/*/src/*/ (a layer's folder, `notify/`), crates/*/tests/. A glob
   (`tests/scenarios/**/*.scn`) must match a file. `path.rs::name` also needs `name`
   declared in that file (`fn name`, `struct name`, `def name`, ...). A link
   (`[text](target)`) is resolved as a Markdown renderer does, from the doc's folder only,
   and its `#anchor` must be a heading of the target. Not checked: URLs, absolute paths,
   `~`, `$VARS`, `<placeholders>` and `{...}`, elided paths (`...`), and, when they do not
   exist, warehouse and input paths (DATA_ROOTS below, `_strata/`, `_delta_log/`, ...),
   upper-case placeholders (`DIR/_strata/`, `fuzz/checks/TARGET.rs`), places git ignores
   (a venv, benchmark data: created by the tools), and the tokens of NOT_REPO_PATHS.
   PENDING lists stale paths left to another change (printed, not failed).

2. Lakeflow rows. In docs/coming-from-databricks.md, a table row whose strata column says
   "not yet" (or "not supported", "unsupported", "no") must end its notes with its reason
   and the tests that show it:

       | Private tables | not yet | (reason in words; test: `tests/scenarios/errors/x.scn`) |

   Each test is a path under tests/, crates/*/tests/ or python/tests/ that exists
   (`file.rs::test_name` names one test; that name must be in the file); a scenario file
   named there must hold a `run ... error` block. A row of another status that says "not
   yet" in its notes is a problem too: give what is missing a row of its own. Cells are
   split as GitHub splits them (on every '|' not written `\\|`, code spans included), and
   a row with more cells than its table's header is a problem.

Each problem is printed as FILE:LINE: message and the exit code is 1; else one line,
`docs: N paths checked, M not-yet rows checked, ok`.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The docs that are checked, as globs relative to the repository root.
DOCS = [
    "README.md",
    "docs/*.md",
    "benchmarks/README.md",
    "tests/scenarios/README.md",
    "examples/**/README.md",
]

LAKEFLOW_DOC = "docs/coming-from-databricks.md"

# Folders a short path may be relative to (globs, relative to the repository root), after
# the doc's own folder.
BASES = [
    ".",
    "docs",
    "scripts",
    "benchmarks",
    "tests",
    "tests/scenarios",
    "python",
    "examples/*",
    "crates/*",
    "crates/*/src",
    "crates/*/src/*",
    "crates/*/tests",
]

# Tokens that look like repository paths but are not, each with the reason. Keep this list
# short and explicit: a name that belongs to this repository goes in the docs as it is
# spelled in the tree, not here.
NOT_REPO_PATHS = {
    # apache/spark's programming guide, cited as a source of the semantics (docs/semantics.md).
    "docs/declarative-pipelines-programming-guide.md",
}

# Stale paths in docs another change is rewriting, as (doc, path): reported as pending, not
# as problems. An entry whose doc no longer names the path, or whose path exists, is itself
# a problem, so that it is removed once the other change is in.
PENDING: set[tuple[str, str]] = set()

# First components of paths that are warehouse or input data, not repository files (only
# used when the path does not exist in the repository): a pipeline's input (`data/...`), a
# warehouse, build output (`target/release/...`), the folders a benchmark workload is
# generated into under benchmarks/data/ (`versions/v1/`, `duckdb/target.duckdb`), and the
# landing folder examples/music_streaming/run.sh creates (`incoming/`). Names starting with
# `_` (`_strata/`, `_delta_log/`, `_change_data/`) are a warehouse's or a table's own.
DATA_ROOTS = {"data", "warehouse", "target", "versions", "duckdb", "incoming"}

PATH_EXT = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,7}$")
# Characters a path token is cut at (besides whitespace).
CUT = re.compile(r"[\s`'\"(),;|=\[\]]+")
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ITEM = re.compile(r"::([A-Za-z_][A-Za-z0-9_]*)")
NOT_YET = re.compile(r"^\s*(not yet|not supported|unsupported|no)\b", re.IGNORECASE)
NOT_YET_IN_NOTES = re.compile(r"\bnot (?:yet|supported yet)\b", re.IGNORECASE)
# The trailing "(reason; test: `a`, `b`)" of a not-yet row's notes.
REASON_AND_TESTS = re.compile(
    r"\((?P<reason>(?:[^()]|\([^()]*\))*?);\s*tests?:\s*(?P<tests>(?:`[^`]+`\s*,?\s*)+)\)\s*$"
)
TEST_ROOTS = ("tests/", "python/tests/")
TEST_IN_CRATE = re.compile(r"^crates/[^/]+/tests/")


class Problems:
    def __init__(self) -> None:
        self.items: list[tuple[str, int, str]] = []
        self.pending: list[tuple[str, int, str]] = []
        self.pending_seen: set[tuple[str, str]] = set()

    def add(self, file: str, line: int, message: str) -> None:
        self.items.append((file, line, message))


def doc_files(root: Path) -> list[Path]:
    found: set[Path] = set()
    for pattern in DOCS:
        for p in glob.glob(str(root / pattern), recursive=True):
            found.add(Path(p))
    return sorted(found)


def rel(root: Path, p: Path) -> str:
    return p.relative_to(root).as_posix()


def base_dirs(root: Path, doc: Path) -> list[Path]:
    dirs = [doc.parent]
    for b in BASES:
        dirs.extend(sorted(Path(p) for p in glob.glob(str(root / b)) if os.path.isdir(p)))
    return dirs


def is_candidate(token: str) -> bool:
    """Whether a token looks like a path: a '/' and a file extension or a trailing '/'."""
    if "/" not in token or token in ("/", "//"):
        return False
    last = token.rstrip("/").rsplit("/", 1)[-1]
    if not last:
        return False
    return token.endswith("/") or bool(PATH_EXT.search(token))


def never_checked(token: str) -> bool:
    """URLs, absolute and home paths, variables, placeholders and elided paths."""
    return (
        "://" in token
        or token.startswith(("/", "~", "$", "http:", "https:", "mailto:", "-"))
        or "$" in token
        or any(c in token for c in "<>{}@%")
        or "..." in token
        or not re.search(r"[A-Za-z0-9]", token)
        or "\u2026" in token
        # `../lake/orders` and `./x`: relative to a user's pipeline file, not the repository.
        or token.startswith(("../", "./"))
    )


def split_item(token: str) -> tuple[str, str | None]:
    """`path.rs::name` -> (`path.rs`, `name`); a `:LINE[:COL]` suffix is dropped."""
    item = None
    m = ITEM.search(token)
    if m:
        item = m.group(1)
        token = token[: m.start()]
    token = re.sub(r"(:\d+)+:?$", "", token)
    token = token.rstrip(":")
    return token, item


def declares(path: Path, item: str) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    pattern = (
        r"\b(?:fn|struct|enum|trait|type|const|static|mod|def|class|macro_rules!)\s+"
        + re.escape(item)
        + r"\b"
    )
    return re.search(pattern, text) is not None


def git_ignored(root: Path, bases: list[Path], token: str) -> bool:
    """Whether git ignores `token` under one of `bases`: a place the tools create."""
    names = []
    for b in bases:
        p = os.path.relpath(b / token, root)
        names += [p, p.rstrip("/") + "/"]
    try:
        out = subprocess.run(["git", "-C", str(root), "check-ignore", "--stdin"],
                             input="\n".join(names), capture_output=True, text=True)
    except OSError:
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def resolve(token: str, bases: list[Path]) -> list[Path]:
    """The existing files or folders `token` names under one of `bases`."""
    if any(c in token for c in "*?["):
        out: list[Path] = []
        for b in bases:
            out.extend(Path(p) for p in glob.glob(str(b / token), recursive=True))
        return out
    for b in bases:
        p = b / token
        if token.endswith("/") and p.is_dir():
            return [p]
        if not token.endswith("/") and p.exists():
            return [p]
    return []


def tokens_of(line: str) -> list[str]:
    out = []
    for raw in CUT.split(line):
        t = raw.strip()
        # Sentence punctuation after a path, and bold or italics around it.
        t = t.rstrip(".:!")
        while len(t) > 2 and t[0] == t[-1] and t[0] in "*_":
            t = t[1:-1]
        t = t.lstrip(">")
        if t:
            out.append(t)
    return out


def slug(heading: str) -> str:
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def check_links(root: Path, doc: Path, lineno: int, line: str, problems: Problems) -> int:
    count = 0
    name = rel(root, doc)
    for m in LINK.finditer(line):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # a URL (https:, mailto:)
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part) if path_part else doc
        count += 1
        if not dest.exists():
            problems.add(name, lineno, f"link to {target}: {path_part} does not exist "
                                       f"(links are relative to {rel(root, doc.parent) or '.'}/)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            problems.add(name, lineno, f"link to {target}: {rel(root, dest.resolve())} "
                                       f"has no heading #{anchor}")
    return count


def check_paths(root: Path, doc: Path, problems: Problems) -> int:
    """Checks every path `doc` names; returns how many were checked."""
    name = rel(root, doc)
    bases = base_dirs(root, doc)
    count = 0
    for lineno, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        count += check_links(root, doc, lineno, line, problems)
        without_links = LINK.sub(" ", line)
        for raw in tokens_of(without_links):
            token, item = split_item(raw)
            if not is_candidate(token) or never_checked(token):
                continue
            found = resolve(token, bases)
            if not found:
                first = token.split("/", 1)[0]
                if token in NOT_REPO_PATHS or first in DATA_ROOTS or first.startswith("_"):
                    continue
                # An upper-case component is a placeholder: `DIR/_strata/`, `fuzz/TARGET.rs`.
                if any(re.fullmatch(r"[A-Z][A-Z0-9_]+(\.[a-z]+)?", part)
                       for part in token.split("/")):
                    continue
                if git_ignored(root, [doc.parent, root], token):
                    continue  # a generated place the doc names: a venv, benchmark data
                count += 1
                what = "matches no file" if any(c in token for c in "*?[") else "does not exist"
                if (name, token) in PENDING:
                    problems.pending.append((name, lineno, f"`{token}` {what} (pending)"))
                    problems.pending_seen.add((name, token))
                    continue
                problems.add(name, lineno, f"`{token}` {what} in the repository")
                continue
            count += 1
            if item and not any(p.is_file() and declares(p, item) for p in found):
                problems.add(name, lineno, f"`{raw}`: {rel(root, found[0].resolve())} "
                                           f"declares no `{item}`")
    return count


def cells_of(row: str) -> list[str]:
    """A table row's cells, split as GitHub splits them: on every '|' not written '\\|'."""
    body = row.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def check_lakeflow(root: Path, problems: Problems) -> int:
    doc = root / LAKEFLOW_DOC
    if not doc.exists():
        problems.add(LAKEFLOW_DOC, 1, "missing")
        return 0
    name = LAKEFLOW_DOC
    rows = 0
    header: list[str] | None = None
    lines = doc.read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.lstrip().startswith("|"):
            header = None
            continue
        cells = cells_of(line)
        if header is None:
            header = cells
            continue
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            continue
        if len(cells) != len(header):
            problems.add(name, lineno, f"row has {len(cells)} cells, its table {len(header)} "
                                       f"(write a '|' inside a cell as '\\|')")
            continue
        if len(cells) < 3:
            continue
        status, notes = cells[1], cells[-1]
        if not NOT_YET.match(status.replace("*", "")):
            if NOT_YET_IN_NOTES.search(" ".join(cells[1:])):
                problems.add(name, lineno, f"row '{cells[0][:40]}' is marked '{status}' but "
                                           f"says 'not yet' in its notes: give what is missing "
                                           f"a row of its own, marked not yet")
            continue
        rows += 1
        m = REASON_AND_TESTS.search(notes)
        if not m:
            problems.add(name, lineno, f"not-yet row '{cells[0][:40]}' does not end with "
                                       f"'(reason; test: `path`)'")
            continue
        if len(re.findall(r"\w+", m.group("reason"))) < 3:
            problems.add(name, lineno, f"not-yet row '{cells[0][:40]}': the reason "
                                       f"'{m.group('reason').strip()}' says too little")
        for test in re.findall(r"`([^`]+)`", m.group("tests")):
            path_text, item = split_item(test)
            path = root / path_text
            if not (path_text.startswith(TEST_ROOTS) or TEST_IN_CRATE.match(path_text)):
                problems.add(name, lineno, f"`{test}` is not a test (tests/, crates/*/tests/ "
                                           f"or python/tests/)")
            elif not path.is_file():
                problems.add(name, lineno, f"test `{path_text}` does not exist")
            elif item and not declares(path, item):
                problems.add(name, lineno, f"test `{test}`: {path_text} declares no `{item}`")
            elif path.suffix == ".scn" and not re.search(
                r"^run\b.*\berror\b", path.read_text(encoding="utf-8"), re.MULTILINE
            ):
                problems.add(name, lineno, f"scenario `{path_text}` has no `run ... error` block")
    return rows


def check(root: Path) -> tuple[Problems, int, int]:
    problems = Problems()
    paths = 0
    for doc in doc_files(root):
        paths += check_paths(root, doc, problems)
    rows = check_lakeflow(root, problems)
    for doc, token in sorted(PENDING - problems.pending_seen):
        if (root / doc).exists():
            me = Path(__file__).resolve()
            at = next((i for i, line in enumerate(me.read_text().splitlines(), 1)
                       if f'"{token}"' in line), 1)
            problems.add(rel(ROOT, me), at, f"PENDING entry ({doc}, {token}) is no longer "
                                            f"needed: remove it")
    return problems, paths, rows


def self_test() -> int:
    """Builds a small repository in a temp folder and checks that each problem is found."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        (root / "crates/strata-engine/src/eventstore").mkdir(parents=True)
        (root / "crates/strata-engine/src/eventstore/pages.rs").write_text("pub fn read() {}\n")
        (root / "tests/scenarios/errors").mkdir(parents=True)
        (root / "tests/scenarios/errors/x.scn").write_text("pipeline\nSELECT 1\n\nrun error no\n")
        (root / "README.md").write_text(
            "# R\n\nSee [design](docs/design.md#the-event-store) and `eventstore/pages.rs`.\n"
        )
        (root / "docs/design.md").write_text(
            "# Design\n\n## The event store\n\n"
            "`eventstore/pages.rs::read` is there; `src/digest.rs` is gone,\n"
            "so is `eventstore/pages.rs::gone`, and [a link](history.md) too.\n"
            "Data like `data/cdc/001.json`, `_strata/x/` and https://x.org/a.md are skipped.\n"
            "A glob must match: `tests/scenarios/**/*.scn` does, `tests/scenarios/old_*.scn`"
            " not.\n"
        )
        (root / LAKEFLOW_DOC).write_text(
            "# From Databricks\n\n| Lakeflow | strata | notes |\n|---|---|---|\n"
            "| A | supported | |\n"
            "| B | not yet | (what it needs is missing; test: `tests/scenarios/errors/x.scn`) |\n"
            "| C | not yet | nobody wrote a test |\n"
            "| D | not yet | (a good reason here; test: `tests/scenarios/errors/gone.scn`) |\n"
            "| E | supported | but F is not yet |\n"
            "| G | supported | `a | b` |\n"
        )
        problems, paths, rows = check(root)
        got = [f"{f}:{n}: {m}" for f, n, m in problems.items]
        expected = [
            f"{LAKEFLOW_DOC}:8: `tests/scenarios/errors/gone.scn` does not exist in the",
            "docs/design.md:5: `src/digest.rs` does not exist",
            "docs/design.md:6: `eventstore/pages.rs::gone`: ",
            "docs/design.md:6: link to history.md: history.md does not exist",
            "docs/design.md:8: `tests/scenarios/old_*.scn` matches no file",
            f"{LAKEFLOW_DOC}:7: not-yet row 'C' does not end with",
            f"{LAKEFLOW_DOC}:8: test `tests/scenarios/errors/gone.scn` does not exist",
            f"{LAKEFLOW_DOC}:9: row 'E' is marked 'supported' but says 'not yet'",
            f"{LAKEFLOW_DOC}:10: row has 4 cells",
        ]
        failed = False
        for e in expected:
            if not any(g.startswith(e) for g in got):
                print(f"self-test: not caught: {e}", file=sys.stderr)
                failed = True
        if len(got) != len(expected):
            print("self-test: expected exactly these problems:\n  " + "\n  ".join(expected)
                  + "\ngot:\n  " + "\n  ".join(got), file=sys.stderr)
            failed = True
        if rows != 3:
            print(f"self-test: {rows} not-yet rows counted, expected 3", file=sys.stderr)
            failed = True
        # The same tree with the problems fixed passes.
        (root / "docs/history.md").write_text("# History\n")
        (root / "docs/design.md").write_text(
            "# Design\n\n## The event store\n\n`eventstore/pages.rs::read`\n")
        (root / LAKEFLOW_DOC).write_text(
            "# From Databricks\n\n| Lakeflow | strata | notes |\n|---|---|---|\n"
            "| B | not yet | (what it needs is missing; test: `tests/scenarios/errors/x.scn`) |\n"
            "| G | supported | `a \\| b` |\n"
        )
        problems, paths, rows = check(root)
        if problems.items or rows != 1 or paths < 3:
            print(f"self-test: the fixed tree fails: {problems.items}, {paths} paths, "
                  f"{rows} rows", file=sys.stderr)
            failed = True
    if failed:
        return 1
    print("docs self-test: a missing path, a stale item, a broken link, a glob matching "
          "nothing, a not-yet row without a test or with a missing one, 'not yet' in a "
          "supported row and a split cell are caught; ok")
    return 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    problems, paths, rows = check(ROOT)
    for f, n, m in problems.pending:
        print(f"{f}:{n}: {m}: left to the change rewriting {f}", file=sys.stderr)
    if problems.items:
        for f, n, m in problems.items:
            print(f"{f}:{n}: {m}")
        print(f"docs: {len(problems.items)} problem(s) ({paths} paths, {rows} not-yet rows "
              f"checked)", file=sys.stderr)
        return 1
    print(f"docs: {paths} paths checked, {rows} not-yet rows checked, ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
