use super::*;
use perch_core::name::EnvName;
use perch_core::tree::{FunctionId, Key, Node, Value};
use std::collections::BTreeMap;

const DECLARE: &[&str] = &["agent", "tool"];

fn run(file: &str, source: &str) -> Result<Evaluation, Vec<Problem>> {
    evaluate(file, source, DECLARE, Limits::CONFIG)
}

fn only_problem(result: Result<Evaluation, Vec<Problem>>) -> Problem {
    let problems = result.expect_err("the file should fail");
    assert_eq!(problems.len(), 1, "{problems:?}");
    problems.into_iter().next().expect("one problem")
}

fn node(line: u32, value: Value) -> Node {
    Node {
        pos: Pos::line(line),
        value,
    }
}

fn entry(line: u32, name: &str, value: Value) -> (Key, Node) {
    (
        Key {
            name: name.to_owned(),
            pos: Pos::line(line),
        },
        node(line, value),
    )
}

fn field<'n>(map: &'n Node, name: &str) -> &'n Value {
    let Value::Map(entries) = &map.value else {
        panic!("not a map: {map:?}");
    };
    &entries
        .iter()
        .find(|(key, _)| key.name == name)
        .unwrap_or_else(|| panic!("no key {name} in {map:?}"))
        .1
        .value
}

#[test]
fn declarations_record_their_line_and_converted_arguments() {
    let source = r#"
local shared = "x"
agent { model = "openai/gpt-5", tags = { "a", "b" }, limits = { cpus = 2, ratio = 1.0 }, empty = {} }
tool("search", {
  run = function(args) return args end,
  check = function() end,
})
"#;
    let evaluation = run("agent.lua", source).unwrap();
    let declarations = evaluation.declarations();
    assert_eq!(declarations.len(), 2);

    let agent = &declarations[0];
    assert_eq!(agent.function, "agent");
    assert_eq!(agent.pos, Pos::line(3));
    assert_eq!(
        agent.args,
        vec![node(
            3,
            Value::Map(vec![
                entry(3, "empty", Value::Map(vec![])),
                entry(
                    3,
                    "limits",
                    Value::Map(vec![
                        entry(3, "cpus", Value::Int(2)),
                        entry(3, "ratio", Value::Float(1.0)),
                    ])
                ),
                entry(3, "model", Value::Str("openai/gpt-5".into())),
                entry(
                    3,
                    "tags",
                    Value::List(vec![
                        node(3, Value::Str("a".into())),
                        node(3, Value::Str("b".into())),
                    ])
                ),
            ])
        )]
    );

    let tool = &declarations[1];
    assert_eq!(tool.function, "tool");
    assert_eq!(tool.pos, Pos::line(4));
    assert_eq!(tool.args.len(), 2);
    assert_eq!(tool.args[0], node(4, Value::Str("search".into())));
    assert_eq!(
        field(&tool.args[1], "check"),
        &Value::Function(FunctionId(0))
    );
    assert_eq!(field(&tool.args[1], "run"), &Value::Function(FunctionId(1)));
    assert_eq!(evaluation.functions.len(), 2);
}

#[test]
fn declarations_made_from_a_helper_take_the_helper_call_line() {
    let source = "local function declare(name)\n  tool(name, {})\nend\ndeclare('a')\n";
    let evaluation = run("tools/a.lua", source).unwrap();
    assert_eq!(evaluation.declarations()[0].pos, Pos::line(2));
    assert_eq!(evaluation.into_declarations().len(), 1);
}

#[test]
fn unsafe_globals_are_absent() {
    for global in [
        "io",
        "os.execute",
        "os.exit",
        "os.remove",
        "os.rename",
        "os.getenv",
        "os.tmpname",
        "os.setlocale",
        "require",
        "dofile",
        "loadfile",
        "load",
        "loadstring",
        "collectgarbage",
        "debug",
        "string.dump",
        "('').dump",
        "package",
    ] {
        let source = format!("assert({global} == nil, [[{global} is present]])");
        let result = run("agent.lua", &source);
        assert!(result.is_ok(), "{global}: {result:?}");
    }
}

#[test]
fn safe_libraries_and_print_work() {
    let source = r#"
print("x", 1, {})
assert(type(os.time()) == "number" and type(os.clock()) == "number")
assert(type(os.date("%Y")) == "string" and os.difftime(2, 1) == 1)
assert(string.upper("a") == "A" and table.concat({ "a", "b" }) == "ab")
assert(math.max(1, 2) == 2 and utf8.char(72) == "H")
assert(coroutine.wrap(function() coroutine.yield(7) end)() == 7)
"#;
    run("agent.lua", source).unwrap();
}

