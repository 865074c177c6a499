use crate::name::{EnvName, ModelRef, ProviderName};
use crate::problem::Problem;
use crate::secret::EnvRef;
use crate::spend::{MAX_MONEY_UNITS, Money, Price};
use crate::tree::{Checker, Node, Path, Value};
use crate::yaml;
use serde::Serialize;

/// `models.yml`: the providers and models this agent may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelsFile {
    pub providers: Vec<(ProviderName, Provider)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Provider {
    pub base_url: String,
    pub api: Api,
    /// Absent for local servers that need no key.
    pub api_key: Option<EnvRef>,
    pub models: Vec<ModelSpec>,
}

/// The wire API a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Api {
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    #[serde(rename = "openai-completions")]
    OpenAiCompletions,
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
}

impl Api {
    const NAMES: [&'static str; 3] = [
        "openai-responses",
        "openai-completions",
        "anthropic-messages",
    ];

    pub fn as_str(self) -> &'static str {
        Api::NAMES[self as usize]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSpec {
    pub id: String,
    pub context_window: u32,
    pub max_tokens: u32,
    pub reasoning: bool,
    /// What the model costs per million tokens; without it, its replies count tokens but no
    /// cost against the daily spend caps.
    pub price: Option<Price>,
}

impl ModelsFile {
    pub fn model(&self, model: &ModelRef) -> Option<(&Provider, &ModelSpec)> {
        let (_, provider) = self
            .providers
            .iter()
            .find(|(name, _)| *name == model.provider)?;
        let spec = provider.models.iter().find(|spec| spec.id == model.id)?;
        Some((provider, spec))
    }

