"""Regenerates hf_config_cases.jsonl: inputs and what Python's json writer makes of them.

Run with any CPython 3: `python3 gen_hf_config.py > hf_config_cases.jsonl`. Each line is a JSON
array [input, expected]: `input` is compact JSON text of a config, `expected` is
`json.dumps(json.loads(input), indent=2, sort_keys=True) + "\n"`, the way Hugging Face writes
config files. The Rust test feeds `input` to `json::parse` and compares `hf_config_text`.
"""

import json
import math
import random
import struct
import sys

rng = random.Random(20240517)


def random_float():
    kind = rng.randrange(7)
    if kind == 6:
        # Few fraction bits: the shortest digits often tie, and Python rounds them to even.
        return (rng.getrandbits(rng.randint(20, 53)) + 1) / 2 ** rng.randint(1, 12)
    if kind == 0:
        # Any finite double, from its bits.
        while True:
            (f,) = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))
            if math.isfinite(f):
                return f
    if kind == 1:
        # Short decimals, as configs hold them (1e-05, 0.02, 10000.0).
        return float(f"{rng.randint(1, 999)}e{rng.randint(-12, 20)}") * rng.choice([1, -1])
    if kind == 2:
        # Near the notation switch at 1e-4 and 1e16.
        base = rng.choice([1e-5, 1e-4, 1e-3, 1e15, 1e16, 1e17])
        return base * rng.choice([1, 1 + 2**-52, 1 - 2**-53, 1.5, 9.99, 0.999999])
    if kind == 3:
        return rng.uniform(-1e6, 1e6)
    if kind == 4:
        return rng.choice([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1 / 3])
    return float(rng.randint(-(2**60), 2**60))


def random_text():
    chars = []
    for _ in range(rng.randrange(0, 8)):
        kind = rng.randrange(6)
        if kind == 0:
            chars.append(chr(rng.randrange(0, 0x20)))
        elif kind == 1:
            chars.append(rng.choice(['"', "\\", "/", "\x7f", " ", "~"]))
        elif kind == 2:
            chars.append(chr(rng.randrange(0x80, 0xD800)))
        elif kind == 3:
            chars.append(chr(rng.randrange(0xE000, 0x110000)))
        else:
            chars.append(chr(rng.randrange(0x21, 0x7F)))
    return "".join(chars)


def random_value(depth):
    kind = rng.randrange(9 if depth < 4 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2**64 - 1, -(2**63), 2**63, rng.randint(-(2**63), 2**64 - 1)])
    if kind in (3, 4):
        return random_float()
    if kind in (5, 6):
        return random_text()
    if kind == 7:
        return [random_value(depth + 1) for _ in range(rng.randrange(0, 5))]
    return {random_text(): random_value(depth + 1) for _ in range(rng.randrange(0, 5))}


def cases():
    yield {}
    yield []
    yield {"a": {}, "b": [], "c": [[]], "d": [{}]}
    yield {
        "architectures": ["BertModel"],
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 512,
        "torch_dtype": "float32",
        "transformers_version": "4.44.0",
        "use_cache": True,
        "rope_scaling": None,
    }
    for _ in range(400):
        yield {random_text(): random_value(1) for _ in range(rng.randrange(0, 6))}
    # Many floats per case: each goes through repr on its own line.
    for _ in range(24):
        yield {"floats": [random_float() for _ in range(250)]}


for case in cases():
    text = json.dumps(case, ensure_ascii=False, separators=(",", ":"))
    expected = json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    sys.stdout.write(json.dumps([text, expected]) + "\n")