#[test]
fn bytecode_cannot_be_loaded() {
    let problem = only_problem(run("agent.lua", "\x1bLua\x54\x00"));
    assert!(problem.message.contains("binary"), "{problem}");
}

#[test]
fn an_endless_loop_stops_with_its_line() {
    let problem = only_problem(run("agent.lua", "local x = 1\n\nwhile true do end\n"));
    assert_eq!(
        problem.to_string(),
        "agent.lua:3: stopped after 20000000 Lua instructions (an endless loop?)\n  \
         fix: make the file finish: configuration runs once at load"
    );
}

#[test]
fn pcall_cannot_swallow_the_instruction_limit() {
    let limits = Limits {
        instructions: 100_000,
        ..Limits::CONFIG
    };
    for source in [
        "while true do pcall(function() while true do end end) end",
        "while true do pcall(function() for i = 1, 997 do end end) end",
        "while true do xpcall(function() while true do end end, function() while true do end end) end",
        "local co = coroutine.wrap(function() while true do end end)\nwhile true do pcall(co) end",
        "while true do pcall(coroutine.wrap(function() while true do end end)) end",
        "local co = coroutine.create(function() while true do pcall(error) end end)\n\
         while true do coroutine.resume(co) end",
    ] {
        let problems = evaluate("agent.lua", source, DECLARE, limits).expect_err(source);
        assert_eq!(problems.len(), 1, "{source}: {problems:?}");
        assert_eq!(
            problems[0].message, "stopped after 100000 Lua instructions (an endless loop?)",
            "{source}"
        );
    }
}

#[test]
fn finalizers_cannot_escape_the_instruction_limit() {
    let forever = "function() while true do end end";
    let problem = only_problem(run(
        "agent.lua",
        &format!("local a = 1\nsetmetatable({{}}, {{ __gc = {forever} }})"),
    ));
    assert_eq!(problem.pos, Pos::line(2));
    assert!(problem.message.contains("__gc"), "{problem}");

    let late = format!(
        "local mt = {{}}\nlocal t = setmetatable({{}}, mt)\nmt.__gc = {forever}\nt = nil\n\
         for i = 1, 100000 do local garbage = {{ i }} end\nagent {{}}"
    );
    let evaluation = run("agent.lua", &late).unwrap();
    drop(evaluation);
}

#[test]
fn setmetatable_and_xpcall_still_work() {
    let source = r#"
local t = setmetatable({}, { __index = function(_, key) return key .. "!" end })
assert(t.hi == "hi!")
local protected = setmetatable({}, { __metatable = "locked" })
assert(not pcall(setmetatable, protected, {}))
local ok, handled = xpcall(function(a) error({ code = a }) end, function(e) return e.code end, 7)
assert(not ok and handled == 7)
local ok2, a, b = xpcall(function(x) return x, 2 end, print, 1)
assert(ok2 and a == 1 and b == 2)
agent { t = getmetatable(t) ~= nil }
"#;
    let evaluation = run("agent.lua", source).unwrap();
    assert_eq!(
        evaluation.declarations()[0].args[0],
        node(10, Value::Map(vec![entry(10, "t", Value::Bool(true))]))
    );
}

#[test]
fn a_memory_bomb_stops_at_the_memory_limit() {
    let source = r#"local t = {} for i=1,1e9 do t[i] = string.rep("x", 1000) end"#;
    let problem = only_problem(run("agent.lua", source));
    assert_eq!(problem.pos, Pos::default());
    assert!(problem.message.contains("32 MiB memory limit"), "{problem}");
    assert!(problem.fix.is_some());
}

#[test]
fn declared_data_is_held_to_the_memory_limit() {
    let limits = Limits {
        memory_bytes: 1 << 20,
        ..Limits::CONFIG
    };
    let source = "local s = string.rep('x', 100000)\nfor i = 1, 20 do agent { s } end";
    let problems = evaluate("agent.lua", source, DECLARE, limits).expect_err("too much");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].message.contains("more than 1 MiB"),
        "{problems:?}"
    );
}

