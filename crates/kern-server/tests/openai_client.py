"""The official openai client against a kern server (its base URL the first argument;
`--no-thinking` second turns a thinking template's reasoning off):
structured output with `parse()` and a Pydantic model, and a full tool-calling loop — the
call, the tool's result sent back, the final answer — streamed and not. Run by
crates/kern-server/tests/structured.rs (the fake model) and scripts/gpu/structured.py's
checks reuse the same shapes on a real model. Exits non-zero on the first failure."""
import json
import sys
from typing import List, Literal

import openai
from pydantic import BaseModel, Field

base = sys.argv[1]
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
model = client.models.list().data[0].id
# The test server's model (the fake one) does not reason: thinking off for its thinking template.
extra = {"chat_template_kwargs": {"enable_thinking": False}} if len(sys.argv) > 2 and sys.argv[2] == "--no-thinking" else {}


class Weather(BaseModel):
    city: str = Field(max_length=24)
    temperature_c: int = Field(ge=-90, le=60)
    conditions: Literal["sunny", "cloudy", "rain", "snow"]
    tags: List[str] = Field(max_length=3)


beta = getattr(client, "beta", None)
parse = beta.chat.completions.parse if beta is not None and hasattr(beta.chat.completions, "parse") else client.chat.completions.parse
for seed in range(3):
    r = parse(model=model, messages=[{"role": "user", "content": "Weather in Paris as JSON."}], response_format=Weather, max_tokens=300, seed=seed, extra_body=extra)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "stop", r
    assert isinstance(m.parsed, Weather), m
    print(f"parse() seed {seed}: {m.parsed!r}")

tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
]
messages = [{"role": "user", "content": "What is the weather in Paris?"}]
# 1. The call (forced, as an agent that must act would ask).
r = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="required", max_tokens=200, temperature=0, extra_body=extra)
c = r.choices[0]
assert c.finish_reason == "tool_calls" and c.message.tool_calls, r
call = c.message.tool_calls[0]
args = json.loads(call.function.arguments)
assert call.function.name == "get_weather" and set(args) == {"city", "unit"} and args["unit"] in ("c", "f"), call
print(f"tool call: {call.function.name}({call.function.arguments}) id {call.id}")
# The same request streamed: the fragments reassemble to the same call.
streamed = {}
for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="required", max_tokens=200, temperature=0, stream=True, extra_body=extra):
    for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        name, frags = streamed.get(d.index, (None, ""))
        if d.function and d.function.name:
            name = d.function.name
        if d.function and d.function.arguments:
            frags += d.function.arguments
        streamed[d.index] = (name, frags)
whole = [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
assert [streamed[i] for i in sorted(streamed)] == whole, (streamed, whole)
# 2. The tool's result goes back; 3. the final answer.
messages.append(c.message.model_dump(exclude_none=True))
messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 21, "conditions": "sunny"})})
r = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="none", max_tokens=40, temperature=0, extra_body=extra)
final = r.choices[0]
assert final.finish_reason in ("stop", "length") and final.message.content and not final.message.tool_calls, r
print(f"final answer ({final.finish_reason}): {final.message.content[:60]!r}")
# A bad schema is a 400 the client raises, naming the problem.
try:
    client.chat.completions.create(model=model, messages=messages[:1], max_tokens=5,
        response_format={"type": "json_schema", "json_schema": {"name": "bad", "strict": True, "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}, extra_body=extra)
    raise AssertionError("no error")
except openai.BadRequestError as e:
    print(f"bad schema: 400 {e.message[:80]!r}")
print("openai client: PASS")
