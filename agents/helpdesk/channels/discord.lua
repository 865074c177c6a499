-- The helpdesk's Discord bot: channel "discord" (named after this file).
--
-- 1. Create an application at https://discord.com/developers/applications, add a bot, and
--    turn on the Message Content intent (Bot > Privileged Gateway Intents).
-- 2. Invite it to your server with the scopes bot and applications.commands and the
--    permissions View Channels, Send Messages, Send Messages in Threads and Read Message
--    History.
-- 3. Put the bot token in the service's environment: DISCORD_TOKEN=...
-- 4. Replace the placeholder channel id below (marked REPLACE), then check the agent with
--    `perch info`.
--
-- Every option is explained in perch's stock adapter (`perch channel add discord` writes it);
-- this file sets only what the helpdesk needs.

channel {
  kind = "discord",

  -- The bot token, as a reference to a host environment variable. A literal token is refused.
  -- This variable must not also be a secret in sandbox.lua: the sandbox never gets to post.
  token = env "DISCORD_TOKEN",

  -- The helpdesk channel. The id is the channel id (turn on Developer Mode, then right-click
  -- the channel > Copy Channel ID): 17 to 20 digits, such as "123456789012345678".
  rooms = {
    helpdesk = "REPLACE-with-the-helpdesk-channel-id", -- REPLACE
  },

  allow = {
    -- Discord user ids that may send direct messages without pairing; the team's
    -- maintainers, say. Everyone else pairs first (dm below).
    users = {
      -- "234567890123456789",
    },
    -- Everyone in the helpdesk channel may ask.
    rooms = { "helpdesk" },
  },

  -- Direct messages from anyone not in allow.users get a short pairing code, and nothing
  -- reaches the model until the owner runs `perch pair approve CODE` on the host.
  dm = "pair",

  -- In the helpdesk channel, answer only messages that mention the bot or reply to it, so
  -- people can talk among themselves there. The last few messages before a mention are
  -- given to the model as context.
  groups = "mention",

  -- A second question in the same conversation while the first is being answered waits and
  -- is answered next.
  busy = "followup",

  -- After an outage, questions older than an hour are recorded but not answered.
  max_age = 3600,
}
