-- Argo CD health of a Helmhive Change (docs/install.md, "Argo CD and Flux"), from its Ready condition.
-- Ready True (the review approved the patch): Healthy. A final Ready reason: Degraded. Waiting for a
-- person to approve the plan: Suspended. Anything else (a stage pending or running): Progressing.
local hs = {status = "Progressing", message = "waiting for the operator to start the change"}
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
local final = {ChangesRequested = true, ChecksFailed = true, PlanningFailed = true, ImplementationFailed = true,
  ReviewFailed = true, JobMissing = true, InvalidSpec = true}
local human = {AwaitingApproval = true, ApprovalDigestMismatch = true}
if ready.status == "True" then
  hs.status = "Healthy"
elseif final[ready.reason] then
  hs.status = "Degraded"
elseif human[ready.reason] then
  hs.status = "Suspended"
end
return hs
