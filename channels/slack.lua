-- A Slack app over Socket Mode: perch opens an outbound WebSocket to Slack, so no public URL
-- is needed. The channel is named after this file: channels/slack.lua is channel "slack";
-- rename the file to name it otherwise (letters, digits, '-' and '_').
--
-- 1. Create an app at https://api.slack.com/apps from the manifest in docs/channels.md
--    (Slack): it asks for the bot scopes app_mentions:read, channels:history, groups:history,
--    im:history, mpim:history, chat:write, users:read, files:read and files:write, subscribes
--    to message.channels, message.groups, message.im, message.mpim and app_mention, turns on
--    Socket Mode and the App Home's messages tab (without it, direct messages never arrive).
-- 2. Basic Information > App-Level Tokens: generate a token with the connections:write scope
--    (xapp-…). Install the app to the workspace and copy its Bot User OAuth Token (xoxb-…).
-- 3. Put both in the service's environment: SLACK_APP_TOKEN=xapp-… SLACK_BOT_TOKEN=xoxb-…
-- 4. Invite the bot into the channels it should read (/invite @yourbot).
-- 5. Check the file with `perch info`, and the tokens with `perch doctor --online`.

channel {
  kind = "slack",

  -- The two tokens, as references to host environment variables. Literal tokens are refused.
  -- These variables must not also be secrets in sandbox.lua: the sandbox never gets to post.
  app_token = env "SLACK_APP_TOKEN",
  bot_token = env "SLACK_BOT_TOKEN",

  -- The Web API's base, for a test double. The socket's URL comes from its
  -- apps.connections.open. Default: https://slack.com/api/
  -- api_url = "https://slack.com/api/",

  -- Channels, by a name of your choice. The id is the channel id (the channel's name >
  -- About, at the bottom: C… for a channel, G… for some private ones). Replies and scheduled
  -- reports name a room as <channel>:<name>, for example slack:team. See threads below
  -- for how threads are answered.
  rooms = {
    -- team = "C0123456789",
  },

  -- Who may talk to the agent without pairing: Slack member ids (U…, from a profile's
  -- "Copy member ID"), and rooms (names from `rooms` above) in which everyone may. A person
  -- of another organisation (Slack Connect) is refused unless listed here.
  allow = {
    users = {
      -- "U0123456789",
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
  --   "mention" only messages that mention the bot (@perch) or reply in a thread it
  --             started (default)
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

  -- Other bots are ignored, unless their user id (U…, or the bot id B… of an integration
  -- with no user) is listed here; bot_turns is how many exchanges in a row with bots the agent
  -- answers in one room before it stops (default 3).
  allow_bots = {
    -- "U0BOTFRIEND",
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
