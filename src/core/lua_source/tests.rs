use super::*;

fn kinds_and_texts(source: &str) -> Vec<(TokenKind, &str, u32)> {
    tokens(source)
        .into_iter()
        .map(|token| (token.kind, token.text, token.line))
        .collect()
}

#[test]
fn the_lexer_knows_strings_comments_long_brackets_and_numbers() {
    use TokenKind::{Keyword, Name, Number, String, Symbol};
    let source = "local a = 'it''s' -- a = 1\n\
                  b = \"q\\\"x\" --[[ c = 2\n d = 3 ]] e = [==[ ]] f = 4\n]==]\n\
                  g = 0x1F + 1.5e-3 .. ... ~= x[1]\r\n\
                  h = \"line\\\n  next\" i = 'a\\z\n   b'";
    assert_eq!(
        kinds_and_texts(source),
        vec![
            (Keyword, "local", 1),
            (Name, "a", 1),
            (Symbol, "=", 1),
            (String, "'it'", 1),
            (String, "'s'", 1),
            (Name, "b", 2),
            (Symbol, "=", 2),
            (String, "\"q\\\"x\"", 2),
            (Name, "e", 3),
            (Symbol, "=", 3),
            (String, "[==[ ]] f = 4\n]==]", 3),
            (Name, "g", 5),
            (Symbol, "=", 5),
            (Number, "0x1F", 5),
            (Symbol, "+", 5),
            (Number, "1.5e-3", 5),
            (Symbol, "..", 5),
            (Symbol, "...", 5),
            (Symbol, "~=", 5),
            (Name, "x", 5),
            (Symbol, "[", 5),
            (Number, "1", 5),
            (Symbol, "]", 5),
            (Name, "h", 6),
            (Symbol, "=", 6),
            (String, "\"line\\\n  next\"", 6),
            (Name, "i", 7),
            (Symbol, "=", 7),
            (String, "'a\\z\n   b'", 7),
        ]
    );
    let long = tokens("x = [[a\nb\nc]] y");
    assert_eq!((long[2].line, long[2].end_line), (1, 3));
    assert_eq!(long[3].line, 3);
}

#[test]
fn unfinished_strings_and_comments_end_where_lua_stops_reading_them() {
    let texts: Vec<&str> = tokens("a = \"open\nb = 1 --[[ never closed\nc = 2")
        .iter()
        .map(|token| token.text)
        .collect();
    assert_eq!(texts, vec!["a", "=", "\"open", "b", "=", "1"]);
    assert_eq!(tokens("x = [=[ open").len(), 3);
    assert_eq!(tokens("é = 1")[0].text, "é");
}

const AGENT: &str = r#"-- agent { modle = "commented out" }
local note = "modle = 'in a string'"

agent {
  model = "openai/gpt-5",
  thinking = [[
    modle = "in a long string"
  ]],
  spend = {
    cost_per_day = 20,
    tokens_per_dya = 5,   -- spend = { tokens_per_dya }
  },
  owner = "ops:owner",
  modle = 'x',
}
"#;

#[test]
fn a_key_path_leads_to_the_line_the_key_is_written_on() {
    let cases: &[(&str, Option<u32>)] = &[
        ("modle", Some(14)),
        ("model", Some(5)),
        ("thinking", Some(6)),
        ("spend", Some(9)),
        ("spend.tokens_per_dya", Some(11)),
        ("spend.cost_per_day", Some(10)),
        ("owner", Some(13)),
        ("nowhere", None),
        ("spend.nowhere", Some(9)),
        ("model.deeper", Some(5)),
        ("not a [path", None),
    ];
    for (path, line) in cases {
        assert_eq!(key_line(AGENT, 4, "agent", path), *line, "{path}");
    }
    assert_eq!(
        key_line(AGENT, 3, "agent", "modle"),
        None,
        "no call on that line"
    );
    assert_eq!(key_line(AGENT, 4, "sandbox", "modle"), None, "no such call");
}

#[test]
fn the_same_key_at_two_depths_is_told_apart() {
    let source = "channel {\n\
                  \x20 allow = {\n\
                  \x20   rooms = { \"1\" },\n\
                  \x20   bots = true,\n\
                  \x20 },\n\
                  \x20 rooms = {\n\
                  \x20   bots = \"2\",\n\
                  \x20 },\n\
                  \x20 bots = 1,\n\
                  }\n";
    assert_eq!(key_line(source, 1, "channel", "allow.bots"), Some(4));
    assert_eq!(key_line(source, 1, "channel", "rooms.bots"), Some(7));
    assert_eq!(key_line(source, 1, "channel", "bots"), Some(9));
    assert_eq!(key_line(source, 1, "channel", "allow.rooms"), Some(3));
    assert_eq!(key_line(source, 1, "channel", "rooms"), Some(6));
}