#[test]
fn env_holds_only_the_name() {
    let source = r#"
local path = env "PATH"
assert(not pcall(function() return "x" .. path end))
assert(not pcall(function() return path.value end))
assert(not pcall(function() return path < path end))
agent { token = path, shown = tostring(path) }
"#;
    let evaluation = run("agent.lua", source).unwrap();
    let args = &evaluation.declarations()[0].args;
    assert_eq!(field(&args[0], "token"), &Value::Env("PATH".into()));
    let Value::Str(shown) = field(&args[0], "shown") else {
        panic!("shown is not a string: {args:?}");
    };
    assert_eq!(shown, "env(\"PATH\")");
    if let Ok(value) = std::env::var("PATH") {
        assert!(!value.is_empty() && !shown.contains(&value));
    }
}

#[test]
fn env_refuses_an_invalid_name() {
    let problem = only_problem(run("sandbox.lua", "local a = 1\nlocal t = env \"1X\"\n"));
    assert_eq!(problem.pos, Pos::line(2));
    assert!(problem.message.contains(EnvName::RULE), "{problem}");
    assert!(problem.message.contains("\"1X\""), "{problem}");
    assert!(problem.fix.is_some());

    let problem = only_problem(run("sandbox.lua", "env(42)"));
    assert_eq!(problem.pos, Pos::line(1));
    assert!(problem.message.contains("integer"), "{problem}");
}

#[test]
fn a_syntax_error_names_its_line() {
    let problem = only_problem(run("sandbox.lua", "local a = 1\nlocal b = = 2\n"));
    assert_eq!(problem.file, "sandbox.lua");
    assert_eq!(problem.pos, Pos::line(2));
    assert!(problem.message.contains("unexpected symbol"), "{problem}");
    assert!(!problem.message.contains("sandbox.lua"), "{problem}");
    assert_eq!(
        problem.fix.as_deref(),
        Some("correct the Lua syntax on that line")
    );
}

#[test]
fn a_runtime_error_names_its_line_without_a_traceback() {
    let problem = only_problem(run("sandbox.lua", "local a = 1\nerror(\"boom\")\n"));
    assert_eq!(problem.pos, Pos::line(2));
    assert_eq!(problem.message, "boom");
    let shown = problem.to_string();
    assert!(shown.starts_with("sandbox.lua:2: boom"), "{shown}");
    assert!(
        !shown.contains("traceback") && !shown.contains("[string"),
        "{shown}"
    );
}

#[test]
fn long_file_names_still_give_the_line() {
    let file = format!("tools/{}.lua", "x".repeat(80));
    let problem = only_problem(run(&file, "\nerror('boom')"));
    assert_eq!(problem.pos, Pos::line(2));
    assert_eq!(problem.message, "boom");
}

#[test]
fn a_table_mixing_items_and_keys_is_reported_with_its_path() {
    let source = "\n\n\ntool('x', { params = { 'a', { 'b', name = 'c' } } })";
    let problem = only_problem(run("tools/x.lua", source));
    assert_eq!(
        problem.to_string(),
        "tools/x.lua:4: params[2]: a table mixes list items and named keys\n  \
         fix: use either a list { a, b } or named keys { a = 1 }, not both"
    );
}

#[test]
fn every_conversion_problem_of_a_file_is_collected() {
    let source = r#"
local cycle = {}
cycle.self = cycle
agent { gaps = { [1] = "a", [3] = "c" }, odd = { [true] = 1 }, half = { [1.5] = 1 } }
agent { cycle = cycle, thread = coroutine.create(function() end), bytes = "\xff" }
"#;
    let problems = run("agent.lua", source).expect_err("bad values");
    let shown: Vec<String> = problems
        .iter()
        .map(|problem| format!("{}:{}: {}", problem.pos.line, problem.path, problem.message))
        .collect();
    assert_eq!(
        shown,
        vec![
            "4:gaps: a list has gaps: its items must be numbered 1, 2, 3... without holes",
            "4:half: a table has the key [1.5]; keys must be names or list positions 1, 2, 3...",
            "4:odd: a table has a boolean key; keys must be names or list positions 1, 2, 3...",
            "5:bytes: a string is not valid UTF-8",
            "5:cycle.self: a table contains itself",
            "5:thread: a coroutine cannot be declared",
        ]
    );
}

#[test]
fn deep_nesting_is_reported() {
    let source = "local t = {}\nfor i = 1, 40 do t = { t } end\nagent { t }";
    let problem = only_problem(run("agent.lua", source));
    assert!(problem.message.contains("deeper than 32"), "{problem}");
    assert!(problem.path.starts_with("[1]"), "{problem}");
}

