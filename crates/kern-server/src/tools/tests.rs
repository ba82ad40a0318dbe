//! The tagged (Hermes) format's parser on the cases that break parsers: a literal `</tool_call>`
//! inside an argument string, tools without parameters, several calls, text before calls, a
//! call cut off, bare call objects without tags (and JSON that only looks like one), and streaming in arbitrary fragments reassembling to the whole parse.

use super::*;

fn whole(text: &str) -> (String, Vec<Call>) {
    parse(&Tagged, text)
}

/// The output streamed in pieces of `n` characters: the pieces reassembled.
fn streamed(text: &str, n: usize) -> (String, Vec<Call>, Vec<Piece>) {
    let mut s = Tagged.stream();
    let chars: Vec<char> = text.chars().collect();
    let mut pieces = Vec::new();
    for chunk in chars.chunks(n) {
        pieces.extend(s.push(&chunk.iter().collect::<String>()));
    }
    pieces.extend(s.finish());
    let (c, calls) = assemble(pieces.clone());
    (c, calls, pieces)
}

fn call(name: &str, args: &str) -> Call {
    Call { name: name.into(), arguments: args.into() }
}

#[test]
fn calls_are_parsed_from_the_model_s_format() {
    let cases: Vec<(&str, &str, Vec<Call>)> = vec![
        ("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "", vec![call("get_weather", "{\"city\": \"Paris\"}")]),
        // A literal closing tag inside an argument string does not end the call.
        ("<tool_call>\n{\"name\": \"echo\", \"arguments\": {\"text\": \"a </tool_call> b\"}}\n</tool_call>", "", vec![call("echo", "{\"text\": \"a </tool_call> b\"}")]),
        // Tools without parameters: empty arguments stay `{}`, given or not.
        ("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", "", vec![call("now", "{}")]),
        ("<tool_call>\n{\"name\": \"now\"}\n</tool_call>", "", vec![call("now", "{}")]),
        // Several calls, text before them.
        (
            "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": [1, {\"z\": \"}\"}]}}\n</tool_call>",
            "Let me check.\n",
            vec![call("a", "{\"x\": 1}"), call("b", "{\"y\": [1, {\"z\": \"}\"}]}")],
        ),
        // Escaped quotes and braces in strings.
        ("<tool_call>{\"name\": \"q\", \"arguments\": {\"s\": \"say \\\"}\\\" {\"}}</tool_call>", "", vec![call("q", "{\"s\": \"say \\\"}\\\" {\"}")]),
        // No call: all text.
        ("Just text, no <tool_ call.", "Just text, no <tool_ call.", vec![]),
        // `parameters` instead of `arguments`, arguments given as a JSON string.
        ("<tool_call>{\"name\": \"p\", \"parameters\": {\"k\": true}}</tool_call>", "", vec![call("p", "{\"k\": true}")]),
        ("<tool_call>{\"name\": \"s\", \"arguments\": \"{\\\"k\\\": 2}\"}</tool_call>", "", vec![call("s", "{\"k\": 2}")]),
        // Bare call objects without the tags (small models write them so; other engines accept
        // them too): at the start of the output, one per line.
        ("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", "", vec![call("get_weather", "{\"city\": \"Paris\"}")]),
        (
            "\n {\"name\": \"a\", \"parameters\": {\"x\": 1}}\n{\"name\":\"b\",\"arguments\":{}}\n",
            "",
            vec![call("a", "{\"x\": 1}"), call("b", "{}")],
        ),
        // JSON that is not a call object stays text: other keys, text before it, no arguments key.
        ("{\"name\": \"Maria\", \"age\": 34}", "{\"name\": \"Maria\", \"age\": 34}", vec![]),
        ("Sure: {\"name\": \"a\", \"arguments\": {}}", "Sure: {\"name\": \"a\", \"arguments\": {}}", vec![]),
        ("{\"name\": \"a\"}", "{\"name\": \"a\"}", vec![]),
        ("{\"title\": \"x\"}", "{\"title\": \"x\"}", vec![]),
        ("{\"name\": \"a\", \"argument", "{\"name\": \"a\", \"argument", vec![]),
        // Cut off inside the arguments (max_tokens): the name and the arguments so far.
        ("<tool_call>\n{\"name\": \"cut\", \"arguments\": {\"a\": \"unfinis", "", vec![call("cut", "{\"a\": \"unfinis")]),
    ];
    for (text, content, calls) in cases {
        assert_eq!(whole(text), (content.to_string(), calls.clone()), "{text:?}");
        for n in [1, 2, 3, 7, 1000] {
            let (c, got, _) = streamed(text, n);
            assert_eq!((c.as_str(), &got), (content, &calls), "{text:?} in pieces of {n}");
        }
    }
}

#[test]
fn a_stream_names_the_call_before_its_arguments_arrive() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
    let (_, _, pieces) = streamed(text, 4);
    let first_args = pieces.iter().position(|p| matches!(p, Piece::Arguments { .. })).unwrap();
    assert!(matches!(&pieces[0], Piece::Start { index: 0, name } if name == "get_weather"), "{pieces:?}");
    assert!(pieces.iter().filter(|p| matches!(p, Piece::Arguments { .. })).count() > 3, "arguments arrive in fragments: {pieces:?}");
    assert!(first_args > 0);
}

#[test]
fn requests_are_read_and_grammars_written() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "now"}}]);
    let r = parse_request(Some(&tools), Some(&json!("required")), Some(&json!(false))).unwrap().unwrap();
    assert_eq!((r.tools.len(), &r.choice, r.parallel), (2, &Choice::Required, false));
    assert_eq!(r.tools[1].parameters["additionalProperties"], false, "no parameters: {{}} only");
    let g = Tagged.grammar(&r.tools, false);
    assert!(g.starts_with("start: call\n") && g.contains("%json {") && g.contains("\"const\":\"now\""), "{g}");
    assert!(Tagged.grammar(&r.tools, true).contains("(\"\\n\" call)*"));
    let named = parse_request(Some(&tools), Some(&json!({"type": "function", "function": {"name": "now"}})), None).unwrap().unwrap();
    assert_eq!(named.choice, Choice::Named("now".into()));
    let bad = |t: Value, c: Option<Value>| parse_request(Some(&t), c.as_ref(), None).unwrap_err().param.unwrap();
    assert_eq!(bad(json!([{"type": "web"}]), None), "tools[0].type");
    assert_eq!(bad(json!([{"type": "function", "function": {}}]), None), "tools[0].function.name");
    assert_eq!(bad(tools.clone(), Some(json!({"type": "function", "function": {"name": "nope"}}))), "tool_choice");
    assert_eq!(bad(tools.clone(), Some(json!("sometimes"))), "tool_choice");
    assert_eq!(parse_request(None, Some(&json!("required")), None).unwrap_err().param.unwrap(), "tool_choice");
    assert!(detect("... <tool_call> ...").is_some() && detect("plain").is_none());
}