#[test]
fn lists_bracketed_keys_functions_and_table_arguments_are_walked() {
    let source = r#"tool("lookup", {
  description = "x",
  on_call = function(ctx)
    local t = { params = 1 }
    if ctx then return { params = 2 } end
  end,
  ["odd.key"] = 3,
  params = {
    { name = "a" },
    {
      name = "b",
      kind = "text",
    },
  },
})
sandbox { secrets = { [2] = { hosts = {} } } }
"#;
    assert_eq!(key_line(source, 1, "tool", "params"), Some(8));
    assert_eq!(key_line(source, 1, "tool", "params[2]"), Some(10));
    assert_eq!(key_line(source, 1, "tool", "params[2].kind"), Some(12));
    assert_eq!(
        key_line(source, 1, "tool", "lookup.params[2].kind"),
        Some(12)
    );
    assert_eq!(key_line(source, 1, "tool", "lookup"), None);
    assert_eq!(key_line(source, 1, "tool", "params[1].name"), Some(9));
    assert_eq!(key_line(source, 1, "tool", "params[3]"), Some(8));
    assert_eq!(key_line(source, 1, "tool", "odd.key"), Some(7));
    assert_eq!(key_line(source, 1, "tool", "on_call"), Some(3));
    assert_eq!(
        key_line(source, 16, "sandbox", "secrets[2].hosts"),
        Some(16)
    );
    let variable = "local t = { model = 1 }\nagent(t)\n";
    assert_eq!(key_line(variable, 2, "agent", "model"), None);
}

#[test]
fn of_a_repeated_key_the_last_one_counts_as_in_lua() {
    let source = "agent {\n  model = 1,\n  model = 2,\n}\n";
    assert_eq!(key_line(source, 1, "agent", "model"), Some(3));
}

#[test]
fn problems_on_a_call_line_move_to_their_key() {
    let mut problems = vec![
        Problem::new("agent.lua", Pos::line(4), "unknown key").with_path("spend.tokens_per_dya"),
        Problem::new("agent.lua", Pos::line(4), "missing model"),
        Problem::new("agent.lua", Pos::line(2), "boom").with_path("modle"),
        Problem::new("sandbox.lua", Pos::line(4), "x").with_path("modle"),
        Problem::new("agent.lua", Pos::at(4, 3), "x").with_path("modle"),
    ];
    point_at_keys(&mut problems, "agent.lua", AGENT, "agent");
    let lines: Vec<u32> = problems.iter().map(|problem| problem.pos.line).collect();
    assert_eq!(lines, vec![11, 4, 2, 4, 4]);
    assert_eq!(problems[4].pos.column, Some(3));
}

#[test]
fn a_missing_comma_is_found_where_the_field_before_it_ends() {
    let cases: &[(&str, u32, Option<u32>)] = &[
        // A string value, then the next key on a later line.
        (
            "agent {\n  model = \"x\"\n  thinking = \"low\",\n}\n",
            3,
            Some(2),
        ),
        // A nested table, comments and blank lines before the next key.
        (
            "agent {\n  spend = {\n    cost_per_day = 20,\n  }\n\n  -- the owner\n  owner = \"a:b\",\n}\n",
            7,
            Some(4),
        ),
        // A name value may go on as a call or an index; `name =` cannot continue it.
        ("t = {\n  a = b\n  c = 1,\n}\n", 3, Some(2)),
        ("t = {\n  a = b\n  [\"c\"] = 1,\n}\n", 3, Some(2)),
        ("t = {\n  a = \"x\"\n  [\"c\"] = 1,\n}\n", 3, Some(2)),
        // A list of strings.
        ("t = {\n  \"a\"\n  \"b\",\n}\n", 3, Some(2)),
        // A function value ends with `end`.
        (
            "t = {\n  f = function() return 1 end\n  g = 2,\n}\n",
            3,
            Some(2),
        ),
        // A long string ends on a later line than it starts.
        ("t = {\n  a = [[x\ny]]\n  b = 2,\n}\n", 4, Some(3)),
        // Separated fields, or a field that goes on legally on the next line.
        ("t = {\n  a = 1,\n  b = 2\n}\n", 4, None),
        ("t = {\n  a = f\n  \"x\",\n}\n", 3, None),
        ("t = {\n  a = t\n  [1],\n}\n", 3, None),
        ("t = {\n  a = 1\n  + 2,\n}\n", 3, None),
        // Statements in a function body are not fields.
        (
            "t = {\n  f = function()\n    local x = 1\n    y = 2\n  end,\n}\nz z\n",
            7,
            None,
        ),
        // Keys and values in strings and comments are not tokens.
        ("t = {\n  a = \"x\" -- b = 1\n  , c = 2\n}\n", 4, None),
        // Only places at or before the error's line count.
        ("t = {\n  a = 1\n  b = 2,\n}\n", 2, None),
    ];
    for (source, error_line, expected) in cases {
        assert_eq!(
            missing_separator(source, *error_line),
            *expected,
            "{source}"
        );
    }
}

#[test]
fn the_last_complete_token_before_a_failure_is_found() {
    let source = "local a = 1\nlocal b = (a +\n\n  )\n";
    assert_eq!(line_before_failure(source, 4, Some(")")), Some(2));
    assert_eq!(line_before_failure("local b = = 2\n", 1, Some("=")), None);
    assert_eq!(line_before_failure("x = {\n  a = 1,\n", 3, None), Some(2));
    assert_eq!(line_before_failure("x = 1\n", 9, Some("nowhere")), None);
}
