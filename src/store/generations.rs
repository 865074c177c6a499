//! Which generation each conversation is in: `/new` starts the next one, in a new lane. Kept on
//! disk only, one small file per conversation that ever used `/new`
//! (`.perch/generations/<lane>`, holding the number), read when a message arrives: nothing per
//! conversation stays in memory. The single `.perch/conversations.json` of earlier versions is
//! moved into that directory at start.

use crate::agent::AgentDir;
use perch_core::name::LaneName;
use std::collections::BTreeMap;
use std::path::Path;

/// The generation of the conversation whose first lane is `base` (0 until `/new` is used).
pub fn current(dir: &AgentDir, base: &LaneName) -> Result<u32, String> {
    let path = dir.generation_file(base);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map_err(|_| {
            format!(
                "{}: not a conversation generation (a number); remove the file to go back to the \
                 conversation's first lane",
                path.display()
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(error) => Err(format!("{}: cannot be read: {error}", path.display())),
    }
}

/// Starts the next generation of the conversation whose first lane is `base`, durably.
pub fn advance(dir: &AgentDir, base: &LaneName) -> Result<u32, String> {
    let next = current(dir, base)?.saturating_add(1);
    write(dir, base, next)?;
    Ok(next)
}

/// The lane of generation `generation` of the conversation whose first lane is `base`.
pub fn lane(base: LaneName, generation: u32) -> Result<LaneName, String> {
    if generation == 0 {
        return Ok(base);
    }
    let prefix: String = base.as_str().chars().take(56).collect();
    LaneName::try_from(format!("{prefix}-n{generation}").as_str())
        .map_err(|error| format!("no lane name for generation {generation} of {base}: {error}"))
}

fn write(dir: &AgentDir, base: &LaneName, generation: u32) -> Result<(), String> {
    let path = dir.generation_file(base);
    let parent = dir.generations_dir();
    std::fs::create_dir_all(&parent)
        .map_err(|error| format!("{}: cannot be created: {error}", parent.display()))?;
    crate::store::atomic_file::replace(&path, generation.to_string().as_bytes(), None)
        .map_err(|error| format!("{}: cannot be written: {error}", path.display()))
}

/// Moves the generations of `.perch/conversations.json` (earlier versions) into
/// `.perch/generations/`, keeping the higher of the two where both have one, then removes the
/// old file. A crash halfway leaves the old file, and the next start does it again.
pub fn migrate(dir: &AgentDir) -> Result<(), String> {
    let old = dir.conversations_file();
    let text = match std::fs::read_to_string(&old) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(format!("{}: cannot be read: {error}", old.display())),
    };
    let generations: BTreeMap<String, u32> = serde_json::from_str(&text).map_err(|error| {
        format!(
            "{}: not a map of conversation generations ({error}); fix or remove it",
            old.display()
        )
    })?;
    for (base, generation) in generations {
        let Ok(base) = LaneName::try_from(base.as_str()) else {
            tracing::warn!("{}: {base:?} is not a lane name; skipped", old.display());
            continue;
        };
        if generation > current(dir, &base)? {
            write(dir, &base, generation)?;
        }
    }
    remove(&old)
}

fn remove(path: &Path) -> Result<(), String> {
    std::fs::remove_file(path)
        .map_err(|error| format!("{}: cannot be removed: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::test_support::agent_with;

    fn agent() -> (tempfile::TempDir, AgentDir) {
        agent_with(".perch")
    }

    fn name(text: &str) -> LaneName {
        LaneName::try_from(text).unwrap()
    }

    #[test]
    fn a_conversation_starts_in_its_first_lane_and_new_moves_it_on() {
        let (_temp, dir) = agent();
        let base = name("tg-42");
        assert_eq!(current(&dir, &base).unwrap(), 0);
        assert_eq!(lane(base.clone(), 0).unwrap(), base);
        assert_eq!(advance(&dir, &base).unwrap(), 1);
        assert_eq!(advance(&dir, &base).unwrap(), 2);
        assert_eq!(current(&dir, &base).unwrap(), 2);
        assert_eq!(lane(base, 2).unwrap(), name("tg-42-n2"));
        assert_eq!(current(&dir, &name("tg-43")).unwrap(), 0);
    }

    #[test]
    fn a_damaged_generation_file_is_an_error_naming_it_and_the_fix() {
        let (_temp, dir) = agent();
        let base = name("tg-42");
        std::fs::create_dir_all(dir.generations_dir()).unwrap();
        std::fs::write(dir.generation_file(&base), "two").unwrap();
        let error = current(&dir, &base).unwrap_err();
        assert!(error.contains("generations/tg-42"), "{error}");
        assert!(error.contains("remove the file"), "{error}");
        assert!(advance(&dir, &base).is_err());
    }

    #[test]
    fn the_old_conversations_file_moves_into_the_directory_keeping_the_higher() {
        let (_temp, dir) = agent();
        std::fs::write(
            dir.conversations_file(),
            r#"{"tg-1": 3, "tg-2": 1, "not a lane!": 4}"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.generations_dir()).unwrap();
        std::fs::write(dir.generation_file(&name("tg-2")), "5").unwrap();
        migrate(&dir).unwrap();
        assert!(!dir.conversations_file().exists());
        assert_eq!(current(&dir, &name("tg-1")).unwrap(), 3);
        assert_eq!(current(&dir, &name("tg-2")).unwrap(), 5);
        migrate(&dir).unwrap();
        assert_eq!(current(&dir, &name("tg-1")).unwrap(), 3);
    }
}
