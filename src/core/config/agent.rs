use super::{Declaration, single, table_argument};
use crate::heartbeat::Target;
use crate::name::ModelRef;
use crate::problem::{Pos, Problem};
use crate::spend::{Caps, MAX_MONEY_UNITS, Money, SpendPolicy};
use crate::tree::{Checker, Node, Path, Value};
use serde::Serialize;

/// How hard the model thinks before it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Thinking {
    Off,
    Low,
    Medium,
    High,
}

impl Thinking {
    pub const NAMES: [&'static str; 4] = ["off", "low", "medium", "high"];

    pub fn parse(text: &str) -> Option<Thinking> {
        match text {
            "off" => Some(Thinking::Off),
            "low" => Some(Thinking::Low),
            "medium" => Some(Thinking::Medium),
            "high" => Some(Thinking::High),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        Thinking::NAMES[self as usize]
    }
}

/// `agent.lua`: `agent { model = "provider/id", thinking = "low", spend = { ... }, owner = "..." }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentConfig {
    pub model: ModelRef,
    pub thinking: Thinking,
    /// The daily spend caps; without `spend`, the built-in one.
    pub spend: SpendPolicy,
    /// Where alerts for the owner go: a room one of the agent's channels declares (checked
    /// against the channels when the whole agent is loaded). Without one, alerts go to the log.
    pub owner: Option<Target>,
}

const USAGE: &str = "agent { model = \"openai/gpt-5\", thinking = \"low\" }";

const KEYS: &[&str] = &["model", "thinking", "spend", "owner"];

const SPEND_KEYS: &[&str] = &["tokens_per_day", "cost_per_day"];

const SPEND_FIX: &str = "write spend = { tokens_per_day = 2000000, cost_per_day = 20 } (either \
                         cap may be left out), or spend = false to run uncapped";

/// The largest `tokens_per_day`.
const MAX_TOKENS_PER_DAY: i64 = 1_000_000_000_000;

/// `agent.lua` refused: every problem, and the model it names when that much could be read, so
/// the model is still checked against `models.yml` and every problem is reported at once.
#[derive(Debug)]
pub struct AgentRefused {
    pub problems: Vec<Problem>,
    pub model: Option<(ModelRef, Pos)>,
}

/// Checks the declarations `agent.lua` made; returns the config and the line it was declared on.
pub fn check_agent(declarations: &[Declaration]) -> Result<(AgentConfig, Pos), AgentRefused> {
    let mut checker = Checker::new("agent.lua");
    let mut named_model = None;
    let config = single(&mut checker, declarations, "agent", USAGE).and_then(|declaration| {
        let table = table_argument(&mut checker, declaration, USAGE)?;
        let mut fields = checker.fields(table, &Path::root())?;
        let model = fields
            .required(
                &mut checker,
                "model",
                "name a model from models.yml: model = \"provider/id\"",
            )
            .and_then(|node| {
                let text = checker.str(node, &Path::root().key("model"))?;
                match ModelRef::parse(text) {
                    Ok(model) => {
                        named_model = Some((model.clone(), declaration.pos));
                        Some(model)
                    }
                    Err(reason) => {
                        checker.report_fix(
                            node.pos,
                            &Path::root().key("model"),
                            reason,
                            "write it as provider/model-id",
                        );
                        None
                    }
                }
            });
        let thinking = match fields.optional("thinking") {
            None => Some(Thinking::Off),
            Some(node) => checker
                .str(node, &Path::root().key("thinking"))
                .and_then(|text| {
                    let parsed = Thinking::parse(text);
                    if parsed.is_none() {
                        checker.report_fix(
                            node.pos,
                            &Path::root().key("thinking"),
                            format!("unknown thinking level {text:?}"),
                            format!("use one of {}", Thinking::NAMES.join(", ")),
                        );
                    }
                    parsed
                }),
        };
        let spend = match fields.optional("spend") {
            None => Some(SpendPolicy::BuiltIn),
            Some(node) => read_spend(&mut checker, node, &Path::root().key("spend")),
        };
        let owner = match fields.optional("owner") {
            None => Some(None),
            Some(node) => read_owner(&mut checker, node, &Path::root().key("owner")).map(Some),
        };
        fields.finish(&mut checker, KEYS);
        Some((
            AgentConfig {
                model: model?,
                thinking: thinking?,
                spend: spend?,
                owner: owner?,
            },
            declaration.pos,
        ))
    });
    match config {
        Some(config) if !checker.has_problems() => Ok(config),
        _ => Err(AgentRefused {
            problems: checker.into_problems(),
            model: named_model,
        }),
    }
}

/// `spend = { tokens_per_day = N, cost_per_day = X }` or `spend = false`.
fn read_spend(checker: &mut Checker, node: &Node, path: &Path) -> Option<SpendPolicy> {
    match &node.value {
        Value::Bool(false) => return Some(SpendPolicy::Off),
        Value::Bool(true) => {
            checker.report_fix(node.pos, path, "spend = true names no cap", SPEND_FIX);
            return None;
        }
        Value::Map(_) => {}
        Value::List(items) if items.is_empty() => {}
        other => {
            checker.report_fix(
                node.pos,
                path,
                format!("expected a table of caps or false, found {}", other.kind()),
                SPEND_FIX,
            );
            return None;
        }
    }
    let mut fields = checker.fields(node, path)?;
    let tokens = fields
        .optional("tokens_per_day")
        .map(|node| checker.int_in(node, &path.key("tokens_per_day"), 1..=MAX_TOKENS_PER_DAY));
    let cost = fields.optional("cost_per_day").map(|node| {
        let cost_path = path.key("cost_per_day");
        let amount = checker.number(node, &cost_path)?;
        match Money::from_units(amount) {
            Some(money) if money > Money::ZERO => Some(money),
            _ => {
                checker.report_fix(
                    node.pos,
                    &cost_path,
                    format!("{amount} is not a daily cost cap"),
                    format!(
                        "use an amount above 0 and at most {MAX_MONEY_UNITS}, in the currency \
                         of models.yml's prices"
                    ),
                );
                None
            }
        }
    });
    fields.finish(checker, SPEND_KEYS);
    if tokens.is_none() && cost.is_none() {
        let empty = matches!(&node.value, Value::Map(entries) if entries.is_empty())
            || matches!(&node.value, Value::List(_));
        if empty {
            checker.report_fix(node.pos, path, "spend names no cap", SPEND_FIX);
        }
        return None;
    }
    let caps = Caps {
        tokens_per_day: match tokens {
            None => None,
            Some(tokens) => Some(u64::try_from(tokens?).ok()?),
        },
        cost_per_day: match cost {
            None => None,
            Some(cost) => Some(cost?),
        },
    };
    Some(SpendPolicy::Set(caps))
}

/// `owner = "<channel>:<room alias>[/<thread>]"`.
fn read_owner(checker: &mut Checker, node: &Node, path: &Path) -> Option<Target> {
    let text = checker.str(node, path)?;
    match Target::parse(text) {
        Ok(target) => Some(target),
        Err(error) => {
            checker.report_fix(
                node.pos,
                path,
                error,
                "write <channel>:<room alias>[/<thread>] naming a room of channels/<channel>.lua, \
                 such as owner = \"ops:owner\"",
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::build::{map_at, node_at};

    fn node(value: Value) -> Node {
        node_at(4, value)
    }

    fn map(entries: Vec<(&str, Value)>) -> Value {
        map_at(4, entries)
    }

    fn check(extra: Vec<(&str, Value)>) -> Result<AgentConfig, Vec<String>> {
        let mut entries = vec![("model", Value::Str("openai/gpt-5".into()))];
        entries.extend(extra);
        let declarations = vec![Declaration {
            function: "agent".into(),
            pos: Pos::line(4),
            args: vec![node(map(entries))],
        }];
        check_agent(&declarations)
            .map(|(config, _)| config)
            .map_err(|refused| refused.problems.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn without_spend_the_built_in_cap_applies_and_alerts_go_nowhere() {
        let config = check(Vec::new()).unwrap();
        assert_eq!(config.spend, SpendPolicy::BuiltIn);
        assert_eq!(config.owner, None);
    }

    #[test]
    fn spend_and_owner_read_back() {
        let config = check(vec![
            (
                "spend",
                map(vec![
                    ("tokens_per_day", Value::Int(2_000_000)),
                    ("cost_per_day", Value::Float(20.5)),
                ]),
            ),
            ("owner", Value::Str("ops:owner/7".into())),
        ])
        .unwrap();
        assert_eq!(
            config.spend,
            SpendPolicy::Set(Caps {
                tokens_per_day: Some(2_000_000),
                cost_per_day: Some(Money::from_units(20.5).unwrap()),
            })
        );
        assert_eq!(config.owner, Some(Target::parse("ops:owner/7").unwrap()));
        let only_cost =
            check(vec![("spend", map(vec![("cost_per_day", Value::Int(20))]))]).unwrap();
        assert_eq!(
            only_cost.spend.caps(),
            Caps {
                tokens_per_day: None,
                cost_per_day: Some(Money::from_units(20.0).unwrap()),
            }
        );
        assert_eq!(
            check(vec![("spend", Value::Bool(false))]).unwrap().spend,
            SpendPolicy::Off
        );
    }

    #[test]
    fn bad_spend_and_owner_are_reported_with_their_line_and_fix() {
        let cases: Vec<(Vec<(&str, Value)>, &str)> = vec![
            (
                vec![("spend", map(Vec::new()))],
                "agent.lua:4: spend: spend names no cap\n  fix: write spend = { tokens_per_day",
            ),
            (
                vec![("spend", Value::Bool(true))],
                "agent.lua:4: spend: spend = true names no cap",
            ),
            (
                vec![("spend", Value::Int(100))],
                "agent.lua:4: spend: expected a table of caps or false, found an integer",
            ),
            (
                vec![("spend", map(vec![("tokens_per_day", Value::Int(0))]))],
                "agent.lua:4: spend.tokens_per_day: 0 is out of range; use a value from 1 to",
            ),
            (
                vec![(
                    "spend",
                    map(vec![("tokens_per_day", Value::Str("lots".into()))]),
                )],
                "agent.lua:4: spend.tokens_per_day: expected an integer, found a string",
            ),
            (
                vec![("spend", map(vec![("cost_per_day", Value::Float(-1.0))]))],
                "agent.lua:4: spend.cost_per_day: -1 is not a daily cost cap\n  fix: use an \
                 amount above 0",
            ),
            (
                vec![("spend", map(vec![("tokens_per_dya", Value::Int(5))]))],
                "agent.lua:4: spend.tokens_per_dya: unknown key\n  fix: did you mean \
                 tokens_per_day?",
            ),
            (
                vec![("owner", Value::Str("ops".into()))],
                "agent.lua:4: owner: \"ops\" names no room",
            ),
            (
                vec![("owner", Value::Int(3))],
                "agent.lua:4: owner: expected a string, found an integer",
            ),
        ];
        for (extra, expected) in cases {
            let problems = check(extra).unwrap_err();
            assert!(
                problems.first().is_some_and(|p| p.starts_with(expected)),
                "expected {expected:?}, got {problems:#?}"
            );
        }
    }
}
