#!/usr/bin/env python3
"""spec/support/openapi_check.py INPUT.json: JSON Schema checks for the
OpenAPI spec (spec/94, spec/openapi_helpers.lua), with Debian's
python3-jsonschema (Draft 2020-12, the dialect of OpenAPI 3.1).

INPUT is {"document": the OpenAPI document, "items": [{"what": text,
"pointer": "#/...", "instance": JSON text}], "schemas": [pointer, ...]}.
Every schema named in "schemas" is checked against the 2020-12
metaschema; every item's instance is validated against the schema at its
pointer, resolved inside the document (the document itself is the root
schema, so its "$ref"s to #/components/schemas/... resolve as written).
Prints one line per failure; exits 1 when there was one, 0 otherwise."""
import json
import sys

from jsonschema import Draft202012Validator


def at(doc, pointer):
    node = doc
    for part in pointer.lstrip("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        data = json.load(f)
    doc = data["document"]
    failures = []
    for pointer in data.get("schemas", []):
        try:
            Draft202012Validator.check_schema(at(doc, pointer))
        except Exception as e:  # a bad pointer or a bad schema alike
            failures.append("%s: not a valid JSON Schema 2020-12: %s" % (pointer, str(e).splitlines()[0]))
    validators = {}
    for item in data.get("items", []):
        pointer = item["pointer"]
        if pointer not in validators:
            root = dict(doc)
            root["$ref"] = pointer
            validators[pointer] = Draft202012Validator(root)
        instance = json.loads(item["instance"])
        for err in validators[pointer].iter_errors(instance):
            path = "/".join(str(p) for p in err.absolute_path)
            failures.append("%s: at '%s': %s" % (item["what"], path, err.message[:300]))
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
