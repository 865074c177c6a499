-- The microVM every command of the stand-up reporter runs in, heartbeat checks
-- included. There is no other place: if the VM cannot start, perch refuses to
-- work rather than use the host.
--
-- workspace/ is mounted read-write at /workspace and is the working
-- directory: the updates and blockers the agent keeps live there. Nothing else
-- in this directory (this file, channels/, models.yml) is visible inside the
-- VM; in particular the Matrix credentials never are.

sandbox {
  image = "perch:default",
  cpus = 1,
  memory = 1024, -- MiB

  -- No network at all: the digest is made from what the team tells the agent.
  -- To add, say, merged pull requests from GitHub, list exactly the hosts the
  -- commands need, and lend a token as a secret (see agents/starter/sandbox.lua):
  --   allow = { "api.github.com" },
  allow = {},

  env = {
    LANG = "C.UTF-8",
    -- The team's time zone, so `date` in the VM gives the team's day. A POSIX rule
    -- (Europe/Berlin's) works without tzdata in the image. Keep it in step with the
    -- tz of the tasks in workspace/HEARTBEAT.yml; for America/New_York it is
    -- "EST5EDT,M3.2.0,M11.1.0".
    TZ = "CET-1CEST,M3.5.0,M10.5.0/3",
  },
}
