#!/usr/bin/env python3
"""Soundness oracle of the grammar tests: every output that test_grammar's random walks wrote
(<dir>/<vocab>.<schema name>.jsonl, one JSON text per line) must validate against its schema
in tests/fixtures/grammar/suite.json, with Debian's python3-jsonschema (formats checked).

usage: validate.py OUTPUT_DIR REPO_ROOT
"""
import json
import pathlib
import sys

import jsonschema


def main():
    out_dir = pathlib.Path(sys.argv[1])
    root = pathlib.Path(sys.argv[2])
    suite = json.loads((root / "tests/fixtures/grammar/suite.json").read_text(encoding="utf-8"))
    schemas = {s["name"]: s["schema"] for s in suite}
    files = sorted(out_dir.glob("*.jsonl"))
    if not files:
        print(f"no outputs in {out_dir}")
        return 1
    checked = 0
    bad = 0
    seen = set()
    for f in files:
        vocab, name = f.stem.split(".", 1)
        seen.add(name)
        validator = jsonschema.Draft202012Validator(schemas[name],
                                                    format_checker=jsonschema.FormatChecker())
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                inst = json.loads(line)
                validator.validate(inst)
            except (ValueError, jsonschema.ValidationError) as e:
                bad += 1
                print(f"INVALID {vocab}/{name}: {line[:300]}\n  {str(e).splitlines()[0]}")
            checked += 1
    missing = set(schemas) - seen
    if missing:
        print(f"no outputs for {sorted(missing)}")
        return 1
    print(f"{checked} outputs checked, {bad} invalid")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