    pub fn all_refs(&self) -> Vec<ModelRef> {
        self.providers
            .iter()
            .flat_map(|(name, provider)| {
                provider.models.iter().map(|spec| ModelRef {
                    provider: name.clone(),
                    id: spec.id.clone(),
                })
            })
            .collect()
    }
}

const FILE: &str = "models.yml";
const PROVIDER_KEYS: &[&str] = &["baseUrl", "api", "apiKey", "models"];
const MODEL_KEYS: &[&str] = &["id", "contextWindow", "maxTokens", "reasoning", "price"];
const PRICE_KEYS: &[&str] = &["input", "output", "cached"];
const PRICE_FIX: &str = "give the price per million tokens: price: { input: 1.25, output: 10.0 } \
                         (cached: is optional)";

/// Parses and checks `models.yml`, reporting every problem with its line.
pub fn check_models(text: &str) -> Result<ModelsFile, Vec<Problem>> {
    let tree = yaml::parse(FILE, text)?;
    let mut checker = Checker::new(FILE);
    let providers = read_file(&mut checker, &tree);
    if checker.has_problems() {
        Err(checker.into_problems())
    } else {
        Ok(ModelsFile { providers })
    }
}

fn read_file(checker: &mut Checker, tree: &Node) -> Vec<(ProviderName, Provider)> {
    let root = Path::root();
    let Some(mut fields) = checker.fields(tree, &root) else {
        return Vec::new();
    };
    let providers_node = fields.required(
        checker,
        "providers",
        "list providers under a top-level providers: key",
    );
    fields.finish(checker, &["providers"]);
    let Some(providers_node) = providers_node else {
        return Vec::new();
    };
    let Value::Map(entries) = &providers_node.value else {
        checker.report(
            providers_node.pos,
            &root.key("providers"),
            format!(
                "expected providers by name, found {}",
                providers_node.value.kind()
            ),
        );
        return Vec::new();
    };
    let mut providers = Vec::new();
    for (key, node) in entries {
        let path = root.key("providers").key(&key.name);
        let name = match ProviderName::try_from(key.name.as_str()) {
            Ok(name) => Some(name),
            Err(_) => {
                checker.report_fix(key.pos, &path, "not a provider name", ProviderName::RULE);
                None
            }
        };
        if let (Some(name), Some(provider)) = (name, read_provider(checker, node, &path)) {
            providers.push((name, provider));
        }
    }
    providers
}

fn read_provider(checker: &mut Checker, node: &Node, path: &Path) -> Option<Provider> {
    let mut fields = checker.fields(node, path)?;
    let base_url = fields
        .required(checker, "baseUrl", "baseUrl: https://api.example.com/v1")
        .and_then(|node| {
            let text = checker.str(node, &path.key("baseUrl"))?;
            if !(text.starts_with("https://") || text.starts_with("http://")) {
                checker.report_fix(
                    node.pos,
                    &path.key("baseUrl"),
                    format!("{text:?} is not an http(s) URL"),
                    "write the full URL, for example https://api.openai.com/v1",
                );
                return None;
            }
            Some(text.trim_end_matches('/').to_owned())
        });
    let api = fields
        .required(checker, "api", "api: openai-responses")
        .and_then(|node| {
            let text = checker.str(node, &path.key("api"))?;
            let api = match text {
                "openai-responses" => Some(Api::OpenAiResponses),
                "openai-completions" => Some(Api::OpenAiCompletions),
                "anthropic-messages" => Some(Api::AnthropicMessages),
                _ => None,
            };
            if api.is_none() {
                checker.report_fix(
                    node.pos,
                    &path.key("api"),
                    format!("unknown api {text:?}"),
                    format!("use one of {}", Api::NAMES.join(", ")),
                );
            }
            api
        });
    let api_key = match fields.optional("apiKey") {
        None => Some(None),
        Some(node) => api_key(checker, node, &path.key("apiKey")).map(Some),
    };
    let models = fields
        .required(
            checker,
            "models",
            "list the models: models: [{ id: ..., contextWindow: ..., maxTokens: ... }]",
        )
        .map(|node| read_models(checker, node, &path.key("models")))
        .unwrap_or_default();
    fields.finish(checker, PROVIDER_KEYS);
    Some(Provider {
        base_url: base_url?,
        api: api?,
        api_key: api_key?,
        models,
    })
}

fn api_key(checker: &mut Checker, node: &Node, path: &Path) -> Option<EnvRef> {
    let Value::Str(text) = &node.value else {
        checker.report(
            node.pos,
            path,
            format!("expected $ENV_VAR, found {}", node.value.kind()),
        );
        return None;
    };
    let Some(name) = text.strip_prefix('$') else {
        checker.report_fix(
            node.pos,
            path,
            "a literal API key is not allowed in models.yml (value not shown)",
            "export the key in the environment and reference it: apiKey: $OPENAI_API_KEY",
        );
        return None;
    };
    match EnvName::try_from(name) {
        Ok(name) => Some(EnvRef::new(name)),
        Err(_) => {
            checker.report_fix(
                node.pos,
                path,
                "not an environment variable reference",
                format!("write $NAME, where NAME has {}", EnvName::RULE),
            );
            None
        }
    }
}

fn read_models(checker: &mut Checker, node: &Node, path: &Path) -> Vec<ModelSpec> {
    let Some(items) = checker.list(node, path) else {
        return Vec::new();
    };
    let mut models: Vec<ModelSpec> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let path = path.index(index);
        let Some(mut fields) = checker.fields(item, &path) else {
            continue;
        };
        let id = fields
            .required(checker, "id", "id: the model's name at the provider")
            .and_then(|node| checker.non_empty_str(node, &path.key("id")))
            .map(str::to_owned);
        let [context_window, max_tokens] = [
            ("contextWindow", "the model's context size in tokens", 1024),
            ("maxTokens", "the most tokens one reply may use", 1),
        ]
        .map(|(key, what, least)| {
            fields
                .required(checker, key, &format!("{key}: {what}"))
                .and_then(|node| checker.int_in(node, &path.key(key), least..=100_000_000))
        });
        let reasoning = fields
            .optional("reasoning")
            .and_then(|node| checker.bool(node, &path.key("reasoning")))
            .unwrap_or(false);
        let price = match fields.optional("price") {
            None => Some(None),
            Some(node) => read_price(checker, node, &path.key("price")).map(Some),
        };
        fields.finish(checker, MODEL_KEYS);
        if let (Some(window), Some(max)) = (context_window, max_tokens)
            && max > window
        {
            checker.report(
                item.pos,
                &path.key("maxTokens"),
                format!("maxTokens {max} exceeds contextWindow {window}"),
            );
        }
        if let Some(id) = &id
            && models.iter().any(|model| &model.id == id)
        {
            checker.report_fix(
                item.pos,
                &path.key("id"),
                format!("model {id} is listed twice"),
                "keep one",
            );
        }
        if let (Some(id), Some(context_window), Some(max_tokens), Some(price)) =
            (id, context_window, max_tokens, price)
        {
            models.push(ModelSpec {
                id,
                context_window: u32::try_from(context_window).unwrap_or(u32::MAX),
                max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
                reasoning,
                price,
            });
        }
    }
    models
}

