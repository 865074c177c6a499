-- Every tools/*.lua file declares tools the model may call: drop in a file,
-- there is nothing else to register. The Lua runs on the host, but ctx.sh
-- runs its command inside the microVM, and that is the only way a tool acts.
--
-- replay = "safe" promises the tool only reads, so after a crash perch may
-- run it again; anything else is "never" (the default) and gets an
-- "interrupted" result instead.

tool("workspace_summary", {
  description = "Summarise the workspace: git branch, changed files and recent commits",
  replay = "safe",
  params = {
    { name = "commits", type = "integer", description = "How many recent commits to list", default = 5 },
  },
  run = function(args, ctx)
    local branch = ctx.sh("git rev-parse --abbrev-ref HEAD 2>/dev/null || echo '(not a git repository)'")
    local changes = ctx.sh("git status --short 2>/dev/null")
    local commits = ctx.sh("git log --oneline -n " .. math.tointeger(args.commits) .. " 2>/dev/null")
    if changes == "" then
      changes = "(none)\n"
    end
    return ("branch: %s\nchanges:\n%s\nrecent commits:\n%s"):format(branch, changes, commits)
  end,
})
