-- The helpdesk, as configuration. instructions.md says in prose what it is for.
-- perch reads this directory and nothing outside it: no home-directory
-- profile, no global model file.

agent {
  -- provider/model-id, as listed in models.yml.
  model = "openai/gpt-5-mini",

  -- How hard the model thinks before it answers: "off", "low", "medium" or "high".
  -- A helpdesk mostly looks things up in knowledge/, so a little thought is enough.
  thinking = "low",
}