#[test]
fn the_hook_store_counts_its_json_size() {
    let mut store = HookStore::default();
    store
        .set("a".into(), serde_json::json!({ "b": [1, "x"] }))
        .unwrap();
    store.set("c\"".into(), serde_json::json!(true)).unwrap();
    let json = serde_json::to_string(store.entries()).unwrap();
    assert!(store.bytes >= json.len() && store.bytes <= json.len() + 1);
    store.set("a".into(), serde_json::Value::Null).unwrap();
    store.delete("c\"");
    assert!(store.entries().is_empty());
    assert_eq!(store.bytes, 2);
    assert!(store.set(String::new(), serde_json::json!(1)).is_err());
    let big = serde_json::json!("x".repeat(HookStore::MAX_BYTES));
    assert!(store.set("big".into(), big).is_err());
    assert!(store.entries().is_empty());
    assert!(HookStore::new(BTreeMap::from([("k".into(), serde_json::json!(1))])).is_ok());
}

/// Runs `work` on a thread of its own; a test of a budget escape fails rather than hangs
/// when the escape works.
fn within_seconds<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(work());
    });
    answer
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the Lua state ran past its limits (a hang)")
}

fn stopped_by_the_budget(source: &'static str) -> Vec<Problem> {
    let limits = Limits {
        instructions: 100_000,
        ..Limits::CONFIG
    };
    within_seconds(move || {
        evaluate("agent.lua", source, DECLARE, limits)
            .map(drop)
            .expect_err(source)
    })
}

/// A table whose metatable gets a `__close` handler that never returns after
/// `setmetatable`, past its check.
const FOREVER: &str = "local mt = {}\nlocal forever = setmetatable({}, mt)\n\
                       mt.__close = function() while true do end end\n";

const BUDGET: &str = "stopped after 100000 Lua instructions (an endless loop?)";

#[test]
fn close_handlers_and_loops_in_c_cannot_escape_the_instruction_limit() {
    let not_closable = "got a non-closable value";
    let escapes: [(&str, &str, &str); 19] = [
        (
            "__close given to setmetatable",
            "setmetatable({}, { __close = function() end })",
            "__close metamethods are not allowed in configuration",
        ),
        (
            "__close on the strings' metatable",
            "getmetatable('').__close = function() end",
            "attempt to index a nil value",
        ),
        (
            "<close> in a wrapped coroutine",
            "coroutine.wrap(function() local x <close> = forever; while true do end end)()",
            not_closable,
        ),
        (
            "<close> in a resumed coroutine",
            "local ok, e = coroutine.resume(coroutine.create(function() local x <close> = forever; while true do end end))\nerror(e)",
            not_closable,
        ),
        (
            "a for loop's closing value",
            "for _ in function() return true end, nil, nil, forever do end",
            not_closable,
        ),
        (
            "<close> at top level",
            "local x <close> = forever\nwhile true do end",
            not_closable,
        ),
        (
            "<close> in pcall",
            "local ok, e = pcall(function() local x <close> = forever; while true do end end)\nerror(e)",
            not_closable,
        ),
        (
            "<close> in xpcall",
            "xpcall(function() local x <close> = forever; while true do end end, function(e) error(e) end)",
            not_closable,
        ),
        (
            "__tostring from string.format",
            "string.format('%s', setmetatable({}, { __tostring = function() while true do end end }))",
            BUDGET,
        ),
        (
            "__index from table.concat",
            "table.concat(setmetatable({}, { __index = function() while true do end end }), '', 1, 2)",
            BUDGET,
        ),
        (
            "a table.sort comparator",
            "table.sort({ 3, 2, 1 }, function() while true do end end)",
            BUDGET,
        ),
        (
            "a gsub replacement function",
            "string.gsub('aaa', 'a', function() while true do end end)",
            BUDGET,
        ),
        (
            "string.rep of nothing, many times",
            "string.rep('', 1e15)",
            BUDGET,
        ),
        (
            "table.move over a huge range",
            "table.move({}, 1, 1e12, 2)",
            BUDGET,
        ),
        (
            "table.insert shifting a huge length",
            "table.insert(setmetatable({}, { __len = function() return 1e12 end }), 1, 1)",
            BUDGET,
        ),
        (
            "table.remove shifting a huge length",
            "table.remove(setmetatable({}, { __len = function() return 1e12 end }), 1)",
            BUDGET,
        ),
        (
            "setmetatable copying a huge metatable",
            "local big = {}\nfor i = 1, 5000 do big[i] = i end\nwhile true do setmetatable({}, big) end",
            BUDGET,
        ),
        (
            "the trim idiom on a run of spaces",
            "local s = 'x' .. string.rep(' ', 60000) .. 'y'\nlocal trimmed = s:match('^%s*(.-)%s*$')",
            BUDGET,
        ),
        (
            "nested quantifiers",
            "string.find(string.rep('a', 5000), '.-.-.-.-b')",
            BUDGET,
        ),
    ];
    for (name, body, expected) in escapes {
        let source: &'static str = Box::leak(format!("{FOREVER}{body}").into_boxed_str());
        let problems = stopped_by_the_budget(source);
        assert_eq!(problems.len(), 1, "{name}: {problems:?}");
        assert!(
            problems[0].message.contains(expected),
            "{name}: {problems:?}"
        );
    }
}

