//! What every wire API's request body is built with: the system prompt, the tools offered, and
//! the tool results, each API writing them in its own words. Pure; no I/O.

use super::{ModelRequest, ToolSpec};
use perch_core::log::Part;
use serde_json::{Value, json};

/// Sets `body[key]` to the request's system prompt, when it has one.
pub(crate) fn set_system(body: &mut Value, key: &str, request: &ModelRequest) {
    if !request.system.is_empty() {
        body[key] = json!(request.system);
    }
}

/// Sets `body["tools"]` to the tools the request offers, each as `written` writes it; nothing
/// when it offers none.
pub(crate) fn set_tools(body: &mut Value, request: &ModelRequest, written: fn(&ToolSpec) -> Value) {
    if !request.tools.is_empty() {
        body["tools"] = request.tools.iter().map(written).collect();
    }
}

/// The tool results among `parts`: each one's call id and output.
pub(crate) fn tool_results(parts: &[Part]) -> impl Iterator<Item = (&str, &str)> {
    parts.iter().filter_map(|part| match part {
        Part::ToolResult {
            call_id, output, ..
        } => Some((call_id.as_str(), output.as_str())),
        _ => None,
    })
}
