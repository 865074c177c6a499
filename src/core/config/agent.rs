use super::{Declaration, single, table_argument};
use crate::name::ModelRef;
use crate::problem::{Pos, Problem};
use crate::tree::{Checker, Path};
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

/// `agent.lua`: `agent { model = "provider/id", thinking = "low" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentConfig {
    pub model: ModelRef,
    pub thinking: Thinking,
}

const USAGE: &str = "agent { model = \"openai/gpt-5\", thinking = \"low\" }";

/// Checks the declarations `agent.lua` made; returns the config and the line it was declared on.
pub fn check_agent(declarations: &[Declaration]) -> Result<(AgentConfig, Pos), Vec<Problem>> {
    let mut checker = Checker::new("agent.lua");
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
                    Ok(model) => Some(model),
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
        fields.finish(&mut checker, &["model", "thinking"]);
        Some((
            AgentConfig {
                model: model?,
                thinking: thinking?,
            },
            declaration.pos,
        ))
    });
    match config {
        Some(config) if !checker.has_problems() => Ok(config),
        _ => Err(checker.into_problems()),
    }
}
