-- The helpdesk's Matrix account: channel "matrix" (named after this file).
--
-- 1. Create an account for the helpdesk on your homeserver, and put its user id and the
--    homeserver's URL below (marked REPLACE).
-- 2. Put its password, and a passphrase of your choice for the encrypted store perch keeps
--    under .perch/matrix/, in the service's environment: MATRIX_PASSWORD=...,
--    MATRIX_STORE_PASSPHRASE=... perch logs in once and restores that session on every start,
--    so encrypted rooms keep working. Keep the passphrase: without it the store cannot be read.
-- 3. Put the helpdesk room's id below (marked REPLACE), and your own user id in allow.users,
--    then invite the account to the room from that user: perch joins a room only when an
--    allowed user invites it.
-- 4. Check the agent with `perch info`.
--
-- Every option is explained in perch's stock adapter (`perch channel add matrix` writes it);
-- this file sets only what the helpdesk needs.

channel {
  kind = "matrix",

  homeserver = "https://matrix.example.org", -- REPLACE
  user = "@helpdesk:example.org",             -- REPLACE

  -- The account's password and the store's passphrase, as references to host environment
  -- variables. Literal values are refused. Neither variable may also be a secret in
  -- sandbox.lua: the sandbox never gets to post.
  password = env "MATRIX_PASSWORD",
  store_passphrase = env "MATRIX_STORE_PASSPHRASE",

  -- The helpdesk room. The id is the room id (Element: Room settings > Advanced), such as
  -- "!AbCdEfGhIjKlMnOp:example.org", not an alias such as #helpdesk:example.org.
  rooms = {
    helpdesk = "!REPLACE-with-the-helpdesk-room-id:example.org", -- REPLACE
  },

  allow = {
    -- Matrix users who may invite the account into rooms and send direct messages without
    -- pairing: at least the person who invites it.
    users = {
      "@REPLACE-with-your-user-id:example.org", -- REPLACE
    },
    -- Everyone in the helpdesk room may ask.
    rooms = { "helpdesk" },
  },

  -- Direct messages from anyone not in allow.users get a short pairing code, and nothing
  -- reaches the model until the owner runs `perch pair approve CODE` on the host.
  dm = "pair",

  -- In the helpdesk room, answer only messages that mention the account or reply to it, so
  -- people can talk among themselves there.
  groups = "mention",

  -- A second question in the same conversation while the first is being answered waits and
  -- is answered next.
  busy = "followup",

  -- After an outage, questions older than an hour are recorded but not answered.
  max_age = 3600,
}