/// The channel file `source` evaluated, and the function its `channel { hook = ... }` holds.
fn channel_hook(source: &str) -> (Evaluation, FunctionId) {
    let evaluation = evaluate("channels/ops.lua", source, &["channel"], Limits::CONFIG)
        .unwrap_or_else(|problems| panic!("{problems:?}"));
    let Value::Map(entries) = &evaluation.declarations()[0].args[0].value else {
        panic!("not a map");
    };
    let Value::Function(hook) = entries[0].1.value else {
        panic!("not a function");
    };
    (evaluation, hook)
}

#[test]
fn metatables_perch_set_are_not_handed_out() {
    let source = "channel { hook = function(msg)\n  \
                  return { list = type(getmetatable(msg.list)) ~= 'table', text = getmetatable('') == nil }\nend }";
    let (evaluation, hook) = channel_hook(source);
    let returned = evaluation.call_hook_blocking(
        hook,
        &serde_json::json!({ "list": [1, 2] }),
        &mut HookStore::default(),
    );
    assert_eq!(
        returned,
        Ok(serde_json::json!({ "list": true, "text": true }))
    );
}

#[test]
fn a_call_stops_at_its_deadline() {
    let limits = Limits {
        instructions: u64::MAX,
        time: Some(std::time::Duration::from_millis(200)),
        ..Limits::CONFIG
    };
    let started = std::time::Instant::now();
    let problems = within_seconds(move || {
        evaluate(
            "agent.lua",
            "local a = 1\nwhile true do end",
            DECLARE,
            limits,
        )
        .map(drop)
        .expect_err("a deadline")
    });
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].pos, Pos::line(2));
    assert!(
        problems[0]
            .message
            .starts_with("stopped after running for 0.2 s"),
        "{problems:?}"
    );
}

