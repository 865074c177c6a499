-- A Discord bot. The channel is named after this file: channels/discord.lua is channel
-- "discord"; rename the file to name it otherwise (letters, digits, '-' and '_').
--
-- 1. Create an application at https://discord.com/developers/applications, add a bot, and
--    turn on the Message Content intent (Bot > Privileged Gateway Intents).
-- 2. Invite it to your server with the scopes bot and applications.commands and the
--    permissions View Channels, Send Messages, Send Messages in Threads and Read Message
--    History.
-- 3. Put the bot token in the service's environment: DISCORD_TOKEN=...
-- 4. Check the file with `perch info`.

channel {
  kind = "discord",

  -- The bot token, as a reference to a host environment variable. A literal token is refused.
  -- This variable must not also be a secret in sandbox.lua: the sandbox never gets to post.
  token = env "DISCORD_TOKEN",

  -- The API server, for a proxy or a test double. Default: https://discord.com
  -- api_url = "https://discord.com",

  -- Server channels, by a name of your choice. The id is the channel id (turn on Developer
  -- Mode, then right-click the channel > Copy Channel ID). Replies and scheduled reports name
  -- a room as <channel>:<name>, for example discord:team.
  rooms = {
    -- team = "123456789012345678",
  },

  -- Who may talk to the agent without pairing: Discord user ids (numbers, as strings), and
  -- rooms (names from `rooms` above) in which everyone may.
  allow = {
    users = {
      -- "234567890123456789",
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

  -- In server channels, answer:
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

  -- Messages older than this many seconds when perch sees them (after an outage, say) are
  -- recorded but not answered. Default 3600.
  max_age = 3600,

  -- How many messages may wait in one conversation; past that, senders are told it is full.
  -- Default 20.
  queue_limit = 20,

  -- Other bots are ignored, unless their user id is listed here; bot_turns is how many
  -- exchanges in a row with bots the agent answers in one room before it stops (default 3).
  allow_bots = {
    -- "345678901234567890",
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
