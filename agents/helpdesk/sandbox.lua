-- The microVM every command of the helpdesk runs in. There is no other place:
-- if the VM cannot start, perch refuses to work rather than use the host.
--
-- workspace/ is mounted read-write at /workspace and is the working
-- directory. Nothing else in this directory (this file, channels/,
-- models.yml) is visible inside the VM; in particular the chat credentials
-- never are.

sandbox {
  image = "perch:default",
  cpus = 1,
  memory = 1024, -- MiB

  -- No network at all. The helpdesk answers from workspace/knowledge/ and
  -- needs nothing else; a question that would need the outside world is
  -- escalated to a person instead. To let it read, say, an internal wiki,
  -- list that host and nothing more:
  --   allow = { "wiki.example.org" },
  allow = {},

  -- Plain settings for every command. Not for secrets.
  env = {
    LANG = "C.UTF-8",
  },
}
