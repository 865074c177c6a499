//! A checker of `perch log --json` events against the schema file (the subset it uses).

use serde_json::Value;

pub fn event(schema: &Value, event: &Value) -> Result<(), String> {
    check(schema, event, "event")?;
    let kind = event["kind"].as_str().ok_or("no kind")?;
    let branch = schema["oneOf"]
        .as_array()
        .ok_or("no oneOf")?
        .iter()
        .find(|branch| branch["properties"]["kind"]["const"] == kind)
        .ok_or_else(|| format!("no branch for kind {kind}"))?;
    check(branch, event, kind)?;
    let object = event.as_object().ok_or("not an object")?;
    for key in object.keys() {
        let declared =
            schema["properties"].get(key).is_some() || branch["properties"].get(key).is_some();
        if !declared {
            return Err(format!("{kind}: {key} is not in the schema"));
        }
    }
    Ok(())
}

fn type_matches(name: &str, value: &Value) -> bool {
    match name {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "null" => value.is_null(),
        _ => false,
    }
}

fn check(schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    match &schema["type"] {
        Value::String(name) if !type_matches(name, value) => {
            return Err(format!("{at}: {value} is not {name}"));
        }
        Value::Array(names)
            if !names
                .iter()
                .any(|name| name.as_str().is_some_and(|name| type_matches(name, value))) =>
        {
            return Err(format!("{at}: {value} is none of {names:?}"));
        }
        _ => {}
    }
    if let Some(constant) = schema.get("const")
        && constant != value
    {
        return Err(format!("{at}: {value} is not {constant}"));
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if let Some(object) = value.as_object() {
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            if !object.contains_key(key) {
                return Err(format!("{at}: {key} is missing"));
            }
        }
        let properties = schema["properties"].as_object();
        for (key, item) in object {
            match properties.and_then(|properties| properties.get(key)) {
                Some(property) => check(property, item, &format!("{at}.{key}"))?,
                None if schema["additionalProperties"] == Value::Bool(false) => {
                    return Err(format!("{at}: {key} is not in the schema"));
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(values)) = (schema.get("items"), value.as_array()) {
        for (index, item) in values.iter().enumerate() {
            check(items, item, &format!("{at}[{index}]"))?;
        }
    }
    Ok(())
}
