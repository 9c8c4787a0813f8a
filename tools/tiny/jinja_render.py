"""Renders a conversation with a chat template the way transformers' apply_chat_template
does (and kiln's Jinja engine, see docs/chat-templates.md)."""
import json

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def renderer(template_text):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    tmpl = env.from_string(template_text)

    def render(conv, add_generation_prompt=False):
        return tmpl.render(messages=conv["messages"], tools=conv.get("tools") or None,
                           documents=None, add_generation_prompt=add_generation_prompt,
                           bos_token="", eos_token="<|im_end|>")

    return render
