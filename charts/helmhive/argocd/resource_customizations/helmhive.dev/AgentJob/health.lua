-- Argo CD health of a Helmhive AgentJob (docs/install.md, "Argo CD and Flux"), from its Ready condition.
-- Ready True: Healthy. Ready False: Degraded, but for an infrastructure failure the operator may still
-- run again (its message has no "; not re-run:" verdict yet), or a wait for a Workspace or Profile not
-- there yet (until its deadline): Progressing. No Ready yet, or Unknown (queued, waiting for a runner
-- or capacity, running): Progressing.
local hs = {status = "Progressing", message = "waiting for the operator to route the job"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local ready = nil
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    ready = c
  end
end
if ready == nil then
  return hs
end
local said = ready.reason or ""
if ready.message ~= nil and ready.message ~= "" then
  said = said .. ": " .. ready.message
end
hs.message = said
if ready.status == "True" then
  hs.status = "Healthy"
elseif ready.status == "False" then
  local base = string.match(ready.reason or "", "^([^:]*)")
  local retryable = {RunnerLost = true, JobPodLost = true, Interrupted = true, AgentCrashed = true,
    AgentUnresponsive = true}
  local waiting = {WaitingForWorkspace = true, WaitingForProfile = true}
  local decided = ready.message ~= nil and string.find(ready.message, "; not re-run: ", 1, true) ~= nil
  if (retryable[base] and not decided) or waiting[base] then
    hs.status = "Progressing"
  else
    hs.status = "Degraded"
  end
end
return hs
