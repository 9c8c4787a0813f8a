#!/usr/bin/env python3
"""Generates the cases of output_parser_roundtrip_test.cpp: real chat templates (from
../shared/templates) render an assistant turn with tool calls through Jinja2, configured as
Hugging Face's apply_chat_template configures it; the text of that turn is what the model
is trained to write, so the output parser must read back exactly those calls.

Run: python3 tests/unit/chat/output_parser_roundtrip_gen.py > /tmp/cases.inc and paste the
printed cases into output_parser_roundtrip_test.cpp (the test does not run Python)."""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(ROOT, "..", "..", "..", "..", "shared", "templates")

ARGS_A = {"location": "München", "days": 3, "opts": {"metric": True, "tags": ["日本", "😀"]}}
ARGS_B = {"query": "a \"quoted\" {brace} </tool_call>? no", "n": 2.5}
ARGS_XML_B = {"query": "line one\nline two", "n": 2}  # |string-safe scalars for XML

# (template file, format, number of calls, content before the calls, xml-safe args)
ROWS = [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "kHermes", 2, "Let me check.", False),
    ("Qwen-Qwen3-0.6B.jinja", "kHermes", 2, "Let me check.", False),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "kHermes", 2, "", False),
    ("Qwen3-Coder.jinja", "kHermes", 2, "Let me check.", True),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "kLlama3", 1, None, False),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "kLlama3", 1, None, False),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "kMistral", 2, None, False),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "kMistral", 2, None, False),
    ("unsloth-mistral-Devstral-Small-2507.jinja", "kMistral", 2, None, False),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "kDeepSeek", 2, None, False),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "kDeepSeek", 2, None, False),
]

END_TOKENS = ["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<｜end▁of▁sentence｜>"]


def make_env():
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime(2026, 1, 2).strftime(f)
    return env


def render(env, source, messages, add_generation_prompt):
    tools = [{"type": "function", "function": {"name": n, "description": "d", "parameters": {
        "type": "object", "properties": {}}}} for n in ("get_weather", "search")]
    return env.from_string(source).render(messages=messages, tools=tools, bos_token="<s>",
                                          eos_token="</s>",
                                          add_generation_prompt=add_generation_prompt)


def cpp_string(s):
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def main():
    env = make_env()
    for file, fmt, num_calls, content, xml_safe in ROWS:
        with open(os.path.join(TEMPLATES, file), encoding="utf-8") as f:
            source = f.read()
        args = [ARGS_A, ARGS_XML_B if xml_safe else ARGS_B][:num_calls]
        if xml_safe:
            args[0] = {"location": "München", "days": 3, "opts": ARGS_A["opts"]}
        names = ["get_weather", "search"][:num_calls]
        calls = [{"id": "abc12345%d" % i, "type": "function",
                  "function": {"name": n, "arguments": a}}
                 for i, (n, a) in enumerate(zip(names, args))]
        user = {"role": "user", "content": "Weather in München?"}
        assistant = {"role": "assistant", "content": content or "", "tool_calls": calls}
        full = render(env, source, [user, assistant], False)
        prefix = render(env, source, [user], True)
        if not full.startswith(prefix):
            # The generation prompt differs from how history is written (DeepSeek writes
            # <think> in the prompt, not in history): the turn starts after the first
            # assistant marker.
            cut = full.find("<｜Assistant｜>")
            if cut < 0:
                sys.exit(f"{file}: cannot find the assistant turn")
            prefix = full[:cut + len("<｜Assistant｜>")]
        turn = full[len(prefix):]
        # The turn ends at its end-of-turn token (a stop token, never seen by the parser).
        ends = [turn.find(tok) for tok in END_TOKENS if tok in turn]
        if ends:
            turn = turn[:min(ends)]
        expected_content = (content or "").strip()
        print("    {%s, ToolFormat::%s, %s, %s, {" % (cpp_string(file), fmt, cpp_string(turn),
                                                     cpp_string(expected_content)))
        for n, a in zip(names, args):
            print("        {%s, %s}," % (cpp_string(n),
                                        cpp_string(json.dumps(a, ensure_ascii=False,
                                                              separators=(",", ":")))))
        print("    }},")


if __name__ == "__main__":
    main()
