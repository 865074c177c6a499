//! The first lane of a conversation (before any `/new`): the one perch names for it
//! ([`Conversation::lane`]), unless an earlier version of perch gave it another that is certainly
//! its own, which it keeps, history and all. That is decided once per conversation, from what the
//! earlier lane holds, and recorded in `.perch/earlier-lanes/<its own lane>.json` (one small file,
//! written atomically, read at each of its messages; only conversations that met an earlier
//! lane have one, so nothing per conversation stays in memory).

use crate::agent::AgentDir;
use crate::store::generations;
use perch_core::config::ChannelConfig;
use perch_core::conversation_lane::{
    Adoption, Conversation, EarlierContents, EarlierLane, EarlierName, adoption,
};
use perch_core::log::{EntryBody, Line, ReadLine, Role};
use perch_core::name::LaneName;
use std::path::Path;

/// The first lane of the conversation in `room` (and `thread`) of `config`'s channel. In order:
/// the recorded decision, if there is one; the conversation's own lane, once it exists; the
/// earlier lane, decided on and recorded now, when one exists on disk (as a lane or a
/// generation); else its own lane.
pub(super) fn first_lane(
    dir: &AgentDir,
    config: &ChannelConfig,
    room: &str,
    thread: Option<&str>,
) -> Result<LaneName, String> {
    let channel = config.name.to_string();
    let conversation = Conversation {
        channel: &channel,
        room,
        thread,
    };
    let own = conversation.lane();
    let record_path = dir.earlier_lane_file(&own);
    if let Some(record) = read(&record_path)? {
        if !record.is_for(&conversation) {
            return Err(format!(
                "{}: a decision about another conversation ({} room {}) under this \
                 conversation's lane name; remove the file to decide again",
                record_path.display(),
                record.channel,
                record.room
            ));
        }
        return Ok(record.lane_in_use(own));
    }
    let sessions = dir.sessions_dir();
    if sessions.join(own.as_str()).is_dir() {
        return Ok(own);
    }
    let Some(earlier) = conversation.earlier_lane() else {
        return Ok(own);
    };
    let generation = generations::current(dir, &earlier.lane)?;
    if generation == 0 && !sessions.join(earlier.lane.as_str()).is_dir() {
        return Ok(own);
    }
    let contents = contents(&sessions, &earlier, generation)?;
    let alias = config.room_alias(room).map(ToString::to_string);
    let decided = adoption(&conversation, alias.as_deref(), &earlier, &contents);
    if let Adoption::Refused { reason } = &decided {
        tracing::warn!(
            channel = %channel,
            lane = %own,
            "channel {channel}: the lane {} an earlier version of perch named for room {room} is \
             not kept ({reason}); the conversation continues in the lane {own}",
            earlier.lane
        );
    }
    let record = EarlierLane::new(&conversation, earlier.lane, decided);
    write(dir, &record_path, &record)?;
    Ok(record.lane_in_use(own))
}

/// Where the user messages of `earlier` and of each of its `/new` generations up to
/// `generation` came from, and how many of their lines could not be read.
fn contents(
    sessions: &Path,
    earlier: &EarlierName,
    generation: u32,
) -> Result<EarlierContents, String> {
    let mut contents = EarlierContents::default();
    for number in 0..=generation {
        let lane = generations::lane(earlier.lane.clone(), number)?;
        if !sessions.join(lane.as_str()).is_dir() {
            continue;
        }
        let read = crate::log::transcript::read_lane(sessions, &lane, None, None)
            .map_err(|error| format!("the earlier lane {lane} cannot be read: {error}"))?;
        for (_, line) in read.lines {
            match line {
                ReadLine::Line(Line::Entry(entry)) => {
                    if let EntryBody::Message(message) = entry.body
                        && message.role == Role::User
                    {
                        contents.origins.extend(message.origins);
                    }
                }
                ReadLine::Line(_) => {}
                ReadLine::Damaged { .. } => contents.damaged += 1,
            }
        }
    }
    Ok(contents)
}

/// The recorded decision at `path`, if there is one.
fn read(path: &Path) -> Result<Option<EarlierLane>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| {
            format!(
                "{}: not a decision about an earlier lane ({error}); remove the file to decide \
                 again",
                path.display()
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(format!("{}: cannot be read: {error}", path.display())),
    }
}

