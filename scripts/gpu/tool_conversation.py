"""The tool-calling conversation of issue 27's checks (structured.py runs it through kern serve,
tool_first_token.py replays it in transformers): two tools and the first
turn. One definition, so every script asks the same question."""

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"},
                                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Get the current local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
]


def first_turn():
    """The conversation's first messages (a fresh list each call: the scripts append to it)."""
    return [{"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
            {"role": "user", "content": "What's the weather like in Paris right now?"}]