#[test]
fn the_counted_string_and_table_functions_behave_as_lua_s() {
    let source = r##"
assert(("  hi  "):match("^%s*(.-)%s*$") == "hi")
assert(string.find("hello", "l") == 3)
local a, b = string.find("hello", "ll")
assert(a == 3 and b == 4)
assert(string.find("a.b", ".", 1, true) == 2)
assert(select("#", string.find("hello", "(h)(e)")) == 4)
assert(string.find("abc", "b", -1) == nil and string.find("abc", "c", -1) == 3)
assert(string.find("", "") == 1 and string.find("abc", "", 10) == nil)
assert(string.find(12345, 34) == 3)
assert(string.match("key", "()") == 1)
assert(string.match("2024-01-02", "(%d+)-(%d+)-(%d+)") == "2024")
assert(select(3, string.match("2024-01-02", "(%d+)-(%d+)-(%d+)")) == "02")
local replaced, count = string.gsub("hello world", "o", "0")
assert(replaced == "hell0 w0rld" and count == 2)
assert(string.gsub("abc", "%w", "%0%0") == "aabbcc")
assert(string.gsub("abc", "", "-") == "-a-b-c-")
assert(string.gsub("hello world", "(%w+)", "<%1>") == "<hello> <world>")
assert(string.gsub("$name is $age", "%$(%w+)", { name = "Ann", age = 3 }) == "Ann is 3")
assert(string.gsub("a b", "%w", function(w) return w:upper() end) == "A B")
assert(string.gsub("a b", "%w", function() return nil end) == "a b")
assert(string.gsub("hello", "l", "L", 1) == "heLlo")
assert(string.gsub("  x", "^%s+", "") == "x")
local words = {}
for word in ("one two  three"):gmatch("%a+") do words[#words + 1] = word end
assert(#words == 3 and words[3] == "three")
local pairs_seen = {}
for k, v in string.gmatch("a=1, b=2", "(%w+)=(%w+)") do pairs_seen[#pairs_seen + 1] = k .. v end
assert(table.concat(pairs_seen, ",") == "a1,b2")
assert(not pcall(string.find, "a", "[a"))
assert(not pcall(string.gsub, "a", "a", "%2"))
assert(not pcall(string.gsub, "a", "a", true))
assert(("x"):rep(3, ",") == "x,x,x")
assert(table.concat({ 1, 2, 3 }, ",") == "1,2,3")
local t = { 1, 2, 3 }
table.insert(t, 1, 0)
assert(t[1] == 0 and #t == 4)
table.insert(t, 9)
assert(t[5] == 9)
assert(table.remove(t, 1) == 0 and table.remove(t) == 9 and #t == 3)
table.sort(t, function(x, y) return x > y end)
assert(t[1] == 3 and t[3] == 1)
assert(table.move({ 1, 2, 3 }, 1, 3, 2)[3] == 2)
local co = coroutine.wrap(function(x) local y = coroutine.yield(x + 1) return y * 2 end)
assert(co(1) == 2 and co(5) == 10)
local ok, failure = pcall(coroutine.wrap(function() error("boom") end))
assert(not ok and failure:find("boom"))
local Class = {}
Class.__index = Class
local object = setmetatable({}, Class)
function Class.greet() return "hi" end
assert(object.greet() == "hi" and getmetatable(object) == Class)
local added = {}
local late = setmetatable({}, added)
added.__index = function() return "late" end
assert(late.x == nil, "a metamethod added after setmetatable is not used")
local nothing <close> = nil
agent {}
"##;
    run("agent.lua", source).unwrap_or_else(|problems| panic!("{problems:?}"));
}

#[test]
fn pattern_subjects_are_capped() {
    let source = "local a = 1\nstring.find(string.rep('x', 1024 * 1024 + 1), 'y')";
    let problem = only_problem(run("agent.lua", source));
    assert_eq!(problem.pos, Pos::line(2));
    assert_eq!(
        problem.message,
        "string.find: argument #1 is 1048577 bytes; patterns work on strings of at most 1 MiB"
    );
}

#[tokio::test]
async fn a_store_kept_past_its_call_cannot_be_used() {
    let source = "local kept\nchannel { hook = function(msg, store)\n  if kept then\n    \
                  kept.set('k', 1)\n  end\n  kept = store\n  store.set('n', msg.n)\n  \
                  return { text = store.get('missing') or 'none', n = msg.n }\nend }";
    let (evaluation, hook) = channel_hook(source);
    let mut store = HookStore::default();
    let first = evaluation
        .call_hook(
            hook,
            &serde_json::json!({ "n": 1, "gone": null }),
            &mut store,
        )
        .await;
    assert_eq!(first, Ok(serde_json::json!({ "text": "none", "n": 1 })));
    assert_eq!(store.get("n"), Some(&serde_json::json!(1)));
    let second = evaluation
        .call_hook(hook, &serde_json::json!({ "n": 2 }), &mut store)
        .await;
    assert_eq!(
        second,
        Err("channels/ops.lua:4: store.set: the store is usable only while the hook runs".into())
    );
    assert_eq!(store.get("n"), Some(&serde_json::json!(1)));
}

#[test]
fn evaluations_debug_without_lua_internals() {
    let evaluation = run("agent.lua", "agent { run = function() end }").unwrap();
    let shown = format!("{evaluation:?}");
    assert!(shown.contains("functions: 1"), "{shown}");
    assert!(!shown.contains("Lua("), "{shown}");
}

#[test]
fn a_call_of_an_unknown_global_names_the_nearest_declaration() {
    let problem = only_problem(run(
        "agent.lua",
        "agnet {\n  model = \"openai/gpt-5\",\n}\n",
    ));
    assert_eq!(
        problem.to_string(),
        "agent.lua:1: agnet is not a perch declaration\n  fix: did you mean agent?"
    );
    let problem = only_problem(run("agent.lua", "\nhelper()\n"));
    assert_eq!(
        problem.to_string(),
        "agent.lua:2: helper is not a perch declaration\n  fix: agent.lua declares with agent, \
         tool; a function of your own must be defined before it is called"
    );
}
