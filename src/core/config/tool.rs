use super::Declaration;
use crate::name::ToolName;
use crate::problem::{Pos, Problem};
use crate::tree::{Checker, FunctionId, Node, Path, Value};
use serde::Serialize;
use serde_json::json;

/// Tools perch provides itself; a Lua tool may not take their names.
pub const BUILTIN_TOOLS: [&str; 4] = ["bash", "read", "write", "edit"];

/// Whether recovery may run a tool again after a crash interrupted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Replay {
    /// Read-only: running it again is harmless.
    Safe,
    /// Anything else; the default.
    #[default]
    Never,
}

/// One `tool(name, { ... })` declaration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDecl {
    pub name: ToolName,
    #[serde(skip)]
    pub pos: Pos,
    pub description: String,
    pub replay: Replay,
    pub params: Vec<Param>,
    #[serde(skip)]
    pub run: FunctionId,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Param {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ParamType,
    pub description: Option<String>,
    pub required: bool,
    pub default: Option<serde_json::Value>,
    #[serde(rename = "enum")]
    pub choices: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    String,
    Integer,
    Number,
    Boolean,
    Array,
    Object,
}

impl ParamType {
    const NAMES: [&'static str; 6] = ["string", "integer", "number", "boolean", "array", "object"];

    fn parse(text: &str) -> Option<ParamType> {
        Some(match text {
            "string" => ParamType::String,
            "integer" => ParamType::Integer,
            "number" => ParamType::Number,
            "boolean" => ParamType::Boolean,
            "array" => ParamType::Array,
            "object" => ParamType::Object,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        ParamType::NAMES[self as usize]
    }

    fn admits(self, value: &serde_json::Value) -> bool {
        match self {
            ParamType::String => value.is_string(),
            ParamType::Integer => value.is_i64() || value.is_u64(),
            ParamType::Number => value.is_number(),
            ParamType::Boolean => value.is_boolean(),
            ParamType::Array => value.is_array(),
            ParamType::Object => value.is_object(),
        }
    }
}

impl ToolDecl {
    /// Checks a call's arguments against the declared parameters and fills in declared
    /// defaults; see [`prepare_arguments`].
    pub fn prepare_arguments(
        &self,
        arguments: &serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        prepare_arguments(self.name.as_str(), &self.params, arguments)
    }

    /// The JSON schema of the arguments, as the model will see it.
    pub fn json_schema(&self) -> serde_json::Value {
        arguments_schema(&self.params)
    }
}

/// Checks a call's arguments against the parameters of the tool `tool` and fills in declared
/// defaults. Every problem is named at once: a missing required argument, a wrong type, a
/// value outside `enum`, an argument the tool does not declare.
pub fn prepare_arguments(
    tool: &str,
    params: &[Param],
    arguments: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let empty = serde_json::Map::new();
    let given = match arguments {
        serde_json::Value::Object(map) => map,
        serde_json::Value::Null => &empty,
        other => {
            return Err(format!(
                "tool {tool}: arguments must be a JSON object, not {other}"
            ));
        }
    };
    let mut prepared = serde_json::Map::new();
    let mut problems = Vec::new();
    for param in params {
        match given.get(&param.name).filter(|value| !value.is_null()) {
            Some(value) if !param.kind.admits(value) => problems.push(format!(
                "`{}` must be {}, not {value}",
                param.name,
                param.kind.as_str()
            )),
            Some(value)
                if param
                    .choices
                    .as_ref()
                    .is_some_and(|choices| !choices.contains(value)) =>
            {
                problems.push(format!(
                    "`{}` must be one of {}, not {value}",
                    param.name,
                    json!(param.choices)
                ));
            }
            Some(value) => {
                prepared.insert(param.name.clone(), value.clone());
            }
            None => match &param.default {
                Some(default) => {
                    prepared.insert(param.name.clone(), default.clone());
                }
                None if param.required => {
                    problems.push(format!("`{}` is required", param.name));
                }
                None => {}
            },
        }
    }
    for name in given.keys() {
        if !params.iter().any(|param| &param.name == name) {
            problems.push(format!("`{name}` is not a parameter of this tool"));
        }
    }
    if problems.is_empty() {
        Ok(serde_json::Value::Object(prepared))
    } else {
        Err(format!(
            "tool {tool}: {}; it takes {}",
            problems.join(", "),
            arguments_schema(params)["properties"]
        ))
    }
}

/// The JSON schema of an arguments object with these parameters, as the model will see it.
pub fn arguments_schema(params: &[Param]) -> serde_json::Value {
    let mut properties = serde_json::Map::new();
    for param in params {
        let mut property = serde_json::Map::new();
        property.insert("type".into(), json!(param.kind));
        if let Some(description) = &param.description {
            property.insert("description".into(), json!(description));
        }
        if let Some(choices) = &param.choices {
            property.insert("enum".into(), json!(choices));
        }
        if let Some(default) = &param.default {
            property.insert("default".into(), default.clone());
        }
        properties.insert(param.name.clone(), serde_json::Value::Object(property));
    }
    let required: Vec<&str> = params
        .iter()
        .filter(|param| param.required)
        .map(|param| param.name.as_str())
        .collect();
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

const USAGE: &str =
    "tool(\"name\", { description = \"...\", params = { }, run = function(args, ctx) ... end })";
const KEYS: &[&str] = &["description", "replay", "params", "run"];
const PARAM_KEYS: &[&str] = &["name", "type", "description", "required", "default", "enum"];

/// Checks every `tool(...)` declaration one `tools/*.lua` file made.
pub fn check_tool(file: &str, declarations: &[Declaration]) -> Result<Vec<ToolDecl>, Vec<Problem>> {
    let mut checker = Checker::new(file);
    if declarations.is_empty() {
        checker.push(
            Problem::new(file, Pos::default(), "declares no tool")
                .with_fix(format!("declare one: {USAGE}")),
        );
    }
    let tools: Vec<ToolDecl> = declarations
        .iter()
        .filter_map(|declaration| check_one(&mut checker, declaration))
        .collect();
    if checker.has_problems() {
        Err(checker.into_problems())
    } else {
        Ok(tools)
    }
}

fn check_one(checker: &mut Checker, declaration: &Declaration) -> Option<ToolDecl> {
    let pos = declaration.pos;
    let [name_node, table] = declaration.args.as_slice() else {
        checker.push(
            Problem::new(
                checker.file(),
                pos,
                format!(
                    "tool takes a name and a table, got {} arguments",
                    declaration.args.len()
                ),
            )
            .with_fix(format!("write it as {USAGE}")),
        );
        return None;
    };
    let name = checker
        .str(name_node, &Path::root().key("name"))
        .and_then(|text| {
            if BUILTIN_TOOLS.contains(&text) {
                checker.report_fix(
                    pos,
                    &Path::root(),
                    format!("{text} is a built-in tool"),
                    "choose another name",
                );
                return None;
            }
            match ToolName::try_from(text) {
                Ok(name) => Some(name),
                Err(_) => {
                    checker.report_fix(
                        pos,
                        &Path::root(),
                        format!("{text:?} is not a tool name"),
                        ToolName::RULE,
                    );
                    None
                }
            }
        })?;
    let root = Path::root().key(name.as_str());
    let mut fields = checker.fields(table, &root)?;
    let description = fields
        .required(
            checker,
            "description",
            "say what the tool does, for the model: description = \"...\"",
        )
        .and_then(|node| checker.non_empty_str(node, &root.key("description")))
        .map(str::to_owned);
    let replay = match fields.optional("replay") {
        None => Some(Replay::Never),
        Some(node) => checker
            .str(node, &root.key("replay"))
            .and_then(|text| match text {
                "safe" => Some(Replay::Safe),
                "never" => Some(Replay::Never),
                _ => {
                    checker.report_fix(
                        node.pos,
                        &root.key("replay"),
                        format!("unknown replay {text:?}"),
                        "use \"safe\" or \"never\"",
                    );
                    None
                }
            }),
    };
    let params = fields
        .optional("params")
        .map(|node| params(checker, node, &root.key("params")))
        .unwrap_or_default();
    let run = fields
        .required(
            checker,
            "run",
            "give the body: run = function(args, ctx) ... end",
        )
        .and_then(|node| match node.value {
            Value::Function(id) => Some(id),
            ref other => {
                checker.report(
                    node.pos,
                    &root.key("run"),
                    format!("expected a function, found {}", other.kind()),
                );
                None
            }
        });
    fields.finish(checker, KEYS);
    Some(ToolDecl {
        name,
        pos,
        description: description?,
        replay: replay?,
        params,
        run: run?,
    })
}

fn params(checker: &mut Checker, node: &Node, path: &Path) -> Vec<Param> {
    let Some(items) = checker.list(node, path) else {
        return Vec::new();
    };
    let mut params: Vec<Param> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = path.index(index);
        let Some(mut fields) = checker.fields(item, &path) else {
            continue;
        };
        let name = fields
            .required(checker, "name", "name = \"path\"")
            .and_then(|node| checker.non_empty_str(node, &path.key("name")))
            .map(str::to_owned);
        let kind = fields
            .required(checker, "type", "type = \"string\"")
            .and_then(|node| {
                let text = checker.str(node, &path.key("type"))?;
                let kind = ParamType::parse(text);
                if kind.is_none() {
                    checker.report_fix(
                        node.pos,
                        &path.key("type"),
                        format!("unknown type {text:?}"),
                        format!("use one of {}", ParamType::NAMES.join(", ")),
                    );
                }
                kind
            });
        let description = fields
            .optional("description")
            .and_then(|node| checker.str(node, &path.key("description")))
            .map(str::to_owned);
        let required = fields
            .optional("required")
            .and_then(|node| checker.bool(node, &path.key("required")))
            .unwrap_or(false);
        let default = fields
            .optional("default")
            .and_then(|node| to_json(checker, node, &path.key("default")));
        let choices = fields.optional("enum").and_then(|node| {
            let items = checker.list(node, &path.key("enum"))?;
            items
                .iter()
                .enumerate()
                .map(|(i, item)| to_json(checker, item, &path.key("enum").index(i)))
                .collect::<Option<Vec<_>>>()
        });
        fields.finish(checker, PARAM_KEYS);
        let (Some(name), Some(kind)) = (name, kind) else {
            continue;
        };
        if params.iter().any(|param| param.name == name) {
            checker.report_fix(
                item.pos,
                &path.key("name"),
                format!("parameter {name} is declared twice"),
                "keep one",
            );
        }
        if let Some(default) = &default {
            if !kind.admits(default) {
                checker.report(
                    item.pos,
                    &path.key("default"),
                    format!("default {default} is not of type {}", kind.as_str()),
                );
            }
            if required {
                checker.report_fix(
                    item.pos,
                    &path,
                    "a required parameter cannot have a default",
                    "drop required or default",
                );
            }
            if let Some(choices) = &choices
                && !choices.contains(default)
            {
                checker.report(
                    item.pos,
                    &path.key("default"),
                    format!("default {default} is not one of enum"),
                );
            }
        }
        for choice in choices
            .iter()
            .flatten()
            .filter(|choice| !kind.admits(choice))
        {
            checker.report(
                item.pos,
                &path.key("enum"),
                format!("{choice} is not of type {}", kind.as_str()),
            );
        }
        params.push(Param {
            name,
            kind,
            description,
            required,
            default,
            choices,
        });
    }
    params
}

fn to_json(checker: &mut Checker, node: &Node, path: &Path) -> Option<serde_json::Value> {
    Some(match &node.value {
        Value::Nil => serde_json::Value::Null,
        Value::Bool(b) => json!(b),
        Value::Int(n) => json!(n),
        Value::Float(x) => json!(x),
        Value::Str(s) => json!(s),
        Value::List(items) => serde_json::Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| to_json(checker, item, &path.index(i)))
                .collect::<Option<Vec<_>>>()?,
        ),
        Value::Map(entries) => {
            let mut object = serde_json::Map::new();
            for (key, value) in entries {
                object.insert(
                    key.name.clone(),
                    to_json(checker, value, &path.key(&key.name))?,
                );
            }
            serde_json::Value::Object(object)
        }
        Value::Env(_) | Value::Function(_) => {
            checker.report(
                node.pos,
                path,
                format!("{} cannot be a parameter value", node.value.kind()),
            );
            return None;
        }
    })
}
