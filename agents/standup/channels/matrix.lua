-- The stand-up reporter's Matrix account: channel "matrix" (named after this file). The
-- heartbeat tasks in workspace/HEARTBEAT.yml post to the room declared below as standup, by
-- naming it `delivery: matrix:standup`; a delivery may only name a room a channel declares.
--
-- 1. Create an account for the reporter on your homeserver, and put its user id and the
--    homeserver's URL below (marked REPLACE).
-- 2. Put its password, and a passphrase of your choice for the encrypted store perch keeps
--    under .perch/matrix/, in the service's environment: MATRIX_PASSWORD=...,
--    MATRIX_STORE_PASSPHRASE=... perch logs in once and restores that session on every start,
--    so encrypted rooms keep working. Keep the passphrase: without it the store cannot be read.
-- 3. Put the stand-up room's id below (marked REPLACE), and your own user id in allow.users,
--    then invite the account to the room from that user: perch joins a room only when an
--    allowed user invites it.
-- 4. Check the agent with `perch info` and the schedule with `perch heartbeat list`.
--
-- Every option is explained in perch's stock adapter (`perch channel add matrix` writes it);
-- this file sets only what the reporter needs.

channel {
  kind = "matrix",

  homeserver = "https://matrix.example.org", -- REPLACE
  user = "@standup:example.org",              -- REPLACE

  -- The account's password and the store's passphrase, as references to host environment
  -- variables. Literal values are refused. Neither variable may also be a secret in
  -- sandbox.lua: the sandbox never gets to post.
  password = env "MATRIX_PASSWORD",
  store_passphrase = env "MATRIX_STORE_PASSPHRASE",

  -- The stand-up room, where people give their updates and the digest is posted. The id is
  -- the room id (Element: Room settings > Advanced), such as "!AbCdEfGhIjKlMnOp:example.org",
  -- not an alias such as #standup:example.org. The alias on the left is what
  -- HEARTBEAT.yml's `delivery: matrix:standup` names: rename it in both places or neither.
  rooms = {
    standup = "!REPLACE-with-the-standup-room-id:example.org", -- REPLACE
  },

  allow = {
    -- Matrix users who may invite the account into rooms and give their update in a direct
    -- message without pairing: at least the person who invites it, and the team if you like.
    users = {
      "@REPLACE-with-your-user-id:example.org", -- REPLACE
    },
    -- Everyone in the stand-up room may give an update there.
    rooms = { "standup" },
  },

  -- Direct messages from anyone not in allow.users get a short pairing code, and nothing
  -- reaches the model until the owner runs `perch pair approve CODE` on the host.
  dm = "pair",

  -- In the stand-up room, answer only messages that mention the account or reply to it:
  -- "@standup done the export, next the retry queue, not blocked".
  groups = "mention",

  -- Updates sent while the agent is still writing down the previous one wait their turn.
  busy = "followup",

  -- After an outage, updates older than twelve hours are recorded but not answered (and so
  -- not written down): give them again.
  max_age = 43200,
}