/// `price: { input: 1.25, output: 10.0, cached: 0.125 }`, per million tokens.
fn read_price(checker: &mut Checker, node: &Node, path: &Path) -> Option<Price> {
    let mut fields = checker.fields(node, path)?;
    let amount = |checker: &mut Checker, key: &str, node: &Node| {
        let key_path = path.key(key);
        let value = checker.number(node, &key_path)?;
        let money = Money::from_units(value);
        if money.is_none() {
            checker.report_fix(
                node.pos,
                &key_path,
                format!("{value} is not a price"),
                format!("use an amount from 0 to {MAX_MONEY_UNITS} per million tokens"),
            );
        }
        money
    };
    let input = fields
        .required(checker, "input", PRICE_FIX)
        .and_then(|node| amount(checker, "input", node));
    let output = fields
        .required(checker, "output", PRICE_FIX)
        .and_then(|node| amount(checker, "output", node));
    let cached = match fields.optional("cached") {
        None => Some(None),
        Some(node) => amount(checker, "cached", node).map(Some),
    };
    fields.finish(checker, PRICE_KEYS);
    Some(Price {
        input: input?,
        output: output?,
        cached: cached?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "providers:\n  openai:\n    baseUrl: https://api.openai.com/v1\n    api: openai-responses\n    apiKey: $OPENAI_API_KEY\n    models:\n      - id: gpt-5\n        contextWindow: 400000\n        maxTokens: 16384\n        reasoning: true\n";

    #[test]
    fn a_good_file_reads_back() {
        let file = check_models(GOOD).unwrap();
        let model = ModelRef::parse("openai/gpt-5").unwrap();
        let (provider, spec) = file.model(&model).unwrap();
        assert_eq!(provider.api, Api::OpenAiResponses);
        assert_eq!(
            provider.api_key.as_ref().unwrap().name().as_str(),
            "OPENAI_API_KEY"
        );
        assert_eq!(spec.context_window, 400_000);
    }

    #[test]
    fn a_literal_key_is_refused_without_echoing_it() {
        let text = GOOD.replace("$OPENAI_API_KEY", "sk-live-0123456789");
        let problems = check_models(&text).unwrap_err();
        assert_eq!(problems.len(), 1);
        let shown = problems[0].to_string();
        assert!(
            shown.starts_with("models.yml:5:13: providers.openai.apiKey: a literal API key"),
            "{shown}"
        );
        assert!(!shown.contains("sk-live"), "{shown}");
    }

    #[test]
    fn prices_read_back_and_bad_ones_name_their_line() {
        let priced = GOOD.replace(
            "        reasoning: true\n",
            "        reasoning: true\n        price: { input: 1.25, output: 10, cached: 0.125 }\n",
        );
        let file = check_models(&priced).unwrap();
        let model = ModelRef::parse("openai/gpt-5").unwrap();
        assert_eq!(
            file.model(&model).unwrap().1.price,
            Some(Price {
                input: Money::from_units(1.25).unwrap(),
                output: Money::from_units(10.0).unwrap(),
                cached: Some(Money::from_units(0.125).unwrap()),
            })
        );
        assert_eq!(
            check_models(GOOD).unwrap().model(&model).unwrap().1.price,
            None
        );

        let bad = GOOD.replace(
            "        reasoning: true\n",
            "        reasoning: true\n        price:\n          input: -1\n          outptu: 3\n",
        );
        let shown: Vec<String> = check_models(&bad)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(shown.len(), 3, "{shown:#?}");
        assert!(
            shown[0].starts_with(
                "models.yml:12:18: providers.openai.models[1].price.input: -1 is not a price"
            ),
            "{shown:#?}"
        );
        assert!(
            shown[1]
                .starts_with("models.yml:12:16: providers.openai.models[1].price: missing output"),
            "{shown:#?}"
        );
        assert!(
            shown[2].starts_with(
                "models.yml:13:11: providers.openai.models[1].price.outptu: unknown key\n  fix: did you mean output?"
            ),
            "{shown:#?}"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once_with_its_line() {
        let text =
            "providers:\n  openai:\n    baseUrl: ftp://x\n    api: openai-chat\n    modles: []\n";
        let problems = check_models(text).unwrap_err();
        let lines: Vec<String> = problems
            .iter()
            .map(|p| format!("{}:{}", p.pos.line, p.path))
            .collect();
        assert_eq!(
            lines,
            vec![
                "3:providers.openai.baseUrl",
                "4:providers.openai.api",
                "3:providers.openai",
                "5:providers.openai.modles",
            ]
        );
    }
}