fn write(dir: &AgentDir, path: &Path, record: &EarlierLane) -> Result<(), String> {
    let parent = dir.earlier_lanes_dir();
    std::fs::create_dir_all(&parent)
        .map_err(|error| format!("{}: cannot be created: {error}", parent.display()))?;
    let mut line = serde_json::to_vec(record).map_err(|error| error.to_string())?;
    line.push(b'\n');
    crate::store::atomic_file::replace(path, &line, None)
        .map_err(|error| format!("{}: cannot be written: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::super::test_support::agent_with;
    use super::*;
    use crate::log::LaneLog;
    use chrono::TimeZone;
    use perch_core::config::{Access, BusyPolicy, DmPolicy, GroupPolicy, Platform, ThreadPolicy};
    use perch_core::id::EntryId;
    use perch_core::log::{Entry, Message, Part};
    use perch_core::name::{ChannelName, EnvName, RoomAlias};
    use perch_core::origin::{MessageOrigin, Person};
    use perch_core::secret::EnvRef;
    use std::collections::BTreeMap;

    /// Two thread ids of one room whose earlier lanes are the same directory (see the core's
    /// table test).
    const HIDEOUT: &str = "!hideout:example.org";
    const THREADS: [&str; 2] = [
        "$threadrootthreadrootthreadroot09685295",
        "$threadrootthreadrootthreadroot12060020",
    ];

    fn agent() -> (tempfile::TempDir, AgentDir) {
        agent_with(".perch/sessions")
    }

    fn channel(name: &str, rooms: &[(&str, &str)]) -> ChannelConfig {
        ChannelConfig {
            name: ChannelName::try_from(name).unwrap(),
            pos: perch_core::problem::Pos::line(1),
            platform: Platform::Telegram {
                token: EnvRef::new(EnvName::try_from("TOKEN").unwrap()),
            },
            api_url: None,
            rooms: rooms
                .iter()
                .map(|(alias, id)| (RoomAlias::try_from(*alias).unwrap(), (*id).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            allow: Access::default(),
            dm: DmPolicy::Pair,
            groups: GroupPolicy::Mention,
            busy: BusyPolicy::Followup,
            threads: ThreadPolicy::Own,
            max_age: std::time::Duration::from_secs(3600),
            queue_limit: 20,
            allow_bots: Vec::new(),
            bot_turns: 3,
            on_message: None,
            format: None,
        }
    }

    fn said(channel: &str, room: &str, thread: Option<&str>) -> MessageOrigin {
        MessageOrigin {
            sender: Person {
                id: "11".into(),
                name: "Ana".into(),
            },
            channel: channel.into(),
            room: room.into(),
            thread: thread.map(str::to_owned),
            sent_at: chrono::Utc.with_ymd_and_hms(2026, 12, 2, 3, 0, 0).unwrap(),
            direct: false,
            replying_to: None,
            earlier: Vec::new(),
        }
    }

    /// Writes a lane as an earlier version did: one user message per origin.
    async fn write_lane(dir: &AgentDir, lane: &str, origins: Vec<MessageOrigin>) {
        let sessions = dir.sessions_dir();
        let lane = LaneName::try_from(lane).unwrap();
        let (log, _) = tokio::task::spawn_blocking(move || {
            LaneLog::open(&sessions, &lane, crate::host::clock::system_clock())
        })
        .await
        .unwrap()
        .unwrap();
        for (n, origin) in origins.into_iter().enumerate() {
            let n = u8::try_from(n).unwrap() + 1;
            log.append(&Line::Entry(Entry {
                id: EntryId::from_bytes([n; 16]),
                parent: (n > 1).then(|| EntryId::from_bytes([n - 1; 16])),
                at: origin.sent_at,
                body: EntryBody::Message(perch_core::log::Message {
                    role: Role::User,
                    parts: vec![Part::Text { text: "hi".into() }],
                    origins: vec![origin],
                    relay: None,
                }),
            }))
            .await
            .unwrap();
        }
        log.append(&Line::Entry(Entry {
            id: EntryId::from_bytes([200; 16]),
            parent: None,
            at: chrono::Utc.with_ymd_and_hms(2026, 12, 2, 3, 1, 0).unwrap(),
            body: EntryBody::Message(Message {
                role: Role::Assistant,
                parts: vec![Part::Text {
                    text: "hello".into(),
                }],
                origins: Vec::new(),
                relay: None,
            }),
        }))
        .await
        .unwrap();
        log.close().await.unwrap();
    }

    fn recorded(dir: &AgentDir, own: &LaneName) -> Option<EarlierLane> {
        read(&dir.earlier_lane_file(own)).unwrap()
    }

    fn own(channel: &str, room: &str, thread: Option<&str>) -> LaneName {
        Conversation {
            channel,
            room,
            thread,
        }
        .lane()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_new_conversation_takes_its_own_lane_and_records_nothing() {
        let (_temp, dir) = agent();
        let tg = channel("tg", &[]);
        let lane = first_lane(&dir, &tg, "4242", None).unwrap();
        assert_eq!(lane, own("tg", "4242", None));
        assert!(!dir.earlier_lanes_dir().exists());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_exact_earlier_lane_is_kept_with_its_generations() {
        let (_temp, dir) = agent();
        let tg = channel("tg", &[("team", "-100123")]);
        write_lane(
            &dir,
            "tg--100123",
            vec![said("tg", "team", None), said("tg", "-100123", None)],
        )
        .await;
        std::fs::create_dir_all(dir.generations_dir()).unwrap();
        let base = LaneName::try_from("tg--100123").unwrap();
        std::fs::write(dir.generation_file(&base), "2").unwrap();
        assert_eq!(first_lane(&dir, &tg, "-100123", None).unwrap(), base);
        assert_eq!(generations::current(&dir, &base).unwrap(), 2);
        let own = own("tg", "-100123", None);
        assert_eq!(recorded(&dir, &own).unwrap().adoption, Adoption::ExactName);
        let text = std::fs::read_to_string(dir.earlier_lane_file(&own)).unwrap();
        assert_eq!(
            text,
            "{\"channel\":\"tg\",\"room\":\"-100123\",\"lane\":\"tg--100123\",\"adoption\":{\"adopted\":\"exact_name\"}}\n"
        );
        assert_eq!(
            first_lane(&dir, &tg, "-100123", None).unwrap(),
            base,
            "read from the record"
        );
    }

    /// The earlier version's lane of Matrix thread 0 in the hideout, written with two messages
    /// said in `threads`.
    async fn earlier_lane_of_thread_0_said_in(dir: &AgentDir, threads: [&str; 2]) -> EarlierName {
        let earlier = Conversation {
            channel: "mx",
            room: HIDEOUT,
            thread: Some(THREADS[0]),
        }
        .earlier_lane()
        .unwrap();
        let messages = threads
            .map(|thread| said("mx", HIDEOUT, Some(thread)))
            .to_vec();
        write_lane(dir, earlier.lane.as_str(), messages).await;
        earlier
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn of_two_threads_whose_earlier_lanes_collide_only_the_one_that_wrote_it_keeps_it() {
        let (_temp, dir) = agent();
        let mx = channel("mx", &[]);
        let earlier = earlier_lane_of_thread_0_said_in(&dir, [THREADS[0], THREADS[0]]).await;
        assert_eq!(
            first_lane(&dir, &mx, HIDEOUT, Some(THREADS[0])).unwrap(),
            earlier.lane
        );
        let forger = first_lane(&dir, &mx, HIDEOUT, Some(THREADS[1])).unwrap();
        assert_eq!(forger, own("mx", HIDEOUT, Some(THREADS[1])));
        assert_ne!(forger, earlier.lane);
        assert_eq!(
            recorded(&dir, &own("mx", HIDEOUT, Some(THREADS[0])))
                .unwrap()
                .adoption,
            Adoption::SameOrigins { messages: 2 }
        );
        assert!(matches!(
            recorded(&dir, &forger).unwrap().adoption,
            Adoption::Refused { .. }
        ));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_earlier_lane_two_conversations_shared_is_kept_by_neither() {
        let (_temp, dir) = agent();
        let mx = channel("mx", &[]);
        earlier_lane_of_thread_0_said_in(&dir, [THREADS[0], THREADS[1]]).await;
        for thread in THREADS {
            assert_eq!(
                first_lane(&dir, &mx, HIDEOUT, Some(thread)).unwrap(),
                own("mx", HIDEOUT, Some(thread))
            );
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_hashed_earlier_lane_without_origins_is_not_kept_and_its_own_lane_wins_later() {
        let (_temp, dir) = agent();
        let mx = channel("mx", &[]);
        let earlier = Conversation {
            channel: "mx",
            room: HIDEOUT,
            thread: None,
        }
        .earlier_lane()
        .unwrap();
        write_lane(&dir, earlier.lane.as_str(), Vec::new()).await;
        let own = own("mx", HIDEOUT, None);
        assert_eq!(first_lane(&dir, &mx, HIDEOUT, None).unwrap(), own);
        std::fs::remove_file(dir.earlier_lane_file(&own)).unwrap();
        std::fs::create_dir_all(dir.sessions_dir().join(own.as_str())).unwrap();
        assert_eq!(
            first_lane(&dir, &mx, HIDEOUT, None).unwrap(),
            own,
            "once its own lane exists, the earlier one is not looked at"
        );
        assert!(recorded(&dir, &own).is_none());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_record_about_another_conversation_is_an_error_naming_the_file() {
        let (_temp, dir) = agent();
        let tg = channel("tg", &[]);
        let own = own("tg", "1", None);
        std::fs::create_dir_all(dir.earlier_lanes_dir()).unwrap();
        std::fs::write(
            dir.earlier_lane_file(&own),
            "{\"channel\":\"tg\",\"room\":\"2\",\"lane\":\"tg-2\",\"adoption\":{\"adopted\":\"exact_name\"}}\n",
        )
        .unwrap();
        let error = first_lane(&dir, &tg, "1", None).unwrap_err();
        assert!(error.contains("earlier-lanes"), "{error}");
        assert!(error.contains("remove the file"), "{error}");
    }
}
