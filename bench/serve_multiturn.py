#!/usr/bin/env python3
"""serve_multiturn.py PORT - a multi-turn workload against a running `kvq serve`
(docs/serve.md, prefix reuse): 4 conversations of 4 turns, each turn the
whole conversation so far plus a ~300-character question, 16 greedy tokens
per answer. Prints the prompt tokens sent, the tokens the server took over
from kept prefixes (kvq_prefix_reused_tokens_total), the summed time to
first token, and a digest of all answers (equal digests: equal answers).
Run it once against a server started with --prefix-cache N and once
without."""
import hashlib
import json
import re
import sys
import urllib.request

port = sys.argv[1]
text = open("models/passkey-3500.txt").read().replace('"', "")


def complete(prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 16, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body)
    return json.load(urllib.request.urlopen(req))


prompt_tokens, ttft, digest = 0, 0.0, hashlib.sha256()
for conv in range(4):
    p = text[conv * 200: conv * 200 + 1000]
    for turn in range(4):
        q = text[2000 + 300 * turn: 2300 + 300 * turn]
        p += f"\nUser: question {turn} of conversation {conv}: {q}\nAssistant:"
        r = complete(p)
        prompt_tokens += r["usage"]["prompt_tokens"]
        ttft += r["kvq"]["time_to_first_token_ms"] / 1e3
        a = r["choices"][0]["text"]
        digest.update(a.encode())
        p += a
metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
m = re.search(r"^kvq_prefix_reused_tokens_total (\d+)", metrics, re.M)
print(json.dumps({"prompt_tokens": prompt_tokens, "reused_tokens": int(m.group(1)) if m else 0,
                  "ttft_sum_s": round(ttft, 3), "answers_sha256": digest.hexdigest()[:16]}))
