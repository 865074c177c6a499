-- What this agent is, as configuration. instructions.md says it in prose.
-- perch reads this directory and nothing outside it: no home-directory
-- profile, no global model file.

agent {
  -- provider/model-id, as listed in models.yml.
  model = "openai/gpt-5-mini",

  -- How hard the model thinks before it answers: "off", "low", "medium" or "high".
  thinking = "low",

  -- What the agent may spend in a day (UTC). Heartbeats pause at 80% of a cap,
  -- everything at 100%, until 00:00 UTC. cost_per_day is in the currency of the
  -- prices in models.yml and needs a price for the model there. Without spend,
  -- perch applies 2,000,000 tokens a day; spend = false runs uncapped.
  spend = {
    tokens_per_day = 2000000,
    -- cost_per_day = 20,
  },

  -- Where perch tells you when something needs you (a channel stopped, a delivery
  -- of unknown fate, a heartbeat stopped, the spend cap reached): a room alias
  -- from one of channels/*.lua. Without it, alerts go to the log only.
  -- owner = "telegram:owner",
}
