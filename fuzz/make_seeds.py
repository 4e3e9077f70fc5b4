#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, from tests/scenarios/*.scn and examples/.

Writes fuzz/seeds/<target>/<name>, or DIR/<target>/<name> with `make_seeds.py DIR`
(regenerated on every call; scripts/fuzz.sh calls it, and so does the workspace test
crates/strata-engine/tests/fuzz_smoke.rs, into a temp dir):
- sql_parse_plan: every scenario's `pipeline` block, examples/*/pipeline.sql and the SQL
  libraries of the examples, the ```sql examples of docs/*.md and README.md;
- yaml_spec: every `file *.yaml` block of the scenarios, the examples' YAML specs and the
  ```yaml examples of the docs;
- read_files: every JSON and CSV input of the scenarios and one per folder of the examples
  (first 40 lines), behind a mode byte (see fuzz_targets/read_files.rs: '0' JSON inferred,
  '6' JSON declared + SCD2 flow; '1', '7' the same for CSV; alternating per file), and
  the first two consecutive input files of one format of each scenario as one input.
"""
import hashlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "fuzz" / "seeds"
MAX_LINES = 40


def blocks(scn: str):
    """(directive, body) of each block of a scenario file."""
    out = []
    for chunk in scn.split("\n\n"):
        lines = [line for line in chunk.split("\n") if not line.startswith("#")]
        while lines and not lines[0].strip():
            lines.pop(0)
        if lines:
            out.append((lines[0].strip(), "\n".join(lines[1:]) + "\n"))
    return out


def head(text: str) -> str:
    return "\n".join(text.split("\n")[:MAX_LINES]) + "\n"


def put(target: str, data: bytes):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


JSON_MODES = b"06"
CSV_MODES = b"17"


def data_file(path: str, body: str, inputs: list):
    ext = path.rsplit(".", 1)[-1].lower()
    if ext in ("json", "jsonl"):
        modes = JSON_MODES
    elif ext == "csv":
        modes = CSV_MODES
    else:
        return
    text = head(body).encode()
    # One mode per file, alternating, to keep the corpus small (each run costs ~0.1 s).
    m = modes[len(inputs) % 2]
    put("read_files", bytes([m]) + text)
    inputs.append((modes, text))


def main():
    global OUT
    if len(sys.argv) > 1:
        OUT = pathlib.Path(sys.argv[1]).resolve()
    for f in sorted((ROOT / "tests" / "scenarios").glob("*.scn")):
        inputs = []
        for directive, body in blocks(f.read_text()):
            if directive == "pipeline":
                put("sql_parse_plan", body.encode())
            elif directive.startswith("file "):
                path = directive[5:].strip()
                if path.endswith((".yaml", ".yml")):
                    put("yaml_spec", body.encode())
                elif path.endswith(".sql"):
                    put("sql_parse_plan", body.encode())
                else:
                    data_file(path, body, inputs)
        # One two-file input per scenario, in the mode with a flow.
        for (m1, a), (m2, b) in zip(inputs, inputs[1:]):
            if m1 == m2:
                put("read_files", bytes([m1[1]]) + a + b"\0" + b)
                break
    ex = ROOT / "examples"
    seen_dirs = set()
    for p in sorted(ex.rglob("*")):
        if not p.is_file():
            continue
        if p.suffix == ".sql":
            put("sql_parse_plan", p.read_bytes())
        elif p.suffix in (".yaml", ".yml"):
            put("yaml_spec", p.read_bytes())
        elif p.suffix in (".json", ".csv") and p.parent not in seen_dirs:
            # One file per folder: the others have the same shape.
            seen_dirs.add(p.parent)
            data_file(p.name, p.read_text(errors="replace"), [])
    # Fenced examples of the docs.
    for md in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        parts = md.read_text().split("```")
        for i in range(1, len(parts), 2):
            lang, _, body = parts[i].partition("\n")
            if lang.strip() == "sql":
                put("sql_parse_plan", body.encode())
            elif lang.strip() in ("yaml", "yml"):
                put("yaml_spec", body.encode())
    # The change events of the property tests, and the documented example.
    put("read_files", b'6{"id": 1, "name": "a", "city": null, "op": "U", "seq": 1}\n'
        b'{"id": 1, "name": null, "city": "b", "op": "D", "seq": 11}\n\0'
        b'{"id": 1, "name": "b", "city": "a", "op": "U", "seq": 5}\n')
    put("read_files", b"7id,name,city,op,seq,ts,amount,ok,day\n"
        b"1,a,,U,1,2024-01-01T00:00:00,1.25,true,2024-01-01\n"
        b"1,,b,D,3,,,,\n")
    # Minimal specs around the harness's lib.sql.
    put("yaml_spec", b"name: p\nlibraries: [lib.sql]\nconfiguration: {source_root: data}\n")
    put("yaml_spec", b"name: p\nschema: s\nconfiguration: {source_root: d}\nlibraries: [lib.sql]\n"
        b"tables:\n  - name: c\n    source: {table: orders_raw}\n    keys: [id]\n"
        b"    sequence_by: ts\n    scd_type: 2\n    track_history_except: [amount]\n"
        b"    table_properties: {strata.scd.convention: kimball}\n")
    put("yaml_spec", b"name: p\ntables:\n  - name: s\n    source: {path: snap, format: csv, header: true}\n"
        b"    keys: [id, region]\n    snapshot_version_by: v\n    stored_as: SNAPSHOTS\n"
        b"    columns: [id, region, v]\n")
    counts = {t.name: len(list(t.iterdir())) for t in sorted(OUT.iterdir())}
    print("seeds:", ", ".join(f"{k} {v}" for k, v in counts.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
