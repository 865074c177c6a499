-- A Telegram bot. The channel is named after this file: channels/telegram.lua is channel
-- "telegram"; rename the file to name it otherwise (letters, digits, '-' and '_').
--
-- 1. Create the bot with @BotFather (/newbot) and keep the token it gives you.
-- 2. For group chats, either turn privacy mode off (/setprivacy) or leave it on: with it on,
--    the bot still sees messages that mention it or reply to it, which is all it answers by
--    default (groups = "mention").
-- 3. Put the token in the service's environment: TELEGRAM_TOKEN=123456:ABC...
-- 4. Check the file with `perch info`.

channel {
  kind = "telegram",

  -- The bot token, as a reference to a host environment variable. A literal token is refused.
  -- This variable must not also be a secret in sandbox.lua: the sandbox never gets to post.
  token = env "TELEGRAM_TOKEN",

  -- The Bot API server, for a self-hosted one (telegram-bot-api) or a test double. perch adds
  -- /bot<token>/ itself. Default: https://api.telegram.org
  -- api_url = "https://api.telegram.org",

  -- Group chats, by a name of your choice. The id is the chat id (groups and supergroups are
  -- negative, such as -1001234567890). Replies and scheduled reports name a room as
  -- <channel>:<name>, for example telegram:team.
  rooms = {
    -- team = "-1001234567890",
  },

  -- Who may talk to the agent without pairing: Telegram user ids (numbers, as strings), and
  -- rooms (names from `rooms` above) in which everyone may.
  allow = {
    users = {
      -- "123456789",
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

  -- In group chats, answer:
  --   "mention" only messages that mention the bot or reply to it (default)
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

  -- A forum topic is a conversation of its own: its own history, queue and /new ("own", the
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
    -- "987654321",
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
