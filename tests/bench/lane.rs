//! The agent loop's own cost on the host, without the model's time or the command's: a lane run
//! by `Runtime` whose model is `InstantModel`, an in-process `Model` that notes the
//! moment each request reaches it and answers at once.
//!
//! - per turn: from `Lane::send` called to `Model::complete` entered, on one lane whose
//!   conversation grows by a turn each time (what it costs: the run's records and the user
//!   entry on disk, the system prompt assembled from the agent's files, the conversation turned
//!   into a request);
//! - per tool round trip: from the model's reply with one `bash` call of `true` returned to the
//!   next request entered (the assistant entry, `tool_started` fsynced, the call, its result
//!   on disk, the next request), less the call itself.

pub async fn host_overhead(smoke: bool) {
    let turns = if smoke { 20 } else { 200 };
    #[cfg(feature = "sandbox-double")]
    double::measure(turns).await;
    #[cfg(not(feature = "sandbox-double"))]
    {
        let _ = turns;
        println!("lane, per turn: skipped: built without the sandbox-double feature");
        println!("lane, per tool round trip: skipped: built without the sandbox-double feature");
    }
}

/// Everything runs over the namespace double's machine: the per-turn lanes never run a command,
/// but a [`Runtime`] needs a machine, and the round trips run one.
#[cfg(feature = "sandbox-double")]
mod double {
    use perch::{
        agent::{self, AgentDir, LoadedAgent},
        host::Places,
        host::clock::system_clock,
        lane::{Input, Lane, RunLimits, Runtime},
        model::{
            BoxFuture, Model, ModelError, ModelReply, ModelRequest, StopReason, StreamEvent, Usage,
        },
        sandbox::{Backend, MachineSetup},
        tools::toolbox::Toolbox,
    };
    use perch_core::{
        log::{Outcome, Part, Role},
        name::LaneName,
        prompt::Origin,
    };
    use std::{
        path::Path,
        sync::{
            Arc, Mutex, PoisonError,
            atomic::{AtomicUsize, Ordering},
        },
        time::{Duration, Instant},
    };
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    /// Targets for a turn's host overhead, message accepted to model request sent.
    const TURN_P50_TARGET: Duration = Duration::from_millis(1);
    const TURN_P99_TARGET: Duration = Duration::from_millis(5);

    /// The user message that makes [`InstantModel`] call `bash` before it answers.
    const RUN_TRUE: &str = "Run `true` in the sandbox, then tell me it worked.";

    /// A model that answers at once: a `bash` call of `true` when the last message is [`RUN_TRUE`],
    /// otherwise a paragraph of text. It notes when each request entered and when each reply with a
    /// tool call left.
    #[derive(Debug, Default)]
    struct InstantModel {
        entered: Mutex<Vec<Instant>>,
        call_returned: Mutex<Vec<Instant>>,
        calls: AtomicUsize,
    }

    impl InstantModel {
        fn last(times: &Mutex<Vec<Instant>>) -> Instant {
            *times
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last()
                .expect("the model was asked")
        }

        fn requests(&self) -> usize {
            self.entered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
        }
    }

