-- The stand-up reporter, as configuration. instructions.md says in prose what it is for.
-- perch reads this directory and nothing outside it: no home-directory
-- profile, no global model file.

agent {
  -- provider/model-id, as listed in models.yml.
  model = "openai/gpt-5-mini",

  -- How hard the model thinks before it answers: "off", "low", "medium" or "high".
  -- Sorting updates into a digest needs little.
  thinking = "low",
}
