#!/usr/bin/env python3
"""Makes needle-in-a-haystack prompts in the format of models/tiny-qwen3/README.md ("NIAH format"),
from any held-out text: a second sample to check figures that were tuned on data/niah_dev.jsonl.

Each prompt: a contiguous run of the text's tokens ending with a newline, 1-4 needle lines
"# secret {word}-{n}: {7 digits}" inserted at line starts before unindented lines (positions uniform
over such points, distinct words), then "# the secret {key} is" for one of them. The prompt
tokenizes to exactly target_len - 8 tokens (the answer is a space and 7 digits): needle and query
lines splice into the haystack's tokens without changing them (the format's insertion points), so
the haystack is target_len - 8 minus their tokens; a haystack whose cut start re-encodes
differently is redrawn, and every written prompt is re-tokenized to check it.

Only the standard library and the oscar binary (`oscar tokenize`) are used. Deterministic for a
given text, seed and argument list.

  scripts/make_niah.py --text models/tiny-qwen3/data/dev_eval.txt --out niah_heldout.jsonl \
      --lengths 8192 --per-length 150 --seed 2026
"""
import argparse
import json
import random
import subprocess
import sys

WORDS = """apple river mountain garden window rocket silver forest planet candle bridge dragon harbor
island jungle kitten lemon marble needle orange pencil rabbit saddle tiger violin wagon yellow zebra
anchor basket cactus desert engine falcon glacier hammer igloo jacket kettle ladder magnet nectar
oyster parrot quartz ribbon salmon teapot umbrella valley walnut xylophone yacht zephyr beacon copper
dolphin ember feather granite hazel ivory jasmine lantern""".split()
EOT = "<|endoftext|>"
ANSWER_TOKENS = 8


class Tokenizer:
    """`oscar tokenize` through files on stdin: encode(text) -> ids, decode(ids) -> exact text."""

    def __init__(self, oscar, model):
        self.base = [oscar, "tokenize", "--model", model]

    def encode_with_line_ends(self, text):
        """ids, and the indices of the tokens whose text ends with a newline ('Ċ' byte-level)."""
        r = subprocess.run(self.base + ["--tokens", "--file", "-"], input=text.encode(),
                           capture_output=True, check=True)
        out = r.stdout.decode().split("\n")
        ids = [int(x) for x in out[0].split()]
        line_ends = [i for i, row in enumerate(out[1:1 + len(ids)]) if row.endswith("\u010a")]
        return ids, line_ends

    def encode(self, text):
        r = subprocess.run(self.base + ["--file", "-"], input=text.encode(), capture_output=True,
                           check=True)
        return [int(x) for x in r.stdout.split()]

    def decode(self, ids):
        r = subprocess.run(self.base + ["--decode", "--file", "-"],
                           input=" ".join(map(str, ids)).encode(), capture_output=True, check=True)
        return r.stdout.decode()


def insertion_points(text):
    """Line starts after a newline (or <|endoftext|>) whose line does not start with whitespace,
    and the very end."""
    points = []
    for i in range(1, len(text) + 1):
        after_break = text[i - 1] == "\n" or text.endswith(EOT, 0, i)
        if not after_break:
            continue
        if i == len(text) or text[i] not in " \t\r\n":
            points.append(i)
    return points


def make_prompt(tok, stream, line_ends, target_len, rng, index):
    n_needles = rng.randint(1, 4)
    words = rng.sample(WORDS, n_needles)
    needles = [{"key": f"{w}-{rng.randint(1, 99)}", "value": str(rng.randint(1000000, 9999999))}
               for w in words]
    query = rng.choice(needles)
    want = target_len - ANSWER_TOKENS
    lines = "".join(f"# secret {n['key']}: {n['value']}\n" for n in needles)
    n_hay = want - len(tok.encode(lines + f"# the secret {query['key']} is"))
    for _ in range(20):
        # The haystack ends with a token that ends a line, and starts wherever that puts it (mid-line
        # is allowed); a start whose partial token re-encodes differently is simply retried.
        end = rng.choice(line_ends[n_hay:]) + 1
        hay = tok.decode(stream[end - n_hay:end])
        points = insertion_points(hay)
        at = sorted((rng.choice(points), k) for k in range(n_needles))
        text, prev, depth = "", 0, {}
        for pos, k in at:
            text += hay[prev:pos]
            depth[k] = round(pos / max(1, len(hay)), 4)  # by characters
            text += f"# secret {needles[k]['key']}: {needles[k]['value']}\n"
            prev = pos
        prompt = text + hay[prev:] + f"# the secret {query['key']} is"
        if len(tok.encode(prompt)) == want:
            return {
                "id": f"heldout-{target_len}-{index:03d}",
                "target_len": target_len,
                "n_prompt_tokens": want,
                "n_answer_tokens": ANSWER_TOKENS,
                "prompt": prompt,
                "answer": query["value"],
                "key": query["key"],
                "n_needles": n_needles,
                "depth": depth[needles.index(query)],
                "needles": [dict(n, depth=depth[k]) for k, n in enumerate(needles)],
            }
    raise RuntimeError(f"prompt {index} at {target_len}: no haystack gave {want} tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", required=True, help="held-out text (never seen in training)")
    ap.add_argument("--out", required=True, help="JSON-lines file to write")
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192])
    ap.add_argument("--per-length", type=int, default=100)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--oscar", default="build/apps/oscar")
    ap.add_argument("--model", default="models/tiny-qwen3")
    a = ap.parse_args()
    tok = Tokenizer(a.oscar, a.model)
    with open(a.text, encoding="utf-8") as f:
        stream, line_ends = tok.encode_with_line_ends(f.read())
    rng = random.Random(a.seed)
    with open(a.out, "w", encoding="utf-8") as out:
        for length in a.lengths:
            for i in range(a.per_length):
                row = make_prompt(tok, stream, line_ends, length, rng, i)
                assert len(tok.encode(row["prompt"])) == row["n_prompt_tokens"]
                out.write(json.dumps(row) + "\n")
                print(f"\r{length}: {i + 1}/{a.per_length}", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)


if __name__ == "__main__":
    main()
