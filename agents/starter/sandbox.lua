-- The microVM every command of this agent runs in. There is no other place:
-- if the VM cannot start, perch refuses to work rather than use the host.
--
-- workspace/ is mounted read-write at /workspace and is the working
-- directory, so a relative path means the same inside and outside. Nothing
-- else in this directory (this file, tools/, channels/, models.yml) is
-- visible inside the VM.

sandbox {
  -- perch:default is built offline by `perch image build`. Any OCI image
  -- reference works where a registry is reachable.
  image = "perch:default",
  cpus = 1,
  memory = 1024, -- MiB
  -- How much the VM may write into /workspace, in MiB (the default, 4 GiB):
  -- workspace_disk = 4096,

  -- Outbound network is denied by default. Every host the VM may reach is
  -- listed here and nothing is added behind your back; private and metadata
  -- addresses stay unreachable even if a listed name resolves to one.
  -- An empty list means no network at all.
  allow = {
    "github.com",
    "api.github.com",
    "codeload.github.com",
  },

  -- A credential the VM can use without ever holding it: the guest sees only
  -- the placeholder, and the network boundary swaps in the real value for
  -- requests to the listed hosts, and no others.
  -- secrets = {
  --   {
  --     env = "GITHUB_TOKEN",            -- the variable the guest sees
  --     source = env "GITHUB_TOKEN",     -- the host variable with the value
  --     placeholder = "perch-github-token",
  --     hosts = { "api.github.com" },
  --   },
  -- },

  -- Plain settings for every command. Not for secrets: use secrets above.
  env = {
    LANG = "C.UTF-8",
  },

  -- Commands run once per image, for example to install tools:
  -- bootstrap = { "apt-get install -y shellcheck" },
}