    impl Model for InstantModel {
        fn complete<'a>(
            &'a self,
            request: &'a ModelRequest,
            _events: mpsc::UnboundedSender<StreamEvent>,
            _cancel: CancellationToken,
        ) -> BoxFuture<'a, Result<ModelReply, ModelError>> {
            let entered = Instant::now();
            self.entered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(entered);
            let wants_call = request.messages.last().is_some_and(|message| {
                let asks =
                    |part: &Part| matches!(part, Part::Text { text } if text.starts_with(RUN_TRUE));
                message.role == Role::User && message.parts.iter().any(asks)
            });
            Box::pin(async move {
                if wants_call {
                    let call = self.calls.fetch_add(1, Ordering::Relaxed);
                    let reply = ModelReply {
                        parts: vec![Part::ToolCall {
                            call_id: format!("call-{call}"),
                            name: "bash".into(),
                            arguments: serde_json::json!({ "command": "true" }),
                        }],
                        usage: Usage::default(),
                        stop: StopReason::ToolUse,
                    };
                    self.call_returned
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Instant::now());
                    return Ok(reply);
                }
                Ok(ModelReply {
                    parts: vec![Part::Text {
                        text:
                            "Done. Here is what I found, in a paragraph about as long as a typical \
                               answer: the files are where you said, the tests pass, and nothing \
                               else needs changing. Ask again if you want me to look further into \
                               any of it; I have kept notes of every command I ran and its output, \
                               and I can repeat any of them."
                                .repeat(2),
                    }],
                    usage: Usage::default(),
                    stop: StopReason::End,
                })
            })
        }
    }

    pub(super) async fn measure(turns: usize) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        agent::init(dir.path()).expect("perch init");
        let model = Arc::new(InstantModel::default());
        let setup = MachineSetup {
            backend: Backend::NamespaceDouble,
            places: Places::from_environment(),
            idle: Duration::from_secs(600),
        };
        let runtime = Runtime::start(
            load(dir.path()),
            &setup,
            Arc::clone(&model) as Arc<dyn Model>,
            system_clock(),
            |_| None,
        )
        .expect("a runtime");
        per_turn(&runtime, &model, turns).await;
        per_tool_round_trip(&runtime, &model, dir.path(), turns).await;
        runtime.machine().stop().await.expect("the machine stops");
    }

    fn load(dir: &Path) -> LoadedAgent {
        agent::load(&AgentDir::open(dir).expect("an agent")).expect("it loads")
    }

    async fn open(runtime: &Runtime, name: &str) -> Lane {
        let name = LaneName::try_from(name).expect("a lane name");
        runtime
            .open_lane(&name, Origin::terminal(), RunLimits::default())
            .await
            .expect("the lane opens")
            .0
    }

    async fn send(lane: &Lane, text: String) {
        let finished = lane
            .send(
                Input {
                    text,
                    consumes: Vec::new(),
                    fresh: false,
                    said: Vec::new(),
                    trigger: perch_core::log::Trigger::Terminal,
                },
                None,
            )
            .await
            .expect("the run ends");
        assert_eq!(finished.outcome, Outcome::Completed);
    }

    fn message(turn: usize) -> String {
        format!(
            "Message {turn}: please look at the build and tell me whether anything in it changed \
             since the last time we talked about it."
        )
    }

    /// Two turns are sent first and not counted (the lane's first run also reads the agent's files
    /// cold); then every turn adds one user and one assistant message to what the next one sends.
    async fn per_turn(runtime: &Runtime, model: &InstantModel, turns: usize) {
        const WARM_UP: usize = 2;
        let lane = open(runtime, "turns").await;
        let before = model.requests();
        let mut samples = Vec::with_capacity(turns);
        for turn in 0..WARM_UP + turns {
            let text = message(turn);
            let sent = Instant::now();
            send(&lane, text).await;
            let entered = InstantModel::last(&model.entered);
            if turn >= WARM_UP {
                samples.push(entered.duration_since(sent));
            }
        }
        assert_eq!(
            model.requests() - before,
            WARM_UP + turns,
            "one request per turn: nothing compacted, nothing retried"
        );
        lane.close().await.expect("the lane closes");
        let (p50, p99) = percentiles(&mut samples);
        println!(
            "lane, per turn (message accepted -> model request sent): {turns} turns, growing to {} messages: p50 {p50:.2?} (target <= {TURN_P50_TARGET:?}: {}), p99 {p99:.2?} (target <= {TURN_P99_TARGET:?}: {})",
            2 * (WARM_UP + turns),
            verdict(p50, TURN_P50_TARGET),
            verdict(p99, TURN_P99_TARGET),
        );
    }

    /// The call's own time is measured by making the same call, `bash` with `true`, through a
    /// [`Toolbox`] over the same (warm) machine, once before each round trip; the median of
    /// those direct calls is subtracted from every round trip. That is preferred over
    /// subtracting the warm exec latency of a bare `true`: the `bash` tool runs the command
    /// through `/bin/sh` and bash reading it from stdin, so a bare `true` would leave the guest's
    /// shell start-up (and the tool's own argument checks and output handling) in the figure.
    /// What remains is the loop's own work around the call. Interleaving the direct calls with
    /// the round trips keeps drift (a warming cache, a busy neighbour) out of the difference.
    /// The subtraction is of a median, so the p99 still carries the command's own jitter.
    async fn per_tool_round_trip(runtime: &Runtime, model: &InstantModel, dir: &Path, runs: usize) {
        let toolbox = Toolbox::new(Arc::new(load(dir)), runtime.machine().clone());
        let arguments = serde_json::json!({ "command": "true" });
        let boot = toolbox
            .call("bash", &arguments, CancellationToken::new())
            .await;
        assert!(!boot.is_error, "bash `true` fails: {}", boot.output);
        let lane = open(runtime, "tools").await;
        send(&lane, format!("{RUN_TRUE} (warm-up)")).await;
        let mut direct = Vec::with_capacity(runs);
        let mut round_trips = Vec::with_capacity(runs);
        for run in 0..runs {
            let started = Instant::now();
            let outcome = toolbox
                .call("bash", &arguments, CancellationToken::new())
                .await;
            direct.push(started.elapsed());
            assert!(!outcome.is_error, "bash `true` fails: {}", outcome.output);
            send(&lane, format!("{RUN_TRUE} ({run})")).await;
            let returned = InstantModel::last(&model.call_returned);
            let entered = InstantModel::last(&model.entered);
            round_trips.push(entered.duration_since(returned));
        }
        lane.close().await.expect("the lane closes");
        let (command, _) = percentiles(&mut direct);
        let (raw_p50, raw_p99) = percentiles(&mut round_trips.clone());
        let mut overhead: Vec<Duration> = round_trips
            .iter()
            .map(|round_trip| round_trip.saturating_sub(command))
            .collect();
        let (p50, p99) = percentiles(&mut overhead);
        println!(
            "lane, per tool round trip (reply with a bash call returned -> next request sent, less the call): {runs} round trips: p50 {p50:.2?}, p99 {p99:.2?} (whole round trip p50 {raw_p50:.2?}, p99 {raw_p99:.2?}; the call alone, Toolbox::call of bash `true`, p50 {command:.2?})"
        );
    }

    fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
        samples.sort();
        let p50 = samples[samples.len() / 2];
        let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
        (p50, p99)
    }

    fn verdict(figure: Duration, target: Duration) -> &'static str {
        if figure <= target { "met" } else { "MISSED" }
    }
}
