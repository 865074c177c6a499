//! An agent ready to run: it owns the agent directory (its lock), its machine, its tools and its
//! model, and opens lanes over them.

use crate::agent::{LoadedAgent, OwnerLock};
use crate::host::clock::Clock;
use crate::host::metrics::Metrics;
use crate::lane::{Lane, LaneError, LaneSetup, LaneSpend, RunLimits};
use crate::log::RecoveryReport;
use crate::model::Model;
use crate::sandbox::{self, Machine, MachineSetup};
use crate::store::spend::SpendGuard;
use crate::tools::prompt;
use crate::tools::toolbox::Toolbox;
use perch_core::Problem;
use perch_core::name::{LaneName, ModelRef};
use perch_core::prompt::Origin;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// How many runs of one agent may be active at once, across its lanes.
pub const MAX_ACTIVE_RUNS: usize = 4;

/// The running form of one agent directory.
#[derive(Debug)]
pub struct Runtime {
    agent: Arc<LoadedAgent>,
    machine: Machine,
    toolbox: Arc<Toolbox>,
    model: Arc<dyn Model>,
    clock: Clock,
    active_runs: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    spend: SpendGuard,
    _owner: OwnerLock,
}

impl Runtime {
    /// Takes the agent directory's lock, then builds its machine (nothing boots yet).
    pub fn start(
        agent: LoadedAgent,
        machine_setup: &MachineSetup,
        model: Arc<dyn Model>,
        clock: Clock,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Runtime, String> {
        let owner = OwnerLock::acquire(&agent.dir).map_err(|error| error.to_string())?;
        let spend = SpendGuard::open(&agent.dir, agent.definition.agent.spend, clock.clone())
            .map_err(|error| error.to_string())?;
        let machine = sandbox::machine_for(&agent, machine_setup, lookup)
            .map_err(|error| error.to_string())?;
        let agent = Arc::new(agent);
        let toolbox = Arc::new(Toolbox::new(Arc::clone(&agent), machine.clone()));
        Ok(Runtime {
            agent,
            machine,
            toolbox,
            model,
            clock,
            active_runs: Arc::new(Semaphore::new(MAX_ACTIVE_RUNS)),
            metrics: Arc::new(Metrics::default()),
            spend,
            _owner: owner,
        })
    }

    /// Counts this agent's runs, tool calls and tokens in `metrics` (by default, in counters
    /// nobody reads).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Runtime {
        self.metrics = metrics;
        self
    }

    pub fn agent(&self) -> &LoadedAgent {
        &self.agent
    }

    /// The daily spend guard every lane of this agent goes through.
    pub fn spend(&self) -> &SpendGuard {
        &self.spend
    }

    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// Problems in the files the system prompt is made of (a broken skill, a symlinked
    /// AGENTS.md): reported, and left out of the prompt.
    pub fn prompt_problems(&self, origin: &Origin) -> Vec<Problem> {
        prompt::system_prompt(&self.agent, Some(origin.clone())).1
    }

    /// Opens the lane `name` for conversations from `origin`, recovering what a crash left.
    pub async fn open_lane(
        &self,
        name: &LaneName,
        origin: Origin,
        limits: RunLimits,
    ) -> Result<(Lane, RecoveryReport), LaneError> {
        let (_, spec) = self.agent.definition.model();
        let context_window = u64::from(spec.context_window);
        let spend = self.lane_spend(name, &self.agent.definition.agent.model, spec.price);
        self.open_lane_on(
            name,
            origin,
            limits,
            Arc::clone(&self.model),
            context_window,
            spend,
        )
        .await
    }

    /// Like [`Runtime::open_lane`], on `model` (one `models.yml` declares) instead of the
    /// agent's; its provider's key is read from the environment.
    pub async fn open_lane_with_model(
        &self,
        name: &LaneName,
        origin: Origin,
        limits: RunLimits,
        model: &ModelRef,
    ) -> Result<(Lane, RecoveryReport), String> {
        let endpoint =
            crate::model::endpoint_for_model(&self.agent, model, |name| std::env::var(name).ok())?;
        let context_window = u64::from(endpoint.model.context_window);
        let spend = self.lane_spend(name, model, endpoint.model.price);
        self.open_lane_on(
            name,
            origin,
            limits,
            crate::model::connect(endpoint),
            context_window,
            spend,
        )
        .await
        .map_err(|error| error.to_string())
    }

    /// What the lane `name`'s replies from `model` count as in the daily spend guard.
    fn lane_spend(
        &self,
        name: &LaneName,
        model: &ModelRef,
        price: Option<perch_core::spend::Price>,
    ) -> LaneSpend {
        LaneSpend {
            guard: self.spend.clone(),
            kind: perch_core::spend::RunKind::of_lane(name),
            lane: name.to_string(),
            model: model.to_string(),
            price,
        }
    }

    async fn open_lane_on(
        &self,
        name: &LaneName,
        origin: Origin,
        limits: RunLimits,
        model: Arc<dyn Model>,
        context_window: u64,
        spend: LaneSpend,
    ) -> Result<(Lane, RecoveryReport), LaneError> {
        let agent = Arc::clone(&self.agent);
        let setup = LaneSetup {
            model,
            model_name: spend.model.clone(),
            toolbox: Arc::clone(&self.toolbox),
            system_prompt: Arc::new(move || prompt::system_prompt(&agent, Some(origin.clone())).0),
            thinking: self.agent.definition.agent.thinking,
            context_window,
            limits,
            clock: self.clock.clone(),
            active_runs: Arc::clone(&self.active_runs),
            metrics: Arc::clone(&self.metrics),
            spend: Some(spend),
        };
        Lane::open(&self.agent.dir.sessions_dir(), name, setup).await
    }
}
