-- A Matrix account. The channel is named after this file: channels/matrix.lua is channel
-- "matrix"; rename the file to name it otherwise (letters, digits, '-' and '_').
--
-- 1. Create an account for the agent on your homeserver.
-- 2. Put its password, and a passphrase of your choice for the encrypted store perch keeps
--    under .perch/matrix/, in the service's environment: MATRIX_PASSWORD=...,
--    MATRIX_STORE_PASSPHRASE=... perch logs in once and restores that session on every start,
--    so encrypted rooms keep working. Keep the passphrase: without it the store cannot be read.
-- 3. Invite the account to your rooms from an account listed in allow.users below: perch
--    joins only when an allowed user invites it.
-- 4. Check the file with `perch info`.

channel {
  kind = "matrix",

  -- The homeserver's URL and the account's full user id.
  homeserver = "https://matrix.example.org",
  user = "@perch:example.org",

  -- The account's password and the store's passphrase, as references to host environment
  -- variables. Literal values are refused. Neither variable may also be a secret in
  -- sandbox.lua: the sandbox never gets to post.
  password = env "MATRIX_PASSWORD",
  store_passphrase = env "MATRIX_STORE_PASSPHRASE",

  -- Rooms, by a name of your choice. The id is the room id (Element: Room settings >
  -- Advanced), not an alias such as #team:example.org. Replies and scheduled reports name a
  -- room as <channel>:<name>, for example matrix:team.
  rooms = {
    -- team = "!AbCdEfGhIjKlMnOp:example.org",
  },

  -- Who may talk to the agent without pairing: Matrix user ids, and
  -- rooms (names from `rooms` above) in which everyone may.
  allow = {
    users = {
      -- "@ann:example.org",
    },
    rooms = {
      -- "team",
    },
  },

  -- Direct messages from anyone else:
  --   "pair"    the sender gets a short code; `perch pair approve CODE` lets them in (default)
  --   "allow"   anyone may talk to the agent
  --   "refuse"  nobody else
  dm = "pair",

  -- In rooms with more than one person, answer:
  --   "mention" only messages that mention the account or reply to it (default)
  --   "all"     every message
  groups = "mention",

  -- A message that arrives while the agent is still answering in the same conversation:
  --   "followup"  waits, and is answered next (default)
  --   "steer"     is given to the running answer at its next step
  --   "collect"   is gathered with the others that arrive within collect_window seconds,
  --               and they are answered as one
  --   "interrupt" stops the running answer and is answered instead
  busy = "followup",
  -- collect_window = 3,   -- seconds, only with busy = "collect" (1 to 300, default 3)

  -- A thread is a conversation of its own: its own history, queue and /new ("own", the
  -- default). "room" joins its messages to the conversation of the room it is in. Either
  -- way the agent answers in the thread it was asked in.
  threads = "own",

  -- Messages older than this many seconds when perch sees them (after an outage, say) are
  -- recorded but not answered. Default 3600.
  max_age = 3600,

  -- How many messages may wait in one conversation; past that, senders are told it is full.
  -- Default 20.
  queue_limit = 20,

  -- Other bots are ignored, unless their user id is listed here; bot_turns is how many
  -- exchanges in a row with bots the agent answers in one room before it stops (default 3).
  allow_bots = {
    -- "@otherbot:example.org",
  },
  bot_turns = 3,

  -- Hooks (optional). Each runs in a restricted Lua state, like this file, for at most
  -- 10 million instructions per call. `store` is a small key-value store kept for this
  -- channel across restarts (store.get(key), store.set(key, value), store.delete(key);
  -- strings, numbers, booleans and tables of them; 1 MiB in all). What a call changes is
  -- kept only if the call succeeds.
  --
  -- on_message(msg, store) sees each message before the agent does. msg has text, channel,
  -- room (the platform's id), alias (its name from `rooms`, or nil), thread, direct,
  -- addressed, sender = { id, name, is_bot }, platform_id and sent_at. Return a table with
  -- text (and optionally lane, to send it to another conversation), msg itself, or nil to
  -- drop the message. An error rejects that one message.
  --
  -- on_message = function(msg, store)
  --   if msg.text:match("^!ignore") then return nil end
  --   store.set("seen", (store.get("seen") or 0) + 1)
  --   return msg
  -- end,
  --
  -- format(reply, store) shapes each reply before it is sent; it returns a string.
  --
  -- format = function(reply, store)
  --   return reply
  -- end,
}
